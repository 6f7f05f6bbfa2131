"""The websocket that node agents hold open: `/ws/agent/`, authenticated by a per-node token.

Thin by design: decode with agents.protocol, call one service, reply. Telemetry and heartbeats,
which every agent sends all the time, are buffered and written for all agents at once
(portal.agentgw.ingest). Browsers never get in: a browser cannot send an Authorization header
on a websocket and always sends an Origin.

Shell output and exits are relayed to the session's browser socket (portal.shell.consumers)
through the channel layer, without touching the database, tagged with this node and connection:
the browser socket takes them only from the node its session runs on, and ends the session when
the connection that answered it closes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from agents.protocol import (
    AttemptStatus,
    CheckpointDone,
    Heartbeat,
    Hello,
    LogChunk,
    ProtocolError,
    RequestAck,
    RequestReject,
    ShellExit,
    ShellOutput,
    TelemetryBatch,
    Welcome,
    decode_from_agent,
    encode,
)
from portal.accounts.security import record_refusal
from portal.accounts.websocket import bearer_token, has_origin
from portal.agentgw.desired import desired_set_for
from portal.agentgw.ingest import buffer as ingest
from portal.agentgw.outbox import node_group
from portal.cluster import services as cluster_services
from portal.cluster.models import Node
from portal.jobs import services as job_services
from portal.lib.db import DirectDispatch, database_sync_to_async
from portal.shell.services import shell_group, shell_node_group

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_REVOKED = 4403
CLOSE_PROTOCOL = 4400
# How often, at most, a heartbeat makes the gateway check that the agent has the node's newest
# desired set: the push after a change is a hint, and a hint lost (say, while Redis restarts)
# must not leave a job scheduled and never started.
DESIRED_RECHECK_S = 30.0


def client_address(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class AgentConsumer(DirectDispatch, AsyncWebsocketConsumer):
    node: Node | None = None
    greeted = False
    sent_revision = -1  # of the last desired set sent on this connection
    next_desired_check = 0.0  # time.monotonic() of the next check on a heartbeat

    async def connect(self) -> None:
        if has_origin(self.scope):
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        try:
            self.node = await database_sync_to_async(cluster_services.authenticate_node)(
                bearer_token(self.scope), client_address(self.scope)
            )
        except cluster_services.NodeRevoked:
            await self.close(code=CLOSE_REVOKED)
            return
        if self.node is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.node is not None and self.greeted:
            await ingest.flush()  # nothing this agent sent is lost when it (or the server) goes
            await self.channel_layer.group_discard(node_group(self.node.pk), self.channel_name)
            # The agent ends the shells this connection opened when it loses it, and cannot
            # tell their browsers: the portal does (portal.shell.consumers).
            await self.channel_layer.group_send(
                shell_node_group(self.node.pk),
                {"type": "shell.agent_gone", "node_id": self.node.pk, "agent": self.channel_name},
            )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        assert self.node is not None
        try:
            message = decode_from_agent(text_data if text_data is not None else bytes_data or b"")
        except ProtocolError as exc:
            log.warning("node %s sent a bad message: %s", self.node.name, exc)
            if not self.greeted:
                await self.close(code=CLOSE_PROTOCOL)
            return
        if not self.greeted and not isinstance(message, Hello):
            await self.close(code=CLOSE_PROTOCOL)
            return
        try:
            await self.handle(message)
        except job_services.StaleReport as exc:
            await self._refused(exc)
        except cluster_services.NodeRevoked:
            await self.close(code=CLOSE_REVOKED)

    async def handle(self, message: Any) -> None:
        node = self.node
        assert node is not None
        if isinstance(message, Hello):
            if message.node_name != node.name:
                log.warning(
                    "token of node %s used by an agent calling itself %s", node.name, message.node_name
                )
                await database_sync_to_async(record_refusal)(
                    "agent",
                    f"node:{node.pk}",
                    "agent.hello",
                    obj=node,
                    detail=f"token of node {node.name} used by an agent calling itself {message.node_name}",
                )
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return
            await database_sync_to_async(cluster_services.record_hello)(node, message)
            for report in message.attempts:
                await self._status(report_to_status(report))
            await self.send(
                encode(
                    Welcome(
                        node_id=str(node.pk),
                        heartbeat_interval_s=settings.AGENT_HEARTBEAT_INTERVAL_S,
                        telemetry_interval_s=settings.AGENT_TELEMETRY_INTERVAL_S,
                    )
                )
            )
            await self.channel_layer.group_add(node_group(node.pk), self.channel_name)
            self.greeted = True
            await self.desired_changed({})
        elif isinstance(message, Heartbeat):
            ingest.add_heartbeat(node.pk)
            if time.monotonic() >= self.next_desired_check:
                self.next_desired_check = time.monotonic() + DESIRED_RECHECK_S
                revision = await database_sync_to_async(desired_revision)(node.pk)
                if revision > self.sent_revision:
                    await self.desired_changed({})
        elif isinstance(message, AttemptStatus):
            await self._status(message)
        elif isinstance(message, LogChunk):
            await database_sync_to_async(job_services.record_log_chunk)(node, message)
        elif isinstance(message, TelemetryBatch):
            ingest.add_telemetry(node.pk, message.samples)
            if not all(s.healthy for s in message.samples):
                # Rare and urgent: the samples go to the failing attempt's history, then its job moves.
                await ingest.flush()
                await database_sync_to_async(cluster_services.record_gpu_health)(node, message.samples)
        elif isinstance(message, CheckpointDone):
            await database_sync_to_async(job_services.record_checkpoint)(node, message)
        elif isinstance(message, ShellOutput | ShellExit):
            # To the browser's socket of the session (handlers shell_output and shell_exit),
            # tagged with where it came from: only the session's own node may write to it.
            fields = message.model_dump(exclude={"v", "id", "session"})
            event = {**fields, "node_id": node.pk, "agent": self.channel_name}
            await self.channel_layer.group_send(shell_group(message.session), event)
        elif isinstance(message, RequestAck | RequestReject):
            log.info("node %s answered request %s: %s", node.name, message.request_id, message.type)

    async def _status(self, status: AttemptStatus) -> None:
        """Records one replica's report. A report the job's state table has no move for (a bug,
        since every report is meant to be foldable) is logged and dropped, its transaction rolled
        back: raised here it would close the node's connection, and the hello's replay of the
        same report would then refuse every reconnection, leaving all the node's jobs unheard."""
        assert self.node is not None
        await ingest.flush()  # the telemetry sent before the report belongs to the attempt it reports on
        try:
            await database_sync_to_async(job_services.record_attempt_status)(self.node, status)
        except job_services.StaleReport as exc:
            await self._refused(exc)
        except job_services.InvalidTransition:
            log.exception(
                "node %s: a report on %s (%s) moves its job nowhere allowed; dropped",
                self.node.name,
                status.attempt_id,
                status.state.value,
                extra={"node": self.node.name},
            )

    async def _refused(self, exc: job_services.StaleReport) -> None:
        """A report on a replica this node does not run changes nothing, and is audited."""
        assert self.node is not None
        log.info("node %s: refused a report: %s", self.node.name, exc, extra={"node": self.node.name})
        await database_sync_to_async(record_refusal)(
            "agent", f"node:{self.node.pk}", "agent.report", obj=self.node, detail=str(exc)
        )

    # Events from the channel layer (portal.agentgw.outbox).

    async def desired_changed(self, event: dict[str, Any]) -> None:
        desired = await database_sync_to_async(desired_set_for)(self.node)
        await self.send(encode(desired))
        self.sent_revision = max(self.sent_revision, desired.revision)

    async def agent_request(self, event: dict[str, Any]) -> None:
        await self.send(event["text"])

    async def node_revoked(self, event: dict[str, Any]) -> None:
        await self.close(code=CLOSE_REVOKED)


def desired_revision(node_id: int) -> int:
    return Node.objects.values_list("desired_revision", flat=True).get(pk=node_id)


def report_to_status(report: Any) -> AttemptStatus:
    """A hello lists what the agent runs; each entry is handled like a status report."""
    from agents.protocol import utc_now

    return AttemptStatus(
        attempt_id=report.attempt_id,
        job_id=report.job_id,
        state=report.state,
        generation=report.generation,
        time=utc_now(),
        exit_code=report.exit_code,
        reason=report.reason,
    )

"""`/ws/jobs/<job>/shell/`: a terminal in one's own running job, relayed to the node's agent.

The browser signs in with its session, as on /ws/live/; a client that is not a browser (the
CLI) with an API token instead (portal.accounts.websocket, wired in portal.shell.routing). Who may
open a shell and where it runs is decided in portal.shell.services; this consumer only relays.
To the agent it sends shell_open, shell_input, shell_resize and shell_close through the node's
channel-layer group (the agent's socket, portal.agentgw.consumers, writes them out as they are);
the agent's shell_output and shell_exit come back through the session's own group,
`shell.<session>`, tagged by the gateway with the node they came from. Only those of the node the
session was opened on reach the browser: an agent cannot write into another node's session, even
if it learnt its id.

A refusal (4401, 4403, 4404, 4429) is sent as a close frame right after the handshake, not
by refusing the handshake: a refused handshake reaches a browser as an HTTP 403 and a close code
1006 whatever the reason, and the client could not tell a missing job from too many sessions.

The session ends when the agent says so (shell_exit: the shell exited, or its attempt ended),
when the agent connection that answered it closes (the agent ends its shells then, unheard),
when the browser goes (the agent is told shell_close), after SHELL_IDLE_TIMEOUT_S without input,
when the agent answers nothing within SHELL_OPEN_TIMEOUT_S, or when the user's access changes
(code 4403, through the same hub topic as the live socket: a membership or the account changed,
or what signed the socket in ended, the browser's session signed out or the API token revoked),
or when what signed it in expires (4403 too, with an exit frame that says so).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from agents.protocol import ShellClose, ShellInput, ShellMessage, ShellOpen, ShellResize, encode
from portal.accounts.websocket import credential_expiry, ends_shell_access
from portal.agentgw.outbox import node_group
from portal.jobs.models import Job
from portal.lib.db import DirectDispatch, database_sync_to_async
from portal.live.hub import hub
from portal.live.publish import user_group
from portal.shell import services
from portal.shell.services import ShellTarget, shell_group, shell_node_group

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = services.CLOSE_FORBIDDEN  # 4403: not the owner, or access changed
CLOSE_UNAVAILABLE = 4409  # not running, no such replica, agent not connected
CLOSE_TOO_MANY = 4429
CLOSE_NO_ANSWER = 4504

MAX_INPUT_CHARS = 65536
INPUT_HELP = (
    'send JSON text frames: {"type": "input", "data": "<1 to 65536 characters>"} or '
    '{"type": "resize", "cols": <1..1000>, "rows": <1..1000>}'
)


def duration_words(seconds: int) -> str:
    """The idle time as the exit reason tells it: in minutes, or seconds when not whole minutes."""
    if seconds >= 60 and seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def terminal_size(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= services.MAX_TERMINAL_SIZE:
        return value
    return None


class ShellConsumer(DirectDispatch, AsyncWebsocketConsumer):
    session = ""
    job: Job | None = None
    target: ShellTarget | None = None
    joined_hub = False
    agent_done = False  # the agent sent shell_exit, or was sent shell_close
    foreign_seen = False
    agent_channel: str | None = None  # the agent connection that answered (its gateway socket)
    watcher: asyncio.Task[None] | None = None
    opened_at = 0.0
    last_input = 0.0
    signed_in_until: float | None = None  # when the socket's token or session expires (monotonic)
    next_seq = 0
    how = "the browser closed it"  # how the session ended, for the audit entry

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        job_id: int = self.scope["url_route"]["kwargs"]["job_id"]
        options = services.parse_options(self.scope.get("query_string", b""))
        try:
            job, target = await database_sync_to_async(services.prepare)(user, job_id, options.replica)
        except services.ShellRefused as exc:
            await self.refuse(exc.code)
            return
        if isinstance(target, str):  # a shell that cannot open takes no slot
            await self.accept()
            await self.exit_and_close(None, target, CLOSE_UNAVAILABLE)
            return
        session = services.new_session_id()
        if not await database_sync_to_async(services.claim_slot)(user.pk, session):
            await self.refuse(CLOSE_TOO_MANY)
            return
        self.session, self.job = session, job  # a session id: a slot held
        if self.scope.get("api_token") is not None:
            self.how = "the client closed it"  # not a browser: the CLI, or a script
        await self.accept()
        await hub().join(user_group(user.pk), self.access_changed)
        self.joined_hub = True
        # Audited before the agent hears of it: no shell opens unrecorded.
        await database_sync_to_async(services.record_open)(
            user, job, target, session, self.scope.get("api_token")
        )
        self.target = target
        await self.channel_layer.group_add(shell_group(session), self.channel_name)
        await self.channel_layer.group_add(shell_node_group(target.node_id), self.channel_name)
        self.opened_at = self.last_input = time.monotonic()
        if (expiry := await database_sync_to_async(credential_expiry)(self.scope)) is not None:
            self.signed_in_until = self.opened_at + (expiry - timezone.now()).total_seconds()
        await self.to_agent(
            ShellOpen(session=session, attempt_id=target.attempt_id, cols=options.cols, rows=options.rows)
        )
        await self.send_json(
            {"type": "opened", "job": job.pk, "replica": target.replica, "node": target.node_name}
        )
        self.watcher = asyncio.create_task(self.watch(), name=f"shell-{session}")

    async def refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    @property
    def answered(self) -> bool:
        """Whether the agent of the session's node sent output or an exit (from_our_node)."""
        return self.agent_channel is not None

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content))

    async def exit_and_close(self, exit_code: Any, reason: str, code: int) -> None:
        """The last frame of every session that opened or was answered: how it ended, in words."""
        await self.send_json({"type": "exit", "exit_code": exit_code, "reason": reason})
        await self.close(code=code)

    async def to_agent(self, message: ShellMessage) -> None:
        assert self.target is not None
        await self.channel_layer.group_send(
            node_group(self.target.node_id), {"type": "agent.request", "text": encode(message)}
        )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.target is None or self.agent_done:
            return
        try:
            content = json.loads(text_data) if text_data is not None else None
        except ValueError:
            content = None
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "input":
            data = content.get("data")  # type: ignore[union-attr]
            if not isinstance(data, str) or not 1 <= len(data) <= MAX_INPUT_CHARS:
                await self.error(f"input needs 'data': a string of 1 to {MAX_INPUT_CHARS} characters")
                return
            try:
                await self.to_agent(ShellInput(session=self.session, data=data))
            except ValueError:  # a lone surrogate: not text that can be sent on
                await self.error("input 'data' is not valid Unicode text")
                return
            self.last_input = time.monotonic()
        elif kind == "resize":
            cols, rows = terminal_size(content.get("cols")), terminal_size(content.get("rows"))  # type: ignore[union-attr]
            if cols is None or rows is None:
                await self.error("resize needs 'cols' and 'rows': whole numbers from 1 to 1000")
                return
            await self.to_agent(ShellResize(session=self.session, cols=cols, rows=rows))
        else:
            await self.error(INPUT_HELP)

    async def error(self, text: str) -> None:
        await self.send_json({"type": "error", "error": text})

    # Events from the agent gateway (portal.agentgw.consumers), on the session's group.

    async def shell_output(self, event: dict[str, Any]) -> None:
        if not await self.from_our_node(event) or self.agent_done:
            return
        seq = event.get("seq")
        if seq != self.next_seq:  # the channel layer dropped some (a full channel), or reordered
            log.warning(
                "shell session %s: output %s arrived where %s was due", self.session, seq, self.next_seq
            )
        self.next_seq = (seq if isinstance(seq, int) else self.next_seq) + 1
        await self.send_json({"type": "output", "data": event["data"]})

    async def shell_exit(self, event: dict[str, Any]) -> None:
        if not await self.from_our_node(event) or self.agent_done:
            return
        self.agent_done = True
        self.how = f"the shell ended: {event.get('reason') or 'no reason given'}"
        await self.exit_and_close(event.get("exit_code"), event.get("reason", ""), CLOSE_NORMAL)

    async def shell_agent_gone(self, event: dict[str, Any]) -> None:
        """A connection of an agent closed. If it is the one that answered this session, the
        agent has ended the shell on its side and will say nothing more about it."""
        if self.target is None or self.agent_done or self.agent_channel is None:
            return  # not answered yet: the open timeout ends it if no other connection answers
        if event.get("node_id") != self.target.node_id or event.get("agent") != self.agent_channel:
            return
        self.agent_done = True
        self.how = reason = f"the connection to the agent of node {self.target.node_name} was lost"
        await self.exit_and_close(None, reason, CLOSE_NORMAL)

    async def from_our_node(self, event: dict[str, Any]) -> bool:
        """Whether the event came from the agent of the node the session runs on. Another node's
        is dropped, and the first one audited as a refusal of that node."""
        assert self.target is not None
        node_id = event.get("node_id")
        if node_id == self.target.node_id:
            self.agent_channel = self.agent_channel or event.get("agent")
            return True
        log.warning(
            "shell session %s on node %s: dropped a message from node %s",
            self.session,
            self.target.node_id,
            node_id,
        )
        if not self.foreign_seen and isinstance(node_id, int):
            self.foreign_seen = True
            await database_sync_to_async(services.record_foreign_message)(node_id, self.target, self.session)
        return False

    # Ends that the portal decides.

    async def watch(self) -> None:
        """Ends the session when the agent answers nothing in time, the user stops typing or
        what signed the socket in expires, and renews the session's slot while it is open."""
        assert self.target is not None
        open_timeout = float(settings.SHELL_OPEN_TIMEOUT_S)
        idle_timeout = int(settings.SHELL_IDLE_TIMEOUT_S)
        renew_every = services.SLOT_LEASE_S / 3
        next_renewal = time.monotonic() + renew_every
        user = self.scope["user"]
        while True:
            deadlines = [next_renewal, self.last_input + idle_timeout]
            if not self.answered:
                deadlines.append(self.opened_at + open_timeout)
            if self.signed_in_until is not None:
                deadlines.append(self.signed_in_until)
            await asyncio.sleep(max(0.0, min(deadlines) - time.monotonic()))
            now = time.monotonic()
            if self.signed_in_until is not None and now >= self.signed_in_until:
                await self.end(self.expired_words(), CLOSE_FORBIDDEN)
                return
            if not self.answered and now >= self.opened_at + open_timeout:
                await self.end(f"no answer from the agent of node {self.target.node_name}", CLOSE_NO_ANSWER)
                return
            if now >= self.last_input + idle_timeout:
                await self.end(f"closed after {duration_words(idle_timeout)} without input", CLOSE_NORMAL)
                return
            if now >= next_renewal:
                next_renewal = now + renew_every
                try:
                    await database_sync_to_async(services.renew_slot)(user.pk, self.session)
                except Exception as exc:  # Redis away: the next renewal tries again
                    log.warning("shell session %s: could not renew its slot: %s", self.session, exc)

    def expired_words(self) -> str:
        token = self.scope.get("api_token")
        if token is not None:
            return f"the token {token.name} expired; sign in again"
        return "the session expired; sign in again"

    async def end(self, reason: str, code: int) -> None:
        """The portal ends the session: the agent is told to close it, the browser why."""
        if self.agent_done:
            return
        self.agent_done, self.how = True, reason
        await self.to_agent(ShellClose(session=self.session))
        await self.exit_and_close(None, reason, code)

    async def access_changed(self, text: str) -> None:
        """As the live socket's (ends_access), for this job's tenant (ends_shell_access), saying in
        the audit entry which it was."""
        if self.job is not None and ends_shell_access(self.scope, text, self.job.tenant_id):
            token = self.scope.get("api_token")
            revoked = token is not None and json.loads(text).get("session") is not None
            self.how = f"the token {token.name} was revoked" if revoked else "the user's access changed"
            await self.close(code=CLOSE_FORBIDDEN)

    async def disconnect(self, code: int) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        user = self.scope.get("user")
        try:
            if self.joined_hub:
                await hub().leave(user_group(user.pk), self.access_changed)
            if self.target is not None:
                await self.close_session(user)
        finally:
            if self.session:
                await database_sync_to_async(services.release_slot)(user.pk, self.session)

    async def close_session(self, user: Any) -> None:
        """The socket went: the agent is told to end the session unless it ended it, and the
        session's end is audited with how long it was open."""
        assert self.target is not None and self.job is not None
        await self.channel_layer.group_discard(shell_group(self.session), self.channel_name)
        await self.channel_layer.group_discard(shell_node_group(self.target.node_id), self.channel_name)
        if not self.agent_done:
            self.agent_done = True
            try:
                await self.to_agent(ShellClose(session=self.session))
            except Exception as exc:  # the session is still audited and its slot freed
                log.warning("shell session %s: could not tell the agent to close it: %s", self.session, exc)
        seconds = time.monotonic() - self.opened_at
        await database_sync_to_async(services.record_close)(
            user, self.job, self.target, self.session, seconds, self.how, self.scope.get("api_token")
        )

"""Write paths and derived figures for the cluster: node states and quota use."""

from __future__ import annotations

import json
import os
import re
import secrets
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import connection, models, transaction
from django.utils import timezone

from agents.devices.health import NODE_LEVEL_XIDS
from agents.protocol import GpuInfo, GpuSample, Hello
from portal.accounts.models import hash_secret, new_secret
from portal.accounts.services import record_audit
from portal.cluster.choices import NodeState
from portal.cluster.models import EnrollmentToken, Gpu, GpuHealthEvent, Node, VirtualCluster
from portal.lib.redis import get_redis


def gpus_in_use(vcs: Iterable[VirtualCluster]) -> dict[tuple[int, str], int]:
    """Live allocated GPUs per (VC id, GPU model), in one query."""
    from portal.jobs.models import Allocation

    rows = (
        Allocation.objects.holding()
        .filter(attempt__job__virtual_cluster__in=list(vcs))
        .values("attempt__job__virtual_cluster_id", "gpu__model")
        .annotate(n=models.Count("id"))
    )
    return {(r["attempt__job__virtual_cluster_id"], r["gpu__model"]): r["n"] for r in rows}


def write_secret_file(path: Path, text: str) -> None:
    """Writes an agent token readable by its owner only. The file is created with mode 0600 (and
    an existing one is truncated and set to 0600) before the secret goes in: written first and
    chmod-ed after, it was readable by every local user in between, or for good if the chmod
    never ran."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(fd, 0o600)
        handle.write(text)


ALL_MODELS = "*"  # a quota row that covers every GPU model (scheduler.core.ALL_MODELS)


def quota_in_use(usage: dict[tuple[int, str], int], vc_id: int, gpu_model: str) -> int:
    """GPUs a quota row counts from gpus_in_use's `usage`: its model's, or for an all-models row
    ('*') every model's in the VC, as the scheduler's core counts it against that row."""
    if gpu_model == ALL_MODELS:
        return sum(n for (vc, _), n in usage.items() if vc == vc_id)
    return usage.get((vc_id, gpu_model), 0)


NODE_ACTIONS = {
    "cordon": (NodeState.CORDONED, "cordoned by an admin"),
    "drain": (NodeState.DRAINING, "drained by an admin"),
    "uncordon": (NodeState.READY, ""),
}


@transaction.atomic
def set_node_state(node: Node, action: str, actor: Any, reason: str = "") -> Node:
    """Cordon (no new work), drain (no new work, jobs move away) or uncordon a node.

    Uncordoning a node whose agent is not connected leaves it not-ready until the agent says hello.
    """
    state, default_reason = NODE_ACTIONS[action]
    if action == "uncordon" and not agent_connected(Node.objects.select_for_update().get(pk=node.pk)):
        # Its agent says hello (or heartbeats) before it is ready; a revoked node enrolls first.
        state = NodeState.NOT_READY
    Node.objects.filter(pk=node.pk).update(state=state, state_reason=reason or default_reason)
    node.state, node.state_reason = state, reason or default_reason
    record_audit(actor, f"node.{action}", node, detail=reason)
    from portal.jobs.services import request_scheduling_cycle

    request_scheduling_cycle()  # capacity changed: an uncordoned node may start waiting jobs
    return node


def agent_connected(node: Node) -> bool:
    """Heard from within NODE_SILENT_AFTER_S and not revoked. A node last heard long ago has no
    agent to run work: made ready, it would take jobs until the silence check caught it again."""
    heard = node.last_heartbeat_at
    cutoff = timezone.now() - timedelta(seconds=settings.NODE_SILENT_AFTER_S)
    return node.revoked_at is None and heard is not None and heard >= cutoff


def mark_silent_nodes_not_ready(now: datetime, silent_after_s: int) -> list[str]:
    """Ready nodes whose agent has not sent a heartbeat for `silent_after_s` become not-ready, so
    the scheduler stops placing work there. Returns their names; running it again changes nothing."""
    cutoff = now - timedelta(seconds=silent_after_s)
    silent = Node.objects.filter(state=NodeState.READY).filter(
        models.Q(last_heartbeat_at__lt=cutoff) | models.Q(last_heartbeat_at__isnull=True)
    )
    names = list(silent.values_list("name", flat=True))
    silent.update(state=NodeState.NOT_READY, state_reason=f"no heartbeat for {silent_after_s} s")
    return names


def lost_nodes(now: datetime, lost_after_s: int) -> list[str]:
    """Nodes silent for `lost_after_s` that still hold live allocations, whatever their state.

    A cordoned or draining node is lost like a not-ready one: its jobs cannot stop or report
    there, so they would hold their GPUs (drained ones 'checkpointing', cordoned ones 'running')
    forever. The node keeps the state an admin gave it; only its jobs are requeued."""
    from portal.jobs.models import Allocation

    cutoff = now - timedelta(seconds=lost_after_s)
    silent = Node.objects.filter(
        models.Q(last_heartbeat_at__lt=cutoff) | models.Q(last_heartbeat_at__isnull=True)
    )
    held = Allocation.objects.filter(released_at__isnull=True, node__in=silent).values_list(
        "node__name", flat=True
    )
    return sorted(set(held))


MODEL_RE = re.compile(r"\b([A-Z]{1,2}\d{1,3}[A-Z]?)\b")


def short_gpu_model(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100', 'Tesla V100-SXM2-32GB' -> 'V100': the names quotas use."""
    match = MODEL_RE.search(name.replace("-", " "))
    return match.group(1) if match else name[:32]


def authenticate_node(raw_token: str, address: str = "") -> Node | None:
    """The node whose agent token this is, or None. User API tokens never match a node, and a
    revoked node's token opens nothing (NodeRevoked). A refusal is audited and counts towards an
    alert: on the node when its token was revoked, on the caller's address when it is unknown."""
    from portal.accounts.security import record_refusal

    node = Node.objects.filter(token_hash=hash_secret(raw_token)).first() if raw_token else None
    if node is None:
        what = "an unknown token" if raw_token else "no token"
        record_refusal("agent", f"address:{address}", "agent.connect", detail=f"{what} from {address}")
        return None
    if node.revoked_at is not None:
        detail = f"revoked credentials of node {node.name} from {address}"
        record_refusal("agent", f"node:{node.pk}", "agent.connect", obj=node, detail=detail)
        raise NodeRevoked(node.name)
    return node


@transaction.atomic
def issue_node_token(node: Node, actor: Any) -> str:
    """Gives the node a new agent token (the old one stops working) and returns it, once.

    The token is checked only at the websocket handshake, so an agent connected with the old one
    would go on receiving desired sets (with jobs' secret variables): its sockets are closed after
    commit, and it must connect again with the new token. Enrollment and register_node come here.
    """
    from portal.agentgw.outbox import close_node_sockets

    raw = new_secret()
    Node.objects.filter(pk=node.pk).update(token_hash=hash_secret(raw))
    node.token_hash = hash_secret(raw)
    record_audit(actor, "node.issue_token", node)
    close_node_sockets(node.pk)
    return raw


class NodeRevoked(Exception):
    """The node's agent credentials were revoked; it must enroll again."""


@transaction.atomic
def revoke_node(node: Node, actor: Any, reason: str = "") -> list[int]:
    """Marks the node's agent credentials revoked and the node untrusted (cordoned: it takes no
    work until it enrolls again and an admin uncordons it). Its jobs go through the node-lost
    path: their attempts end and they are requeued elsewhere, or fail NODE_FAIL if they must not
    run twice. After commit the agent is sent its (now empty) desired set and its socket is
    closed; its token is refused from then on. Returns the requeued job ids.

    The jobs on the node are locked before the node, the order of every writer: a revoke that
    held the node while it waited for one of them deadlocked with a cancellation or a cycle that
    held that job and then needed the node. A job placed on the node between the two locks is
    requeued too; none can be placed once the node is locked, as the cycle checks it under a
    lock of its own."""
    from portal.agentgw.outbox import close_node_sockets
    from portal.jobs.models import Allocation
    from portal.jobs.services import lock_jobs_holding, request_scheduling_cycle, requeue_jobs_holding

    why = reason or "agent credentials revoked by an admin"
    lock_jobs_holding(Allocation.objects.filter(node=node, released_at__isnull=True), and_nodes=[node.pk])
    node = Node.objects.get(pk=node.pk)  # locked above
    node.revoked_at = node.revoked_at or timezone.now()
    node.state, node.state_reason = NodeState.CORDONED, f"untrusted: {why}"[:200]
    node.save(update_fields=["revoked_at", "state", "state_reason"])
    record_audit(actor, "node.revoke", node, detail=reason)
    requeued = requeue_jobs_holding(
        Allocation.objects.filter(node=node, released_at__isnull=True), f"node {node.name} revoked: {why}"
    )
    close_node_sockets(node.pk)
    request_scheduling_cycle()
    return requeued


ENROLLMENT_TOKEN_PREFIX = "gpe_"


class EnrollmentRefused(Exception):
    """An enrollment token that is unknown, used, expired or not for this node. `status` is the
    HTTP answer: 401 for a token that opens nothing, 403 for one that is not for this node."""

    def __init__(self, reason: str, status: int = 401, token: EnrollmentToken | None = None) -> None:
        super().__init__(reason)
        self.reason, self.status, self.token = reason, status, token


@transaction.atomic
def create_enrollment_token(
    actor: Any, node_name: str = "", ttl_minutes: int | None = None
) -> tuple[EnrollmentToken, str]:
    """A one-time enrollment token (256 random bits; only its hash is stored) and its secret,
    which is shown once. Bound to `node_name` it enrolls only that node, new or existing;
    unbound, any new node."""
    minutes = settings.ENROLLMENT_TOKEN_TTL_MINUTES if ttl_minutes is None else ttl_minutes
    if not 0 < minutes <= settings.ENROLLMENT_TOKEN_MAX_TTL_MINUTES:
        raise ValueError(
            f"An enrollment token lives between 1 and {settings.ENROLLMENT_TOKEN_MAX_TTL_MINUTES} minutes."
        )
    if node_name:
        validate_slug(node_name)
    raw = ENROLLMENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = EnrollmentToken.objects.create(
        token_hash=hash_secret(raw),
        node_name=node_name,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
        expires_at=timezone.now() + timedelta(minutes=minutes),
    )
    record_audit(actor, "node.enrollment_token.create", token)
    return token, raw


@transaction.atomic
def void_enrollment_tokens(tokens: Any, actor: Any) -> int:
    """Ends the tokens of `tokens` that could still enroll a node (unused, unexpired) now, for a
    token that leaked or was made by mistake: otherwise it stays usable until it expires (up to
    ENROLLMENT_TOKEN_MAX_TTL_MINUTES). Each is audited. Returns how many were voided."""
    now = timezone.now()
    voided = list(tokens.usable().select_for_update(of=("self",)))
    for token in voided:
        token.expires_at = now
        token.save(update_fields=["expires_at"])
        record_audit(actor, "node.enrollment_token.void", token)
    return len(voided)


def enroll_node(raw_token: str, node_name: str, address: str = "") -> tuple[Node, str]:
    """Exchanges a one-time enrollment token for the node's own agent token. Nothing is created
    or changed on a refusal, which is audited against the caller's address. Raises
    EnrollmentRefused, or ValueError for a node name that is not a valid name."""
    from portal.accounts.security import record_refusal

    try:
        return _enroll(raw_token, node_name)
    except EnrollmentRefused as refused:
        detail = f"{refused.reason} (node name {node_name[:100]!r}, from {address})"
        record_refusal("agent", f"address:{address}", "node.enroll", obj=refused.token, detail=detail)
        raise


@transaction.atomic
def _enroll(raw_token: str, node_name: str) -> tuple[Node, str]:
    token = (
        EnrollmentToken.objects.select_for_update().filter(token_hash=hash_secret(raw_token)).first()
        if raw_token
        else None
    )
    if token is None:
        raise EnrollmentRefused("unknown enrollment token")
    if token.used_at is not None:
        raise EnrollmentRefused("enrollment token already used", token=token)
    if token.expires_at <= timezone.now():
        raise EnrollmentRefused("enrollment token expired", token=token)
    if token.node_name and node_name and node_name != token.node_name:
        raise EnrollmentRefused(f"enrollment token is for node {token.node_name}", 403, token)
    name = token.node_name or node_name
    try:
        validate_slug(name)
    except ValidationError:
        raise ValueError(f"{name!r} is not a valid node name: use letters, digits, '-' and '_'.") from None
    node = Node.objects.select_for_update().filter(name=name).first()
    if node is not None and not token.node_name:
        # Only a token bound to a node's name may give an existing node new credentials.
        raise EnrollmentRefused(f"node {name} exists; its enrollment token must name it", 403, token)
    if node is None:
        node = Node.objects.create(name=name)
    raw = issue_node_token(node, token.created_by)
    # New credentials, maybe a new host: its first hello sets the node's GPUs again.
    Node.objects.filter(pk=node.pk).update(revoked_at=None, inventory_accepted=False, reported_gpus=[])
    node.revoked_at = None
    token.used_at, token.node = timezone.now(), node
    token.save(update_fields=["used_at", "node"])
    record_audit(token.created_by, "node.enroll", node, detail=f"enrollment token {token.pk}")
    return node, raw


def _topology_ids(values: list[str | None]) -> dict[str | None, int]:
    """Opaque topology ids from the agent ('nvswitch-0', 'numa1-pcie0') as small integers."""
    return {value: i for i, value in enumerate(sorted({v for v in values if v is not None}))}


@transaction.atomic
def record_hello(node: Node, hello: Hello) -> Node:
    """Takes the agent's word on the node's host and its GPUs' health, and marks the node ready.

    The node's GPUs (index, UUID, model, memory) are set by the first hello after registration or
    enrollment. Later hellos may not add or change any: a GPU the node was not registered with is
    refused, the refusal audited and counted towards a security alert, and the node drained
    until an admin accepts the reported GPUs (accept_reported_gpus). A compromised agent that
    claimed GPUs would otherwise draw other tenants' jobs, with their secrets, to itself.

    A GPU the portal holds unhealthy stays so, whatever the agent says, until an admin clears it
    (clear_gpu_health): an agent restart does not repair a card. A node an admin cordoned or
    drained stays so; an agent that asks to be drained (its runtime failed the version gate) is
    drained with the agent's reason.
    """
    from portal.accounts.security import record_refusal

    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.revoked_at is not None:
        raise NodeRevoked(node.name)
    known = {gpu.index: gpu for gpu in Gpu.objects.filter(node=node)}
    others = _gpus_of_other_nodes(node, hello.gpus)
    # A UUID registered to another node is a claim on any hello, the first one included: taking
    # it would rename the other node's GPU, orphan its telemetry and drain it on its next hello.
    claimed = [g for g in hello.gpus if g.uuid in others]
    if node.inventory_accepted:
        claimed += [g for g in _claimed_gpus(known, hello.gpus) if g not in claimed]
    claimed.sort(key=lambda g: g.index)
    _take_inventory(node, known, [g for g in hello.gpus if g not in claimed], hello.gpus)
    node.inventory_accepted = True
    node.cpu = hello.host.cpu_count
    node.memory_gb = hello.host.memory_total_mib // 1024
    node.agent_version = hello.agent_version[:64]
    node.last_heartbeat_at = timezone.now()
    node.reported_gpus = [g.model_dump(mode="json") for g in hello.gpus] if claimed else []
    if claimed:
        listed = ", ".join(f"{g.index} ({g.uuid})" for g in claimed)
        node.state = NodeState.DRAINING
        node.state_reason = f"the agent reports GPUs the node was not registered with: {listed}"[:200]
        detail = f"hello from node {node.name} claims GPUs it was not registered with: {listed}"
        if others:
            owners = ", ".join(f"{uuid} is node {name}'s" for uuid, name in sorted(others.items()))
            detail += f" ({owners})"
        record_refusal("agent", f"node:{node.pk}", "node.gpus", obj=node, detail=detail)
    elif hello.drain_reason:
        node.state, node.state_reason = NodeState.DRAINING, hello.drain_reason[:200]
    elif node.state == NodeState.NOT_READY:
        node.state, node.state_reason = NodeState.READY, ""
    node.save()
    from portal.jobs.services import request_scheduling_cycle

    request_scheduling_cycle()
    return node


def _gpus_of_other_nodes(node: Node, reported: list[GpuInfo]) -> dict[str, str]:
    """The reported UUIDs that are registered to another node's GPU, with that node's name. Only
    an admin moves a UUID between nodes (accept_reported_gpus); an agent never does."""
    rows = (
        Gpu.objects.filter(uuid__in=[info.uuid for info in reported])
        .exclude(node=node)
        .values_list("uuid", "node__name")
    )
    return dict(rows)


def _claimed_gpus(known: dict[int, Gpu], reported: list[GpuInfo]) -> list[GpuInfo]:
    """The reported GPUs the node was not registered with: a new index, or another card, model
    or memory size at a known one."""
    claimed = []
    for info in reported:
        gpu = known.get(info.index)
        if gpu is None or (gpu.uuid, gpu.model, gpu.memory_mb) != (
            info.uuid,
            short_gpu_model(info.model),
            info.memory_total_mib,
        ):
            claimed.append(info)
    return claimed


def _take_inventory(
    node: Node,
    known: dict[int, Gpu],
    gpus: list[GpuInfo],
    reported: list[GpuInfo],
    from_other_nodes: bool = False,
) -> None:
    """Writes `gpus` (of the agent's `reported` inventory, whose topology ids they share) over the
    node's `known` GPUs, matched by index; known GPUs the agent no longer reports go unhealthy.
    Jobs on GPUs that are unhealthy now are requeued once the hello commits. The caller holds
    the node's row lock.

    A UUID held by another of the node's GPUs is renamed away (a card moved between indexes).
    Only with `from_other_nodes` (an admin's accept_reported_gpus) is a UUID taken from another
    node's GPU: an agent's hello must never touch another node's rows."""
    nvlink = _topology_ids([g.topology.nvlink_group for g in reported])
    pcie = _topology_ids([g.topology.pcie_switch for g in reported])
    actor = f"agent {node.name}"
    for info in gpus:
        # A uuid moving between indexes (rare, after a repair) must not trip the unique constraint.
        holders = Gpu.objects.filter(uuid=info.uuid).exclude(node=node, index=info.index)
        if not from_other_nodes:
            holders = holders.filter(node=node)
        holders.update(uuid=f"stale-{uuid4()}")
        before = known.get(info.index)
        healthy = info.healthy
        reason = "" if healthy else (info.health_reason or "reported unhealthy by the agent")
        if before is not None and before.uuid == info.uuid and not before.healthy:
            healthy, reason = False, before.health_reason  # only an admin returns it to service
        elif not healthy:
            _health_event(node, info.uuid, info.index, False, reason, actor)
        Gpu.objects.update_or_create(
            node=node,
            index=info.index,
            defaults={
                "uuid": info.uuid,
                "model": short_gpu_model(info.model),
                "memory_mb": info.memory_total_mib,
                "nvlink_group": nvlink.get(info.topology.nvlink_group, 100 + info.index),
                "pcie_switch": pcie.get(info.topology.pcie_switch, 100 + info.index),
                "numa_node": info.topology.numa_node or 0,
                "healthy": healthy,
                "health_reason": reason[:200],
            },
        )
    indexes = {info.index for info in reported}
    missing = [gpu for index, gpu in known.items() if index not in indexes and gpu.healthy]
    for gpu in missing:
        _health_event(node, gpu.uuid, gpu.index, False, "not reported by the agent", actor)
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in missing]).update(
        healthy=False, health_reason="not reported by the agent"
    )
    # After commit, in a transaction of its own: requeueing locks the jobs and then the node,
    # the order every writer keeps, while this one holds the node's row.
    transaction.on_commit(lambda: _requeue_after_hello(node))


def _requeue_after_hello(node: Node) -> None:
    with transaction.atomic():
        requeue_holders_of_failed_gpus(node)


def requeue_holders_of_failed_gpus(node: Node) -> list[int]:
    """Requeues the jobs that hold an unhealthy GPU of the node, as record_gpu_health does for a
    GPU that fails while it runs. A hello is where an agent restarted after a crash or a reboot
    first says a card failed; telemetry then keeps saying so, but record_gpu_health acts only on
    GPUs still held healthy, so without this the job kept its dead GPU. Returns the job ids.

    All their jobs are locked first, in id order: the requeue of one job writes its nodes'
    revision, and locking the next job only then deadlocked with a cancellation that held that
    job and needed the node too."""
    from portal.jobs.models import Allocation
    from portal.jobs.services import lock_jobs_holding, requeue_jobs_holding

    held = Allocation.objects.filter(node=node, released_at__isnull=True, gpu__healthy=False)
    lock_jobs_holding(held)
    requeued = []
    for gpu in Gpu.objects.filter(pk__in=held.values("gpu_id")).order_by("index"):
        reason = f"GPU {gpu.uuid} on {node.name} failed: {gpu.health_reason}"
        requeued += requeue_jobs_holding(held.filter(gpu=gpu), reason)
    return requeued


@transaction.atomic
def accept_reported_gpus(node: Node, actor: Any) -> int:
    """Takes the GPUs the node's agent reported and was refused (a card replaced or added by an
    admin) as the node's own. The node stays drained: the admin uncordons it once satisfied.
    Returns how many GPUs were accepted (0 when nothing waited)."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    if not node.reported_gpus:
        return 0
    reported = [GpuInfo.model_validate(g) for g in node.reported_gpus]
    known = {gpu.index: gpu for gpu in Gpu.objects.filter(node=node)}
    _take_inventory(node, known, reported, reported, from_other_nodes=True)
    node.reported_gpus = []
    node.save(update_fields=["reported_gpus"])
    listed = ", ".join(f"{g.index} ({g.uuid})" for g in reported)
    record_audit(actor, "node.accept_gpus", node, detail=f"GPUs now registered: {listed}")
    return len(reported)


def _health_event(node: Node, gpu_uuid: str, index: int, healthy: bool, reason: str, actor: str) -> None:
    GpuHealthEvent.objects.create(
        gpu_uuid=gpu_uuid, node=node, gpu_index=index, healthy=healthy, reason=reason[:200], actor=actor[:150]
    )


def record_heartbeats(node_ids: Iterable[int]) -> None:
    """Heartbeats keep nodes ready; a node that went not-ready for silence comes back. Called with
    the nodes heard from since the last call (portal.agentgw.ingest), so a thousand agents cost
    two statements a second, not two each."""
    ids = list(node_ids)
    Node.objects.filter(pk__in=ids).update(last_heartbeat_at=timezone.now())
    back = Node.objects.filter(pk__in=ids, state=NodeState.NOT_READY)
    if back.update(state=NodeState.READY, state_reason=""):
        from portal.jobs.services import request_scheduling_cycle

        request_scheduling_cycle()


@transaction.atomic
def record_gpu_health(node: Node, samples: Iterable[GpuSample]) -> list[str]:
    """Marks GPUs unhealthy (Xid, ECC, NVML errors): an unhealthy GPU gets no new placements until
    an admin clears it, the job on it is requeued with the reason, and the GPU's history keeps
    the event. An Xid whose recovery needs the node rebooted (NODE_LEVEL_XIDS) drains the node,
    which moves its other jobs away too. Returns the uuids of GPUs that became unhealthy.

    Locks are taken in the order of every writer: the jobs on the failing GPUs, then this node
    (its health events refer to it, a drain writes it) and the other nodes of those jobs (their
    requeue writes them), then the GPUs, each in id order. Locking a GPU first deadlocked: with a
    cycle that held the job on it (suspending it for another job's time slice) and then locked
    the GPU, with a hello that held the node and then wrote its GPUs, and, once a drain held the
    node, with a cancellation of the job on a second failing GPU (which writes the node's
    revision). A job placed on a GPU between the two locks is requeued too; none can be placed
    once the GPU is locked, as the cycle checks it under a lock of its own."""
    from portal.jobs.models import Allocation
    from portal.jobs.services import lock_jobs_holding, requeue_jobs_holding

    latest = {s.gpu_uuid: s for s in samples}
    failing = {uuid: sample for uuid, sample in latest.items() if not sample.healthy}
    candidates = Gpu.objects.filter(node=node, uuid__in=list(failing), healthy=True)
    if not failing or not candidates.exists():
        return []
    holding = Allocation.objects.filter(gpu__in=candidates, released_at__isnull=True)
    lock_jobs_holding(holding, and_nodes=[node.pk])
    # Read again under the lock: a GPU another report took out meanwhile is left alone.
    locked = {gpu.uuid: gpu for gpu in candidates.select_for_update().order_by("pk")}

    newly_unhealthy = []
    for sample in failing.values():
        gpu = locked.get(sample.gpu_uuid)
        if gpu is None:
            continue
        reason = (sample.health_reason or "reported unhealthy")[:200]
        gpu.healthy, gpu.health_reason = False, reason
        gpu.save(update_fields=["healthy", "health_reason"])
        _health_event(node, gpu.uuid, gpu.index, False, reason, f"agent {node.name}")
        newly_unhealthy.append(sample.gpu_uuid)
        held = Allocation.objects.filter(gpu=gpu, released_at__isnull=True)
        requeue_jobs_holding(held, f"GPU {sample.gpu_uuid} on {node.name} failed: {reason}")
        node_level = sorted(set(sample.xid_events) & NODE_LEVEL_XIDS)
        if node_level and node.revoked_at is None:  # the drain moves the node's other jobs away
            reason = f"GPU {gpu.index} failed with xid {node_level[0]}: reboot the node, then clear the GPU"
            set_node_state(node, "drain", None, reason)
    return newly_unhealthy


@transaction.atomic
def clear_gpu_health(gpu: Gpu, actor: Any, note: str = "") -> bool:
    """Returns a GPU to service after a repair, a reset or a reboot (Slurm's `scontrol update
    state=resume`). The node keeps its state: an admin uncordons a drained node separately. If
    the card fails again, the agent reports it and it is taken out again. Returns whether it
    was unhealthy.

    The node is locked before the GPU, the order of every writer: the GPU's health event refers
    to the node, and holding the GPU while that waited for a hello, which holds the node and
    then writes its GPUs, deadlocked."""
    list(Node.objects.select_for_update(no_key=True).filter(pk=gpu.node_id).values_list("pk", flat=True))
    gpu = Gpu.objects.select_for_update().select_related("node").get(pk=gpu.pk)
    if gpu.healthy:
        return False
    gpu.healthy, gpu.health_reason = True, ""
    gpu.save(update_fields=["healthy", "health_reason"])
    _health_event(gpu.node, gpu.uuid, gpu.index, True, note or "returned to service", actor.get_username())
    record_audit(actor, "gpu.clear", gpu, detail=note)
    from portal.jobs.services import request_scheduling_cycle

    request_scheduling_cycle()
    return True


TELEMETRY_TTL_S = 3600


def telemetry_key(node_id: int) -> str:
    """The Redis hash of a node's latest sample per GPU (GPU UUID -> sample JSON)."""
    return f"telemetry:node:{node_id}"


def latest_gpu_samples(node_ids: Iterable[int]) -> dict[int, dict[str, dict[str, Any]]]:
    """The latest sample of every GPU of these nodes (node id -> GPU UUID -> sample fields), in
    one round trip; GPUs without a sample in the last hour are missing."""
    ids = list(node_ids)
    pipe = get_redis().pipeline(transaction=False)
    for node_id in ids:
        pipe.hgetall(telemetry_key(node_id))
    return {
        node_id: {uuid.decode(): json.loads(raw) for uuid, raw in found.items()}
        for node_id, found in zip(ids, pipe.execute(), strict=True)
    }


def store_telemetry(batches: list[tuple[int, list[GpuSample]]]) -> None:
    """Stores the samples of many nodes at once: the latest sample per GPU in Redis and the
    samples of allocated GPUs as their attempt's history in PostgreSQL (one statement each),
    pushed to the browsers watching those jobs.

    A sample counts for the attempt holding that GPU on that node now: a node's report on a GPU
    it does not have, or one nobody holds, is kept as the latest reading only. PostgreSQL reads
    the samples from one JSON document and finds their attempts itself, so the web process does
    no work per sample beyond serialising it once.
    """
    from portal.jobs.models import Allocation
    from portal.live.publish import publish_telemetry

    latest: dict[int, dict[str, str]] = defaultdict(dict)
    documents = []
    for node_id, samples in batches:
        texts = [sample.model_dump_json() for sample in samples]
        latest[node_id].update(zip((sample.gpu_uuid for sample in samples), texts, strict=True))
        documents.append(f'{{"node":{int(node_id)},"samples":[{",".join(texts)}]}}')
    keys = [telemetry_key(node_id) for node_id in latest]
    get_redis().eval(STORE_LATEST_LUA, len(keys), *keys, json.dumps(list(latest.values())), TELEMETRY_TTL_S)
    with connection.cursor() as cursor:
        cursor.execute(STORE_HISTORY_SQL, [f"[{','.join(documents)}]"])
        job_ids = [job_id for (job_id,) in cursor.fetchall()]

    watched = set(watched_jobs(job_ids))
    if not watched:
        return
    owners = {
        (node_id, uuid): job_id
        for node_id, uuid, job_id in Allocation.objects.holding()
        .filter(attempt__job_id__in=watched)
        .values_list("gpu__node_id", "gpu__uuid", "attempt__job_id")
    }
    by_job: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for node_id, samples in batches:
        for sample in samples:
            if (job_id := owners.get((node_id, sample.gpu_uuid))) is not None:
                by_job[job_id].append(sample.model_dump(mode="json", include=TELEMETRY_FIELDS))
    for job_id, job_samples in by_job.items():
        publish_telemetry(job_id, job_samples)


# One command for all nodes: redis-py spends far longer packing thousands of HSET arguments than
# Redis takes to decode one JSON list of {gpu uuid: sample JSON}, one per key.
STORE_LATEST_LUA = """
local latest = cjson.decode(ARGV[1])
for i, key in ipairs(KEYS) do
    for uuid, sample in pairs(latest[i]) do
        redis.call('HSET', key, uuid, sample)
    end
    redis.call('EXPIRE', key, tonumber(ARGV[2]))
end
"""

# One node's report counts only for GPUs of that node: the join is on the node and the uuid. A
# sample belongs to the attempt using the GPU: not to a time-sliced one suspended on it, whose
# allocation stays (parked) while another job takes its turn, or each sample would be stored twice.
STORE_HISTORY_SQL = """
WITH batch AS (
    SELECT (b ->> 'node')::bigint AS node_id, s.*
    FROM jsonb_array_elements(%s::jsonb) AS b,
        jsonb_to_recordset(b -> 'samples') AS s(
            gpu_uuid text, time timestamptz, utilization_pct float8, memory_used_mib integer,
            power_w float8, temperature_c float8, energy_j float8
        )
), stored AS (
    INSERT INTO jobs_telemetrysample (
        attempt_id, gpu_uuid, time, utilization_pct, memory_used_mib, power_w, temperature_c,
        energy_j, resolution_s
    )
    SELECT a.attempt_id, batch.gpu_uuid, batch.time, batch.utilization_pct, batch.memory_used_mib,
        batch.power_w, batch.temperature_c, batch.energy_j, 0
    FROM batch
    JOIN cluster_gpu g ON g.node_id = batch.node_id AND g.uuid = batch.gpu_uuid
    JOIN jobs_allocation a ON a.gpu_id = g.id AND a.released_at IS NULL AND NOT a.suspended
    RETURNING attempt_id
)
SELECT DISTINCT attempt.job_id FROM stored JOIN jobs_jobattempt attempt ON attempt.id = stored.attempt_id
"""


def watched_jobs(job_ids: Iterable[int]) -> list[int]:
    """The jobs some browser follows, in one Redis round trip: most jobs that stream telemetry
    are not watched, and a publish to nobody still costs one."""
    from portal.live.hub import channel_for
    from portal.live.publish import job_group

    ids = list(job_ids)
    if not ids:
        return []
    counts = get_redis().pubsub_numsub(*(channel_for(job_group(job_id)) for job_id in ids))
    return [job_id for job_id, (_, subscribers) in zip(ids, counts, strict=True) if subscribers > 0]


TELEMETRY_FIELDS = {
    "gpu_uuid",
    "time",
    "utilization_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
}

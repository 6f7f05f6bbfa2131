"""Write paths and derived figures for the cluster: node states and quota use."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from django.db import models, transaction
from django.utils import timezone

from agents.protocol import Hello, TelemetryBatch
from portal.accounts.models import hash_secret, new_secret
from portal.accounts.services import record_audit
from portal.cluster.choices import NodeState
from portal.cluster.models import Gpu, Node, VirtualCluster
from portal.lib.redis import get_redis


def gpus_in_use(vcs: Iterable[VirtualCluster]) -> dict[tuple[int, str], int]:
    """Live allocated GPUs per (VC id, GPU model), in one query."""
    from portal.jobs.models import Allocation

    rows = (
        Allocation.objects.filter(released_at__isnull=True, attempt__job__virtual_cluster__in=list(vcs))
        .values("attempt__job__virtual_cluster_id", "gpu__model")
        .annotate(n=models.Count("id"))
    )
    return {(r["attempt__job__virtual_cluster_id"], r["gpu__model"]): r["n"] for r in rows}


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
    if action == "uncordon" and node.last_heartbeat_at is None:
        state = NodeState.NOT_READY
    Node.objects.filter(pk=node.pk).update(state=state, state_reason=reason or default_reason)
    node.state, node.state_reason = state, reason or default_reason
    record_audit(actor, f"node.{action}", node, detail=reason)
    return node


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
    """Not-ready nodes silent for `lost_after_s` that still hold live allocations."""
    from portal.jobs.models import Allocation

    cutoff = now - timedelta(seconds=lost_after_s)
    silent = Node.objects.filter(state=NodeState.NOT_READY).filter(
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


def authenticate_node(raw_token: str) -> Node | None:
    """The node whose agent token this is, or None. User API tokens never match a node."""
    if not raw_token:
        return None
    return Node.objects.filter(token_hash=hash_secret(raw_token)).first()


@transaction.atomic
def issue_node_token(node: Node, actor: Any) -> str:
    """Gives the node a new agent token (the old one stops working) and returns it, once."""
    raw = new_secret()
    Node.objects.filter(pk=node.pk).update(token_hash=hash_secret(raw))
    node.token_hash = hash_secret(raw)
    record_audit(actor, "node.issue_token", node)
    return raw


def _topology_ids(values: list[str | None]) -> dict[str | None, int]:
    """Opaque topology ids from the agent ('nvswitch-0', 'numa1-pcie0') as small integers."""
    return {value: i for i, value in enumerate(sorted({v for v in values if v is not None}))}


@transaction.atomic
def record_hello(node: Node, hello: Hello) -> Node:
    """Takes the agent's inventory as the truth about the node's GPUs and marks the node ready.

    GPUs are matched by index. A node an admin cordoned or drained stays so; an agent that asks
    to be drained (its runtime failed the version gate) is drained with the agent's reason.
    """
    node = Node.objects.select_for_update().get(pk=node.pk)
    nvlink = _topology_ids([g.topology.nvlink_group for g in hello.gpus])
    pcie = _topology_ids([g.topology.pcie_switch for g in hello.gpus])
    seen = set()
    for info in hello.gpus:
        seen.add(info.index)
        # A uuid moving between indexes (rare, after a repair) must not trip the unique constraint.
        Gpu.objects.filter(uuid=info.uuid).exclude(node=node, index=info.index).update(
            uuid=f"stale-{uuid4()}"
        )
        unhealthy_reason = info.health_reason or "reported unhealthy by the agent"
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
                "healthy": info.healthy,
                "health_reason": "" if info.healthy else unhealthy_reason[:200],
            },
        )
    Gpu.objects.filter(node=node).exclude(index__in=seen).update(
        healthy=False, health_reason="not reported by the agent"
    )
    node.cpu = hello.host.cpu_count
    node.memory_gb = hello.host.memory_total_mib // 1024
    node.agent_version = hello.agent_version[:64]
    node.last_heartbeat_at = timezone.now()
    if hello.drain_reason:
        node.state, node.state_reason = NodeState.DRAINING, hello.drain_reason[:200]
    elif node.state == NodeState.NOT_READY:
        node.state, node.state_reason = NodeState.READY, ""
    node.save()
    from portal.jobs.services import request_scheduling_cycle

    request_scheduling_cycle()
    return node


def record_heartbeat(node: Node) -> None:
    """A heartbeat keeps the node ready; a node that went not-ready for silence comes back."""
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now)
    if Node.objects.filter(pk=node.pk, state=NodeState.NOT_READY).update(
        state=NodeState.READY, state_reason=""
    ):
        from portal.jobs.services import request_scheduling_cycle

        request_scheduling_cycle()


def record_telemetry(node: Node, batch: TelemetryBatch) -> list[str]:
    """Keeps the latest sample per GPU in Redis and marks GPUs unhealthy (Xid, ECC, NVML errors):
    an unhealthy GPU gets no new placements, and the job on it is requeued with the reason.
    Returns the uuids of GPUs that became unhealthy with this batch.
    """
    from portal.jobs.models import Allocation
    from portal.jobs.services import requeue_jobs_holding

    latest = {s.gpu_uuid: s for s in batch.samples}
    if latest:
        cache = get_redis()
        cache.hset(f"telemetry:node:{node.pk}", mapping={u: s.model_dump_json() for u, s in latest.items()})
        cache.expire(f"telemetry:node:{node.pk}", 3600)
    record_job_telemetry(batch)
    newly_unhealthy = []
    for sample in latest.values():
        if not sample.healthy:
            reason = (sample.health_reason or "reported unhealthy")[:200]
            if Gpu.objects.filter(node=node, uuid=sample.gpu_uuid, healthy=True).update(
                healthy=False, health_reason=reason
            ):
                newly_unhealthy.append(sample.gpu_uuid)
                requeue_jobs_holding(
                    Allocation.objects.filter(
                        gpu__node=node, gpu__uuid=sample.gpu_uuid, released_at__isnull=True
                    ),
                    f"GPU {sample.gpu_uuid} on {node.name} failed: {reason}",
                )
    return newly_unhealthy


def record_job_telemetry(batch: TelemetryBatch) -> None:
    """Keeps the samples of allocated GPUs as their attempt's history and pushes them to the
    browsers watching those jobs."""
    from portal.jobs.models import Allocation, TelemetrySample
    from portal.live.publish import publish_telemetry

    uuids = {s.gpu_uuid for s in batch.samples}
    owners = {
        uuid: (attempt_id, job_id)
        for uuid, attempt_id, job_id in Allocation.objects.filter(
            released_at__isnull=True, gpu__uuid__in=uuids
        ).values_list("gpu__uuid", "attempt_id", "attempt__job_id")
    }
    rows, by_job = [], defaultdict(list)
    for sample in batch.samples:
        if sample.gpu_uuid not in owners:
            continue
        attempt_id, job_id = owners[sample.gpu_uuid]
        rows.append(
            TelemetrySample(
                attempt_id=attempt_id,
                gpu_uuid=sample.gpu_uuid,
                time=sample.time,
                utilization_pct=sample.utilization_pct,
                memory_used_mib=sample.memory_used_mib,
                power_w=sample.power_w,
                temperature_c=sample.temperature_c,
                energy_j=sample.energy_j,
            )
        )
        by_job[job_id].append(sample.model_dump(mode="json", include=TELEMETRY_FIELDS))
    TelemetrySample.objects.bulk_create(rows)
    for job_id, samples in by_job.items():
        publish_telemetry(job_id, samples)


TELEMETRY_FIELDS = {
    "gpu_uuid",
    "time",
    "utilization_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
}

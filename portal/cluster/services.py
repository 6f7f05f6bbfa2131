"""Write paths and derived figures for the cluster: node states and quota use."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import models, transaction

from portal.accounts.services import record_audit
from portal.cluster.choices import NodeState
from portal.cluster.models import Node, VirtualCluster


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

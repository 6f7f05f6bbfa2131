"""Telling agents that their desired set changed: bump the node's revision in the transaction
that made the change, and wake the node's websocket after commit. A lost wake-up costs nothing
but time: the agent gets the whole set again on its next connect or change."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F

from portal.cluster.models import Node
from portal.lib.channels import group_send


def node_group(node_id: int) -> str:
    return f"node.{node_id}"


def desired_set_changed(node_ids: Iterable[int]) -> None:
    """Call inside the transaction that changed what these nodes should run. One statement locks
    the nodes in id order, as the cycle locks them, and bumps their revisions: an UPDATE of
    several rows alone locks them in whatever order it finds them, which could deadlock with a
    cycle holding one of them."""
    ids = sorted(set(node_ids))
    if not ids:
        return
    in_id_order = Node.objects.select_for_update(no_key=True).filter(pk__in=ids).order_by("pk").values("pk")
    Node.objects.filter(pk__in=in_id_order).update(desired_revision=F("desired_revision") + 1)
    transaction.on_commit(lambda: _send_all(ids, {"type": "desired.changed"}))


def send_request(node_id: int, message_json: str) -> None:
    """Queues an imperative request (checkpoint, suspend, ...) for the node, sent after commit."""
    transaction.on_commit(lambda: _send_all([node_id], {"type": "agent.request", "text": message_json}))


def _send_all(node_ids: list[int], event: dict[str, Any]) -> None:
    for node_id in node_ids:
        group_send(node_group(node_id), event)


def close_node_sockets(node_id: int) -> None:
    """Closes the node's agent socket after commit: its credentials were revoked or replaced (a
    new token, a re-enrollment), and a socket is checked only when it opens. Sent after the
    desired-set hints of the same transaction, so the agent first hears what to stop."""
    transaction.on_commit(lambda: _send_all([node_id], {"type": "node.revoked"}))

"""S7: an agent may not claim GPUs its node was not registered with. The first hello after
registration or enrollment sets the node's GPUs; a later one that adds a GPU, or reports another
card or model at a known index, changes none of them: the node is drained (its jobs move away,
no new one lands there), the refusal is audited and counts towards a security alert, and an admin
accepts the reported GPUs after a real repair."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.cluster.models import Gpu, Node
from portal.cluster.services import create_enrollment_token, enroll_node, record_hello, set_node_state
from portal.lib.redis import get_redis
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile, submit
from tests.portal.test_gpu_health import NODE, hello

pytestmark = pytest.mark.django_db(transaction=True)

UUIDS = {i: f"GPU-{NODE}-{i}" for i in range(8)}


@pytest.fixture(autouse=True)
def fresh_windows(settings: Any) -> None:
    for key in get_redis().scan_iter("security:*"):
        get_redis().delete(key)
    settings.SECURITY_ALERT_THRESHOLD = 3
    settings.SECURITY_ALERT_WINDOW_S = 600


def gpus_of(node: Node) -> dict[int, str]:
    return dict(Gpu.objects.filter(node=node).values_list("index", "uuid"))


def test_a_hello_claiming_gpus_changes_none_and_drains_the_node(
    api_for: Any, users: Any, paused_loop: Any
) -> None:
    Node.objects.update(state="ready")
    node = Node.objects.get(name=NODE)
    record_hello(node, hello(UUIDS))  # the first hello sets the node's GPUs
    assert gpus_of(node) == UUIDS

    claim = {**UUIDS, 2: "GPU-other-card", 8: "GPU-extra"}
    record_hello(node, hello(claim))
    node.refresh_from_db()
    assert gpus_of(node) == UUIDS
    assert node.state == "draining"
    assert node.state_reason == (
        "the agent reports GPUs the node was not registered with: 2 (GPU-other-card), 8 (GPU-extra)"
    )
    assert [g["uuid"] for g in node.reported_gpus] == list(claim.values())
    refusal = AuditEntry.objects.get(action="node.gpus.denied")
    assert "claims GPUs it was not registered with" in refusal.detail and refusal.object_id == str(node.pk)

    # No job lands on the node (the other A100 node takes it).
    job_id = submit(api_for("alice"), "elsewhere", flavor="s-A100")
    run_cycle(live_profile())
    assert not Gpu.objects.filter(node=node, allocations__attempt__job_id=job_id).exists()

    # A hello of the registered GPUs only (the agent restarted as it was) drops the claim.
    record_hello(node, hello(UUIDS))
    node.refresh_from_db()
    assert node.reported_gpus == [] and node.state == "draining"  # an admin uncordons it


def test_repeated_claims_raise_a_security_alert(users: Any) -> None:
    node = Node.objects.get(name=NODE)
    record_hello(node, hello(UUIDS))
    for _ in range(3):
        record_hello(node, hello({**UUIDS, 8: "GPU-extra"}))
    alert = AuditEntry.objects.get(action="security.alert")
    assert alert.detail.startswith(f"3 refused requests by node:{node.pk}")


def test_an_admin_accepts_a_replaced_card(users: Any, cluster_admin_client: Any) -> None:
    node = Node.objects.get(name=NODE)
    record_hello(node, hello(UUIDS))
    replaced = {**UUIDS, 4: "GPU-new-card"}
    record_hello(node, hello(replaced))
    response = cluster_admin_client.post(
        "/admin/cluster/node/", {"action": "accept_reported_gpus", "_selected_action": [node.pk]}
    )
    assert response.status_code == 302
    node.refresh_from_db()
    assert gpus_of(node) == replaced and node.reported_gpus == []
    assert node.state == "draining"
    assert AuditEntry.objects.filter(action="node.accept_gpus", object_id=str(node.pk)).count() == 1
    set_node_state(node, "uncordon", users["admin"])
    record_hello(node, hello(replaced))  # now the node's own
    node.refresh_from_db()
    assert node.state == "ready" and not AuditEntry.objects.filter(action="node.gpus.denied").count() > 1


def test_fewer_gpus_are_no_claim_and_a_new_enrollment_takes_the_hosts_gpus_afresh(users: Any) -> None:
    node = Node.objects.get(name=NODE)
    record_hello(node, hello(UUIDS))
    record_hello(node, hello({i: u for i, u in UUIDS.items() if i != 6}))
    node.refresh_from_db()
    assert node.state != "draining"
    assert not Gpu.objects.get(node=node, index=6).healthy  # gone from the agent's view

    _, raw = create_enrollment_token(users["admin"], node_name=NODE)
    enroll_node(raw, NODE)
    other_host = {i: f"GPU-other-host-{i}" for i in range(4)}
    record_hello(node, hello(other_host))
    node.refresh_from_db()
    assert node.state != "draining" and not AuditEntry.objects.filter(action="node.gpus.denied").exists()
    assert {i: u for i, u in gpus_of(node).items() if i < 4} == other_host


def test_a_new_nodes_first_hello_cannot_take_another_nodes_gpus(
    users: Any, cluster_admin_client: Any
) -> None:
    """An unbound enrollment token can never take over a registered node, and neither can the
    new node's first hello by reporting that node's GPU UUIDs: the UUID stays the other node's
    (its telemetry, desired sets and next hello unharmed), the new node is drained and the claim
    refused on it. Only an admin, accepting the reported GPUs, moves a UUID between nodes."""
    victim = Node.objects.get(name=NODE)
    record_hello(victim, hello(UUIDS))
    _, raw = create_enrollment_token(users["admin"])  # unbound
    intruder, _ = enroll_node(raw, "gpu-new")
    record_hello(intruder, hello({0: UUIDS[0], 1: "GPU-gpu-new-1"}))

    assert gpus_of(victim) == UUIDS
    assert gpus_of(intruder) == {1: "GPU-gpu-new-1"}  # its own card only
    intruder.refresh_from_db()
    assert intruder.state == "draining" and f"0 ({UUIDS[0]})" in intruder.state_reason
    refusal = AuditEntry.objects.get(action="node.gpus.denied")
    assert refusal.object_id == str(intruder.pk) and f"{UUIDS[0]} is node {NODE}'s" in refusal.detail

    record_hello(victim, hello(UUIDS))  # the victim's agent reconnects, unchanged
    victim.refresh_from_db()
    assert victim.state != "draining" and gpus_of(victim) == UUIDS
    assert AuditEntry.objects.filter(action="node.gpus.denied").count() == 1

    cluster_admin_client.post(
        "/admin/cluster/node/", {"action": "accept_reported_gpus", "_selected_action": [intruder.pk]}
    )
    assert gpus_of(intruder) == {0: UUIDS[0], 1: "GPU-gpu-new-1"}
    assert gpus_of(victim)[0].startswith("stale-")

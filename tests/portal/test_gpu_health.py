"""A failed GPU stays out of service until an admin returns it, whatever the agent says when it
restarts; every change of its health is kept in its history by UUID; an Xid whose recovery
needs a reboot drains the node, so its other jobs move away."""

from __future__ import annotations

from typing import Any

import pytest

from agents.protocol import GpuSample, Hello, utc_now
from portal.accounts.models import AuditEntry
from portal.cluster.models import Gpu, GpuHealthEvent, Node
from portal.cluster.services import accept_reported_gpus, record_gpu_health, record_hello
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from scheduler.tasks import run_cycle
from tests.portal.agentgw.test_agent_consumer import hello as agent_hello
from tests.portal.store_helpers import live_profile, run, submit

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "a100-node-1"


def hello(uuids: dict[int, str], unhealthy: dict[int, str] | None = None) -> Hello:
    return agent_hello(NODE, uuids, unhealthy)


def failure(gpu: Gpu, *xids: int) -> GpuSample:
    reason = f"xid {xids[0]}" if xids else "ecc uncorrected errors: 2"
    return GpuSample(
        gpu_uuid=gpu.uuid, time=utc_now(), healthy=False, health_reason=reason, xid_events=list(xids)
    )


def history(uuid: str) -> list[tuple[bool, str, str]]:
    return list(
        GpuHealthEvent.objects.filter(gpu_uuid=uuid).order_by("pk").values_list("healthy", "reason", "actor")
    )


def test_a_failed_gpu_stays_out_until_an_admin_returns_it(users: Any, cluster_admin_client: Any) -> None:
    node = Node.objects.get(name=NODE)
    uuids = {i: f"GPU-{NODE}-{i}" for i in range(8)}
    record_hello(node, hello(uuids))
    gpu = Gpu.objects.get(node=node, index=3)
    assert record_gpu_health(node, [failure(gpu)]) == [gpu.uuid]
    assert record_gpu_health(node, [failure(gpu)]) == []  # once

    record_hello(node, hello(uuids))  # the agent restarts and finds nothing wrong
    gpu.refresh_from_db()
    assert (gpu.healthy, gpu.health_reason) == (False, "ecc uncorrected errors: 2")
    assert history(gpu.uuid) == [(False, "ecc uncorrected errors: 2", f"agent {NODE}")]

    response = cluster_admin_client.post(
        "/admin/cluster/gpu/", {"action": "return_to_service", "_selected_action": [gpu.pk]}
    )
    assert response.status_code == 302
    gpu.refresh_from_db()
    assert (gpu.healthy, gpu.health_reason) == (True, "")
    assert history(gpu.uuid)[-1] == (True, "returned to service", "admin")
    assert AuditEntry.objects.filter(action="gpu.clear", object_id=str(gpu.pk)).count() == 1
    page = cluster_admin_client.get(f"/admin/cluster/gpu/{gpu.pk}/change/").content.decode()
    assert "unhealthy by agent a100-node-1: ecc uncorrected errors: 2" in page
    assert (
        "ecc uncorrected errors: 2"
        in cluster_admin_client.get("/admin/cluster/gpuhealthevent/").content.decode()
    )


def test_what_the_agent_reports_at_hello_is_recorded_and_a_new_card_starts_afresh(users: Any) -> None:
    node = Node.objects.get(name=NODE)
    uuids = {i: f"GPU-{NODE}-{i}" for i in range(8)}
    record_hello(node, hello(uuids, unhealthy={5: "xid 48: double-bit ECC error"}))
    assert history(uuids[5]) == [(False, "xid 48: double-bit ECC error", f"agent {NODE}")]
    record_hello(node, hello({i: u for i, u in uuids.items() if i != 7}))  # GPU 7 is gone
    assert history(uuids[7]) == [(False, "not reported by the agent", f"agent {NODE}")]
    assert len(history(uuids[5])) == 1  # still unhealthy, not recorded again

    record_hello(node, hello({**uuids, 5: "GPU-replacement"}))  # the card in slot 5 was replaced
    accept_reported_gpus(node, users["admin"])  # (tests/security/test_gpu_claims.py)
    slot_5, slot_7 = Gpu.objects.get(node=node, index=5), Gpu.objects.get(node=node, index=7)
    assert (slot_5.uuid, slot_5.healthy) == ("GPU-replacement", True)  # a new card starts afresh
    # Reported again, yet a card that vanished is an admin's to return, as one that failed.
    assert (slot_7.healthy, slot_7.health_reason) == (False, "not reported by the agent")


def test_an_xid_that_needs_a_reboot_drains_the_node_and_its_jobs_move(api_for: Any, paused_loop: Any) -> None:
    Node.objects.update(state="ready")
    alice = api_for("alice")
    first, second = submit(alice, "one", flavor="s-A100"), submit(alice, "two", flavor="s-A100")
    run_cycle(live_profile())
    for job_id in (first, second):
        run(job_id)
    gpu = Gpu.objects.filter(allocations__attempt__job_id=first).select_related("node").first()
    assert gpu is not None
    node = gpu.node
    assert Gpu.objects.filter(node=node, allocations__attempt__job_id=second).exists(), "bin-packed"

    record_gpu_health(node, [failure(gpu, 79)])
    node.refresh_from_db()
    assert node.state == "draining"
    assert node.state_reason == f"GPU {gpu.index} failed with xid 79: reboot the node, then clear the GPU"
    assert Job.objects.get(pk=first).state == JobState.PENDING  # its GPU failed: requeued at once
    run_cycle(live_profile())
    assert Job.objects.get(pk=second).state == JobState.CHECKPOINTING  # the drain moves it
    assert Job.objects.get(pk=second).events.filter(data__preemption="drain").exists()


def test_an_xid_the_gpu_recovers_from_leaves_the_node_alone(api_for: Any, paused_loop: Any) -> None:
    node = Node.objects.get(name=NODE)
    node.state = "ready"
    node.save()
    gpu = Gpu.objects.filter(node=node).first()
    assert gpu is not None
    record_gpu_health(node, [failure(gpu, 48)])
    node.refresh_from_db()
    assert node.state == "ready"

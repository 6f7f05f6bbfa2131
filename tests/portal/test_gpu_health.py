"""A failed GPU stays out of service until an admin returns it, whatever the agent says when it
restarts; every change of its health is kept in its history by UUID; an Xid whose recovery
needs a reboot drains the node, so its other jobs move away."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import transaction

from agents.protocol import GpuSample, Hello, utc_now
from portal.accounts.models import AuditEntry
from portal.cluster.models import Gpu, GpuHealthEvent, Node
from portal.cluster.services import accept_reported_gpus, record_gpu_health, record_hello
from portal.jobs.choices import JobState
from portal.jobs.models import Allocation, Job
from scheduler import core
from scheduler.store import apply_plan, load_snapshot
from scheduler.tasks import load_profile, run_cycle
from tests.portal.agentgw.test_agent_consumer import hello as agent_hello
from tests.portal.store_helpers import live_profile, placed_attempt, run, submit

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


@pytest.mark.parametrize("how", ["reported failed", "not reported"])
def test_a_gpu_that_fails_at_hello_loses_its_job(api_for: Any, paused_loop: Any, how: str) -> None:
    """An agent that restarts (its jobs' processes survive) and finds the job's GPU failed, or
    gone: the job is requeued as when the GPU fails while it runs."""
    node = Node.objects.get(name=NODE)
    uuids = {i: f"GPU-{NODE}-{i}" for i in range(8)}
    record_hello(node, hello(uuids))
    node, attempt = placed_attempt(api_for)
    run(attempt.job_id)
    index = Allocation.objects.filter(attempt=attempt).order_by("gpu__index").first().gpu.index

    if how == "reported failed":
        record_hello(node, hello(uuids, {index: "xid 79: fell off the bus"}))
        reason = "xid 79: fell off the bus"
    else:
        record_hello(node, hello({i: u for i, u in uuids.items() if i != index}))
        reason = "not reported by the agent"

    gpu = Gpu.objects.get(node=node, index=index)
    assert (gpu.healthy, gpu.health_reason) == (False, reason)
    job = Job.objects.get(pk=attempt.job_id)
    assert job.state == JobState.PENDING
    assert job.events.filter(to_state="lost", reason=f"GPU {gpu.uuid} on {NODE} failed: {reason}").exists()
    assert not Allocation.objects.filter(attempt=attempt, released_at__isnull=True).exists()
    # The agent's later samples change nothing more: the GPU was taken out once.
    assert record_gpu_health(node, [failure(gpu, 79)]) == []


def test_no_job_starts_on_a_gpu_that_failed_between_the_snapshot_and_the_plan(
    api_for: Any, paused_loop: Any
) -> None:
    Node.objects.exclude(name=NODE).update(state="cordoned")
    Node.objects.filter(name=NODE).update(state="ready")
    job_id = submit(api_for("alice"), "x", flavor="s-A100")
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        plan = core.decide(loaded.snapshot, load_profile(), now)
    [start] = plan.starts
    node = Node.objects.get(name=NODE)
    gpu = Gpu.objects.get(node=node, index=start.placement[0].gpu_indices[0])
    record_gpu_health(node, [failure(gpu)])  # commits meanwhile

    with transaction.atomic():
        assert apply_plan(plan, loaded, now)["started"] == 0
    assert Job.objects.get(pk=job_id).state == JobState.PENDING
    assert not Allocation.objects.exists()
    assert run_cycle()["started"] == 1  # the next cycle places it on a healthy GPU
    assert not Allocation.objects.filter(gpu=gpu).exists()

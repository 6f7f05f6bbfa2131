"""Time-slicing as the store applies it: a suspension parks the job's allocations so the job
taking its turn gets the GPUs, a resume takes them back, and a resume the plan puts elsewhere
becomes a checkpoint-and-restart, because a paused process cannot move."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from agents.protocol import ExitReason
from portal.agentgw.desired import desired_set_for
from portal.cluster.models import Node, Quota
from portal.jobs.models import Allocation, Job, JobAttempt
from scheduler import core
from scheduler.store import apply_plan, load_snapshot
from scheduler.tasks import run_cycle
from tests.integration.scripted_agents import ScriptedAgents
from tests.portal.store_helpers import LIVE_PROFILE, run, submit

pytestmark = pytest.mark.django_db(transaction=True)


def every_cycle_a_new_turn() -> core.Profile:
    """The tests' profile with a quantum of zero: every cycle, a waiting job takes a turn."""
    data = json.loads(LIVE_PROFILE.read_text())
    data["plugin_args"]["timeslice"]["quantum_s"] = 0
    return core.Profile.from_dict(data)


def state(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def gpus(job_id: int, suspended: bool) -> set[tuple[str, int]]:
    held = Allocation.objects.filter(attempt__job_id=job_id, released_at__isnull=True, suspended=suspended)
    return set(held.values_list("node__name", "gpu__index"))


@pytest.fixture
def two_running(api_for: Any, paused_loop: Any) -> tuple[Any, int, int]:
    """Vision's 16 A100 (8 guaranteed, 8 borrowed) taken by a time-sliceable and a plain job."""
    Node.objects.update(state="ready")
    alice = api_for("alice")
    sliced = submit(alice, "sliced", time_sliceable=True)
    plain = submit(alice, "plain")
    run_cycle(every_cycle_a_new_turn())
    run(sliced)
    run(plain)
    return alice, sliced, plain


def test_a_waiting_job_takes_the_turn_of_a_time_sliceable_one_and_gives_it_back(two_running) -> None:  # type: ignore[no-untyped-def]
    alice, sliced, plain = two_running
    sliced_gpus = gpus(sliced, suspended=False)
    waiting = submit(alice, "waiting", time_sliceable=True)
    result = run_cycle(every_cycle_a_new_turn())
    assert result is not None and result["suspended"] == 1

    assert state(sliced) == "suspended" and state(waiting) == "scheduled" and state(plain) == "running"
    assert gpus(sliced, suspended=True) == sliced_gpus == gpus(waiting, suspended=False)
    assert not gpus(sliced, suspended=False)
    assert JobAttempt.objects.get(job_id=sliced).state == "suspended"
    event = Job.objects.get(pk=sliced).events.get(to_state="suspended")
    assert event.data == {"time_slice": "suspend", "for_job": str(waiting)} and "time slice" in event.reason
    # The agent is told both: pause the one, run the other, on the same GPUs.
    node = Node.objects.get(name=next(iter(sliced_gpus))[0])
    desired = {a.job_id: a for a in desired_set_for(node).attempts}
    assert desired[str(sliced)].run_state == "suspended" and desired[str(waiting)].run_state == "running"
    assert desired[str(sliced)].time_sliced and str(plain) not in desired  # on the other node
    # The API shows the suspended job with why it waits.
    shown = alice.get(f"/api/v1/jobs/{sliced}/").json()
    assert shown["state"] == "suspended"

    run(waiting)
    result = run_cycle(every_cycle_a_new_turn())
    assert result is not None and result["resumed"] == 1 and result["suspended"] == 1
    assert state(sliced) == "running" and state(waiting) == "suspended"
    assert gpus(sliced, suspended=False) == sliced_gpus == gpus(waiting, suspended=True)
    attempt = JobAttempt.objects.get(job_id=sliced)  # the same attempt throughout
    assert attempt.state == "running" and attempt.resumed_at is not None
    assert state(plain) == "running"  # it did not opt in: never suspended
    assert not Job.objects.get(pk=plain).events.filter(to_state="suspended").exists()


def test_a_suspended_job_whose_gpus_are_taken_checkpoints_and_restarts_elsewhere(two_running) -> None:  # type: ignore[no-untyped-def]
    """The job that took its turn keeps its GPUs and others are free: a paused process cannot
    move, so the cycle has it checkpoint and stop, and it restarts there on a new attempt."""
    alice, sliced, plain = two_running
    waiting = submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(sliced) == "suspended"
    turn_gpus = gpus(waiting, suspended=False)
    freed = gpus(plain, suspended=False)
    alice.post(f"/api/v1/jobs/{plain}/cancel/")  # its GPUs are freed at once
    run(waiting)
    run_cycle(slow_turns())
    assert state(sliced) == "checkpointing"
    event = Job.objects.get(pk=sliced).events.get(to_state="checkpointing")
    assert event.data["preemption"] == "time-slice-move"
    assert gpus(waiting, suspended=False) == turn_gpus == gpus(sliced, suspended=True)
    ScriptedAgents().end(Job.objects.get(pk=sliced), ExitReason.CHECKPOINTED, 0)
    assert state(sliced) == "pending"
    run_cycle(slow_turns())
    assert state(sliced) == "scheduled" and gpus(sliced, suspended=False) == freed
    assert JobAttempt.objects.filter(job_id=sliced).count() == 2


def slow_turns() -> core.Profile:
    """The tests' profile with an hour-long quantum: no turn is due."""
    data = json.loads(LIVE_PROFILE.read_text())
    data["plugin_args"]["timeslice"]["quantum_s"] = 3600
    return core.Profile.from_dict(data)


def turn_applied_after(two_running: Any, change: Callable[[int], None]) -> tuple[dict[str, int], int]:
    """A job waits for the time-sliceable one's turn; the cycle plans the turn, `change(sliced)`
    happens before the plan is applied (the plan is then stale), and the plan is applied.
    Returns what apply_plan did and the waiting job."""
    alice, sliced, _ = two_running
    waiting = submit(alice, "waiting", time_sliceable=True)
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        plan = core.decide(loaded.snapshot, every_cycle_a_new_turn(), now)
        assert [s.job_id for s in plan.suspends] == [str(sliced)]
        change(sliced)
        return apply_plan(plan, loaded, now), waiting


def test_no_turn_is_taken_when_the_suspension_cannot_be_made(two_running) -> None:  # type: ignore[no-untyped-def]
    _, sliced, _ = two_running

    def job_ends(job_id: int) -> None:  # an agent's report: the plan was made on a stale view
        Job.objects.filter(pk=job_id).update(version=Job.objects.get(pk=job_id).version + 1)

    result, waiting = turn_applied_after(two_running, job_ends)
    assert result["suspended"] == 0 and result["started"] == 0
    assert state(waiting) == "pending" and not gpus(waiting, suspended=False)
    assert state(sliced) == "running" and not gpus(sliced, suspended=True)


def test_no_job_is_suspended_for_a_turn_that_cannot_start(two_running) -> None:  # type: ignore[no-untyped-def]
    """The node of the turn is cordoned after the snapshot: the start is dropped, and the job
    whose turn it was keeps running rather than sit parked with nobody on its GPUs."""
    _, sliced, _ = two_running

    def node_cordoned(job_id: int) -> None:
        node = next(iter(gpus(job_id, suspended=False)))[0]
        Node.objects.filter(name=node).update(state="cordoned")

    result, waiting = turn_applied_after(two_running, node_cordoned)
    assert result["suspended"] == 0 and result["started"] == 0
    assert state(waiting) == "pending" and state(sliced) == "running"
    assert not gpus(sliced, suspended=True)


def test_a_lost_node_requeues_a_suspended_job_like_a_running_one(two_running) -> None:  # type: ignore[no-untyped-def]
    from portal.jobs.services import requeue_jobs_of_lost_node

    alice, sliced, _ = two_running
    waiting = submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(sliced) == "suspended"
    node = Node.objects.get(name=next(iter(gpus(sliced, suspended=True)))[0])
    requeued = requeue_jobs_of_lost_node(node)
    assert sorted(requeued) == sorted([sliced, waiting])
    assert state(sliced) == "pending" and state(waiting) == "pending"
    assert not gpus(sliced, suspended=True) and not gpus(waiting, suspended=False)
    assert JobAttempt.objects.get(job_id=sliced).state == "lost"


def test_another_tenants_job_waits_until_a_job_suspended_on_its_gpus_has_left(two_running, api_for) -> None:  # type: ignore[no-untyped-def]
    """A suspended job's paused processes stay on its GPUs: when the cycle gives them to a job
    of another tenant (the suspended one cannot come back: its VC's quota was cut), that job
    waits while the suspended one checkpoints and leaves, and neither job's messages name the
    other. The cycle sees the leaving job holding the GPUs until its agent reports it gone."""
    alice, sliced, plain = two_running
    waiting = submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(sliced) == "suspended"
    parked_gpus = gpus(sliced, suspended=True)
    alice.post(f"/api/v1/jobs/{waiting}/cancel/")  # the job that took the turn ends
    assert not gpus(waiting, suspended=False)
    Quota.objects.filter(virtual_cluster__name="vision", gpu_model="A100").update(borrow_limit=0)
    carol = api_for("carol")
    other = submit(carol, "other-tenant", vc="speech")

    run_cycle(every_cycle_a_new_turn())
    assert state(other) == "pending" and not gpus(other, suspended=False)
    assert state(sliced) == "checkpointing" and gpus(sliced, suspended=True) == parked_gpus
    event = Job.objects.get(pk=sliced).events.get(to_state="checkpointing")
    assert event.data["preemption"] == "time-slice-evict" and "for_job" not in event.data
    shown = carol.get(f"/api/v1/jobs/{other}/").json()
    assert shown["pending_reason"] == "waiting-for-preemption"
    assert str(sliced) not in shown["pending_message"] and str(other) not in event.reason

    # Until it is gone, the cycle sees it holding those GPUs (charged to no quota).
    with transaction.atomic():
        leaving = next(j for j in load_snapshot(time.time()).snapshot.running if j.id == str(sliced))
    assert leaving.stopping and leaving.parked
    assert {(r.node, i) for r in leaving.placement for i in r.gpu_indices} == parked_gpus
    run_cycle(every_cycle_a_new_turn())
    assert state(other) == "pending" and not gpus(other, suspended=False)

    # Its agent reports the checkpoint written and the process gone: the GPUs go to the job
    # that waited for them, and the suspended job queues again.
    ScriptedAgents().end(Job.objects.get(pk=sliced), ExitReason.CHECKPOINTED, 0)
    assert state(sliced) == "pending" and not gpus(sliced, suspended=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(other) == "scheduled" and gpus(other, suspended=False) == parked_gpus
    assert state(plain) == "running"


def test_a_job_of_the_suspended_jobs_tenant_may_use_its_gpus(two_running) -> None:  # type: ignore[no-untyped-def]
    """Time-slicing shares GPUs within a tenant: a job of the suspended job's tenant may start
    on the GPUs it is parked on, and the suspended job is left parked."""
    alice, sliced, _ = two_running
    waiting = submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    parked_gpus = gpus(sliced, suspended=True)
    alice.post(f"/api/v1/jobs/{waiting}/cancel/")
    Quota.objects.filter(virtual_cluster__name="vision", gpu_model="A100").update(borrow_limit=0)
    node = next(iter(parked_gpus))[0]
    indices = tuple(sorted(i for _, i in parked_gpus))
    own = submit(alice, "same-tenant")
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        placement = (core.ReplicaPlacement(core.NodeName(node), indices),)
        plan = core.Plan(starts=(core.Start(core.JobId(str(own)), placement),))
        assert apply_plan(plan, loaded, now)["started"] == 1
    assert gpus(own, suspended=False) == parked_gpus
    assert state(sliced) == "suspended"


@pytest.mark.parametrize(
    ("reason", "exit_code", "ended"),
    [(ExitReason.SUCCEEDED, 0, "succeeded"), (ExitReason.FAILED, 1, "failed")],
)
def test_a_suspended_job_whose_program_ends_ends_as_a_running_one(  # type: ignore[no-untyped-def]
    two_running, reason, exit_code, ended
) -> None:
    """A frozen process may still end (it exited just as it was suspended, or was killed while
    frozen). The report used to raise (suspended -> succeeded was not in the table), which
    closed the agent's connection, and its hello replayed the same report on every reconnect.
    The parked allocations go with the attempt, so the GPUs hold only the job that took its turn."""
    alice, sliced, _ = two_running
    waiting = submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(sliced) == "suspended"
    turn_gpus = gpus(waiting, suspended=False)

    ScriptedAgents().end(Job.objects.get(pk=sliced), reason, exit_code)
    assert state(sliced) == ended
    attempt = JobAttempt.objects.get(job_id=sliced)
    assert (attempt.state, attempt.exit_code) == (ended, exit_code)
    assert not gpus(sliced, suspended=True) and not gpus(sliced, suspended=False)
    assert Job.objects.get(pk=sliced).events.filter(from_state="suspended", to_state=ended).exists()
    assert state(waiting) == "scheduled" and gpus(waiting, suspended=False) == turn_gpus


def test_a_gpu_sample_counts_for_the_job_using_it_not_the_one_suspended_on_it(two_running) -> None:  # type: ignore[no-untyped-def]
    """While two time-sliced jobs take turns on the same GPUs, each sample belongs to the job
    whose turn it is; it used to be stored for the suspended one as well (its allocation is
    parked, not released), doubling both jobs' utilization and energy history."""
    from django.utils import timezone

    from agents.protocol import GpuSample
    from portal.cluster.models import Gpu
    from portal.cluster.services import store_telemetry
    from portal.jobs.models import TelemetrySample

    alice, sliced, _ = two_running
    waiting = submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(sliced) == "suspended"
    node_name, index = sorted(gpus(waiting, suspended=False))[0]
    gpu = Gpu.objects.get(node__name=node_name, index=index)

    store_telemetry(
        [(gpu.node_id, [GpuSample(gpu_uuid=gpu.uuid, time=timezone.now(), utilization_pct=80.0)])]
    )
    stored = TelemetrySample.objects.filter(gpu_uuid=gpu.uuid)
    assert list(stored.values_list("attempt__job_id", flat=True)) == [waiting]

"""Time-slicing: jobs of one VC take turns on the same GPUs in quanta."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import Snap, profile

from scheduler.core import NodeName, Quota, ReasonCode, ReplicaPlacement, VcName, VirtualCluster, decide

SLICE = profile(
    queue_sort=["fifo"],
    admission=["vc_quota"],
    post_cycle=["timeslice"],
    plugin_args={"timeslice": {"quantum_s": 600, "suspend_cost_s": 12}},
)
ALL4 = (ReplicaPlacement(NodeName("n0"), (0, 1, 2, 3)),)


def busy_vc(**running_fields: object) -> Snap:
    fields = {"time_sliceable": True, **running_fields}
    return (
        Snap()
        .node("n0", 4)
        .vc("team", guaranteed=4)
        .vc("other", guaranteed=4)
        .running("r", [("n0", (0, 1, 2, 3))], started_at=0.0, **fields)
    )


def test_a_waiting_job_takes_the_gpus_when_the_quantum_is_up() -> None:
    snap = busy_vc().pending("w", 4, submitted_at=100.0, time_sliceable=True).build()
    early = decide(snap, SLICE, 300.0)
    assert early.suspends == () and early.starts == ()
    assert early.wake_at == 600.0, "a cycle is due when r's quantum ends"

    plan = decide(snap, SLICE, 700.0)
    assert [(s.job_id, s.for_job, s.cost_s) for s in plan.suspends] == [("r", "w", 12.0)]
    assert [(s.job_id, s.placement, s.resume) for s in plan.starts] == [("w", ALL4, False)]
    assert "time slice" in plan.suspends[0].message
    assert all(p.job_id != "w" for p in plan.pending)


def test_jobs_that_opt_out_are_never_suspended() -> None:
    snap = busy_vc(time_sliceable=False).pending("w", 4, submitted_at=100.0, time_sliceable=True).build()
    plan = decide(snap, SLICE, 5000.0)
    assert plan.suspends == () and plan.starts == ()
    waiting_but_opted_out = busy_vc().pending("w", 4, submitted_at=100.0).build()
    assert decide(waiting_but_opted_out, SLICE, 5000.0).suspends == ()


def test_only_jobs_of_the_same_vc_share_gpus_by_time() -> None:
    snap = busy_vc().pending("w", 4, vc="other", submitted_at=100.0, time_sliceable=True).build()
    assert decide(snap, SLICE, 5000.0).suspends == ()


def test_a_suspended_job_resumes_on_its_own_gpus_when_its_turn_comes() -> None:
    snap = (
        Snap()
        .node("n0", 4)
        .node("n1", 4)
        .vc("team", guaranteed=4)
        .running("w", [("n0", (0, 1, 2, 3))], started_at=700.0, time_sliceable=True)
        .running("x", [("n1", (0, 1, 2, 3))], vc="other", started_at=0.0)
        .pending("r", 4, submitted_at=0.0, time_sliceable=True, suspended_on=ALL4)
        .build()
    )
    assert decide(snap, SLICE, 1000.0).suspends == ()  # w's quantum is not up
    plan = decide(snap, SLICE, 1300.0)
    assert [(s.job_id, s.for_job) for s in plan.suspends] == [("w", "r")]
    assert [(s.job_id, s.placement, s.resume) for s in plan.starts] == [("r", ALL4, True)]


def test_a_suspended_job_goes_back_to_its_gpus_when_they_are_free() -> None:
    on_n1 = (ReplicaPlacement(NodeName("n1"), (0, 1, 2, 3)),)
    snap = Snap().node("n0", 4).node("n1", 4).pending("r", 4, time_sliceable=True, suspended_on=on_n1).build()
    plan = decide(snap, SLICE, 10.0)
    assert [(s.placement[0].node, s.resume) for s in plan.starts] == [("n1", True)]


def test_a_vc_above_its_cut_quota_does_not_hand_its_gpus_to_another_job() -> None:
    """A swap keeps the VC's usage, but after a quota cut that usage is above the limit: the
    waiting job would not be admitted, so it does not get the GPUs by a swap either."""
    snap = (
        Snap()
        .node("n0", 4)
        .vc("team", guaranteed=0)
        .running("r", [("n0", (0, 1, 2, 3))], started_at=0.0, time_sliceable=True)
        .pending("w", 4, submitted_at=100.0, time_sliceable=True)
        .build()
    )
    plan = decide(snap, SLICE, 5000.0)
    assert plan.suspends == () and plan.starts == ()
    [status] = plan.pending
    assert "VC team: 4 GPUs in use, 0 guaranteed and 4 borrowed" in status.message


def test_a_job_takes_turns_only_on_gpus_of_a_model_it_accepts() -> None:
    """Both wait for GPUs (the A100 node is busy); only the one that accepts V100 takes r's turn."""
    snap = (
        Snap()
        .node("n0", 4, model="V100")
        .node("n1", 4, model="A100")
        .vc("team", guaranteed=8)
        .vc("other", guaranteed=4)
        .running("r", [("n0", (0, 1, 2, 3))], started_at=0.0, time_sliceable=True)
        .running("x", [("n1", (0, 1, 2, 3))], vc="other", started_at=0.0)
        .pending("a100", 4, submitted_at=100.0, time_sliceable=True, gpu_model="A100")
        .pending("v100", 4, submitted_at=200.0, time_sliceable=True, gpu_model="V100")
        .build()
    )
    plan = decide(snap, SLICE, 5000.0)
    assert [(s.job_id, s.for_job) for s in plan.suspends] == [("r", "v100")]
    assert [s.job_id for s in plan.starts] == ["v100"]


def turn_on_two_models(first: str, asks: str) -> Snap:
    """r (VC team, whose quota the caller adds) runs on one GPU of each model, the replica on
    `first` listed first; x of another VC keeps the rest busy, so w (asking for `asks`, "" any
    model) waits for capacity."""
    replicas = [("a100", (0,)), ("v100", (0,))]
    if first == "v100":
        replicas.reverse()
    return (
        Snap()
        .node("a100", 2, model="A100")
        .node("v100", 2, model="V100")
        .vc("other", guaranteed=8)
        .running("r", replicas, started_at=0.0, time_sliceable=True)
        .running("x", [("a100", (1,)), ("v100", (1,))], vc="other", started_at=0.0)
        .pending("w", 1, replicas=2, submitted_at=100.0, time_sliceable=True, gpu_model=asks)
    )


@pytest.mark.parametrize(
    ("first", "asks", "swaps"),
    [
        pytest.param("a100", "A100", False, id="a100-first-a100-job-waits"),
        pytest.param("a100", "V100", False, id="a100-first-v100-job-waits"),
        pytest.param("a100", "", True, id="a100-first-any-model-job-takes-turn"),
        pytest.param("v100", "A100", False, id="v100-first-a100-job-waits"),
        pytest.param("v100", "V100", False, id="v100-first-v100-job-waits"),
        pytest.param("v100", "", True, id="v100-first-any-model-job-takes-turn"),
    ],
)
def test_a_turn_on_gpus_of_two_models_goes_only_to_a_job_that_accepts_both(
    first: str, asks: str, swaps: bool
) -> None:
    """Every GPU of the turn must be of a model the waiting job accepts, not just the first
    replica's (a snapshot can show a running job on GPUs of two models), whatever the order
    of the running job's replicas. `x` of another VC keeps the rest busy, so `w` waits for
    capacity. Fuzzer seed 20004 gave an A100 job a V100 this way."""
    plan = decide(turn_on_two_models(first, asks).vc("team", guaranteed=8).build(), SLICE, 5000.0)
    assert [(s.job_id, s.for_job) for s in plan.suspends] == ([("r", "w")] if swaps else [])
    assert [s.job_id for s in plan.starts] == (["w"] if swaps else [])


def test_a_turn_needs_cpu_and_memory_for_the_job_that_takes_it() -> None:
    """The running job leaves 16 of the node's 32 CPUs free: a job asking for 40 does not fit
    its turn, one asking for 32 does."""
    snap = (
        Snap()
        .node("n0", 4, cpu_milli=32_000, memory_mib=65_536)
        .vc("team", guaranteed=4)
        .running(
            "r", [("n0", (0, 1, 2, 3))], started_at=0.0, time_sliceable=True, cpu_milli_per_replica=16_000
        )
        .pending("big", 4, submitted_at=100.0, time_sliceable=True, cpu_milli_per_replica=40_000)
        .pending("fits", 4, submitted_at=200.0, time_sliceable=True, cpu_milli_per_replica=32_000)
        .build()
    )
    plan = decide(snap, SLICE, 5000.0)
    assert [(s.job_id, s.for_job) for s in plan.suspends] == [("r", "fits")]


def test_a_suspended_job_resumes_in_place_only_with_cpu_for_it() -> None:
    """Its GPUs are free, but while it was suspended another job took most of the node's CPUs:
    it is placed like any job instead (here: nowhere else fits, so it waits)."""
    snap = (
        Snap()
        .node("n0", 8, cpu_milli=32_000)
        .running("other", [("n0", (4, 5, 6, 7))], started_at=0.0, cpu_milli_per_replica=24_000)
        .pending("r", 4, time_sliceable=True, suspended_on=ALL4, cpu_milli_per_replica=16_000)
        .build()
    )
    plan = decide(snap, SLICE, 10.0)
    assert plan.starts == ()
    [status] = plan.pending
    assert status.job_id == "r"


def parked_on_n0(*, other_vc_job: str = "other") -> Snap:
    """r (VC team, suspended on all of n0) cannot come back: team's quota was cut to 0. A job
    of `other_vc_job`'s VC fits only on n0 (n1 is busy)."""
    return (
        Snap()
        .node("n0", 4)
        .node("n1", 4)
        .vc("team", guaranteed=0)
        .vc("other", guaranteed=8)
        .running("x", [("n1", (0, 1, 2, 3))], vc="other", started_at=0.0)
        .pending("r", 4, submitted_at=0.0, time_sliceable=True, suspended_on=ALL4)
    )


def test_a_job_of_another_tenant_waits_while_a_suspended_job_leaves_its_gpus() -> None:
    snap = parked_on_n0().pending("o", 2, vc="other", submitted_at=100.0).build()
    plan = decide(snap, SLICE, 5000.0)
    assert plan.starts == () and plan.suspends == ()
    [evict] = plan.preemptions
    assert (evict.job_id, evict.reason, evict.for_job) == ("r", "time-slice-evict", "o")
    assert "another tenant" in evict.message and "o" not in evict.message.split()
    status = {s.job_id: s for s in plan.pending}
    assert status["o"].reason is ReasonCode.WAITING_FOR_PREEMPTION
    assert status["o"].estimated_start == 5000.0 + evict.grace_period_s
    assert "r" not in status["o"].message.split()


def test_a_job_of_the_suspended_jobs_tenant_may_start_on_its_gpus() -> None:
    snap = parked_on_n0().pending("t", 2, vc="lab", submitted_at=100.0).build()
    lab = VirtualCluster(VcName("lab"), (Quota("*", 4, 0),), tenant="team")  # r's tenant
    plan = decide(replace(snap, vcs=(*snap.vcs, lab)), SLICE, 5000.0)
    assert [(s.job_id, s.placement[0].node) for s in plan.starts] == [("t", "n0")]
    assert plan.preemptions == ()


def test_a_leaving_parked_job_holds_its_gpus_but_no_quota() -> None:
    """The cycle after: r checkpoints on n0 (stopping, parked). o, first in line, does not get
    n0 meanwhile, not even by preemption (x cannot be preempted, and r is no one's victim: its
    GPUs are not charged to anyone); a job of r's VC is not charged for r's GPUs either."""
    snap = (
        Snap()
        .node("n0", 4)
        .node("n1", 4)
        .vc("team", guaranteed=2)
        .vc("other", guaranteed=8)
        .running("x", [("n1", (0, 1))], vc="other", started_at=0.0, preemptible=False)
        .running("r", [("n0", (0, 1, 2, 3))], started_at=0.0, stopping=True, parked=True)
        .pending("o", 4, vc="other", submitted_at=100.0, first_in_line=True, priority=1000)
        .pending("t", 2, submitted_at=200.0)
        .build()
    )
    with_priority = profile(
        queue_sort=["fifo"], admission=["vc_quota"], preemption=["priority"], post_cycle=["timeslice"]
    )
    plan = decide(snap, with_priority, 5000.0)
    on_n1 = (ReplicaPlacement(NodeName("n1"), (2, 3)),)
    assert [(s.job_id, s.placement) for s in plan.starts] == [("t", on_n1)]
    assert plan.preemptions == ()
    assert {s.job_id: s.reason for s in plan.pending}["o"] is not ReasonCode.WAITING_FOR_PREEMPTION


def test_a_suspended_job_that_cannot_resume_in_place_checkpoints_instead_of_moving() -> None:
    """w holds the GPUs r is parked on (its quantum is not up) and n1 is free: a paused process
    cannot move, so r is told to checkpoint and stop, and n1 stays free for others."""
    snap = (
        Snap()
        .node("n0", 4)
        .node("n1", 4)
        .vc("team", guaranteed=8)
        .running("w", [("n0", (0, 1, 2, 3))], started_at=900.0, time_sliceable=True)
        .pending("r", 4, submitted_at=0.0, time_sliceable=True, suspended_on=ALL4)
        .pending("later", 4, submitted_at=500.0)
        .build()
    )
    plan = decide(snap, SLICE, 1000.0)
    [move] = plan.preemptions
    assert (move.job_id, move.reason) == ("r", "time-slice-move")
    assert [(s.job_id, s.placement[0].node, s.resume) for s in plan.starts] == [("later", "n1", False)]
    assert {s.job_id: s.reason for s in plan.pending} == {"r": ReasonCode.QUEUED_BEHIND}


@pytest.mark.parametrize("first", ["a100", "v100"])
def test_a_turn_on_gpus_of_two_models_needs_quota_of_both(first: str) -> None:
    """Team's V100 quota was cut to 0 while r held a V100: an any-model job may take r's turn
    only if admission gives it GPUs of both models, not just of the model of r's first
    replica (the A100 quota alone would let it in)."""
    snap = turn_on_two_models(first, "").vc("team", guaranteed=2, model="A100").build()
    team = next(vc for vc in snap.vcs if vc.name == "team")
    cut = replace(team, quotas=(*team.quotas, Quota("V100", 0, 0, None)))
    snap = replace(snap, vcs=tuple(cut if vc.name == "team" else vc for vc in snap.vcs))
    plan = decide(snap, SLICE, 5000.0)
    assert plan.suspends == ()
    assert [s.job_id for s in plan.starts] == []

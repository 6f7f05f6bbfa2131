"""Draining a node moves its jobs away: each job with a replica there is told to checkpoint and
stop (whole gangs, preemptible or not), and it waits to start again elsewhere. A cordon only
keeps new work away."""

from __future__ import annotations

import pytest
from sched_builders import Snap, profile

from scheduler.core import NodeName, NodeState, ReasonCode, ReplicaPlacement, decide, load_profile

FIFO = profile(queue_sort=["fifo"], admission=["vc_quota"])  # no preemption plugin at all
PRIORITY = profile(queue_sort=["priority"], admission=["vc_quota"], preemption=["priority"])


@pytest.mark.parametrize(
    ("state", "moved"),
    [
        pytest.param(NodeState.DRAINING, ["gang", "pinned"], id="draining-moves-every-job"),
        pytest.param(NodeState.CORDONED, [], id="cordoned-keeps-its-jobs"),
        pytest.param(NodeState.READY, [], id="ready-keeps-its-jobs"),
    ],
)
@pytest.mark.parametrize(
    "rules", [FIFO, PRIORITY, load_profile("default")], ids=["fifo", "priority", "default"]
)
def test_jobs_on_a_draining_node_are_told_to_move(state: NodeState, moved: list[str], rules: object) -> None:
    snap = (
        Snap()
        .node("n0", 4, state=state)
        .node("n1", 4)
        .node("n2", 4)
        # A gang with one replica on n0; a job that may not be preempted, just started.
        .running("gang", [("n0", (0, 1)), ("n1", (0, 1))], started_at=0.0)
        .running("pinned", [("n0", (2, 3))], started_at=990.0, preemptible=False)
        .running("elsewhere", [("n2", (0, 1, 2, 3))], started_at=0.0)
        .build()
    )
    plan = decide(snap, rules, 1000.0)  # type: ignore[arg-type]
    drained = [p for p in plan.preemptions if p.reason == "drain"]
    assert sorted(p.job_id for p in drained) == moved
    assert len({p.job_id for p in plan.preemptions}) == len(plan.preemptions)
    for preemption in drained:
        assert preemption.for_job == ""
        assert preemption.message.startswith("node n0 is being drained")


def test_a_job_waiting_for_a_drained_gangs_gpus_preempts_no_one_again() -> None:
    """The gang's replica on n1 leaves with the rest of it: an urgent job of 2 GPUs waits for
    those (the drained job is already stopping), it does not preempt it a second time, and
    its estimate is the end of the grace period."""
    snap = (
        Snap()
        .node("n0", 4, state=NodeState.DRAINING)
        .node("n1", 2)
        .running("gang", [("n0", (0, 1)), ("n1", (0, 1))], started_at=0.0, priority=0)
        .pending("urgent", 2, submitted_at=900.0, priority=500)
        .build()
    )
    plan = decide(snap, PRIORITY, 1000.0)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("gang", "drain")]
    [status] = plan.pending
    assert status.reason is ReasonCode.WAITING_FOR_PREEMPTION
    grace = PRIORITY.cycle.grace_period_s
    assert status.estimated_start == 1000.0 + grace


def test_new_work_goes_elsewhere_and_moved_jobs_come_back_there() -> None:
    """The job told to leave n0 in one cycle is pending in the next: it starts on n1, never n0."""
    snap = (
        Snap()
        .node("n0", 4, state=NodeState.DRAINING)
        .node("n1", 4)
        .pending("moved", 4, submitted_at=0.0)
        .build()
    )
    plan = decide(snap, FIFO, 1000.0)
    assert [(s.job_id, s.placement[0].node) for s in plan.starts] == [("moved", "n1")]


def test_a_suspended_job_parked_on_a_draining_node_leaves_it() -> None:
    on_n0 = (ReplicaPlacement(NodeName("n0"), (0, 1, 2, 3)),)
    slicing = profile(queue_sort=["fifo"], admission=["vc_quota"], post_cycle=["timeslice"])
    snap = (
        Snap()
        .node("n0", 4, state=NodeState.DRAINING)
        .node("n1", 4)
        .running("busy", [("n1", (0, 1, 2, 3))], started_at=0.0)
        .pending("parked", 4, time_sliceable=True, suspended_on=on_n0)
        .build()
    )
    plan = decide(snap, slicing, 1000.0)
    assert plan.starts == ()
    assert [(p.job_id, p.reason, p.for_job) for p in plan.preemptions] == [("parked", "drain", "")]
    [status] = plan.pending
    assert status.message.startswith("node n0 is being drained: the job checkpoints and stops")


def stopped_vc(policy: str) -> Snap:
    return (
        Snap()
        .node("n0", 4)
        .node("n1", 4)
        .vc("team", 8, stop_policy=policy)
        .vc("other", 8)
        .running("pinned", [("n0", (0, 1))], vc="team", preemptible=False)
        .running("theirs", [("n0", (2, 3))], vc="other")
        .pending("waits", 2, vc="team", submitted_at=0.0)
        .pending("starts", 2, vc="other", submitted_at=1.0)
    )


@pytest.mark.parametrize(
    ("policy", "moved"),
    [("", []), ("hold", []), ("hold-and-drain", ["pinned"])],
    ids=["open", "hold", "hold-and-drain"],
)
def test_a_stopped_vc_starts_nothing_and_a_drain_empties_it(policy: str, moved: list[str]) -> None:
    """Kueue's stopPolicy: a held VC's jobs wait (the other VC's start), a drained one's running
    jobs checkpoint and stop too, preemptible or not."""
    plan = decide(stopped_vc(policy).build(), PRIORITY, 1000.0)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [(j, "vc-drain") for j in moved]
    started = sorted(s.job_id for s in plan.starts)
    assert started == (["starts"] if policy else ["starts", "waits"])
    if policy:
        [status] = plan.pending
        assert (status.job_id, status.reason, status.estimated_start) == (
            "waits",
            ReasonCode.VC_STOPPED,
            None,
        )
        assert (
            status.message
            == "VC team was stopped by an admin: none of its jobs starts until it is open again"
        )


@pytest.mark.parametrize("policy", ["", "hold"])
def test_a_vc_whose_budget_is_spent_starts_nothing_and_an_admins_stop_is_named_first(policy: str) -> None:
    """A spent budget holds the VC's jobs as a stop does (the other VC's start, its running
    jobs go on); where an admin stopped the VC too, that is the reason given."""
    spent = "VC team has used 12 of its 10 GPU-hours for November (UTC)"
    snapshot = (
        Snap()
        .node("n0", 4)
        .node("n1", 4)
        .vc("team", 8, stop_policy=policy, budget_message=spent)
        .vc("other", 8)
        .running("pinned", [("n0", (0, 1))], vc="team")
        .pending("waits", 2, vc="team", submitted_at=0.0)
        .pending("starts", 2, vc="other", submitted_at=1.0)
        .build()
    )
    plan = decide(snapshot, PRIORITY, 1000.0)
    assert plan.preemptions == ()
    assert [s.job_id for s in plan.starts] == ["starts"]
    [status] = plan.pending
    assert (status.job_id, status.estimated_start) == ("waits", None)
    if policy:
        assert status.reason is ReasonCode.VC_STOPPED
    else:
        assert (status.reason, status.message) == (ReasonCode.BUDGET_SPENT, spent)

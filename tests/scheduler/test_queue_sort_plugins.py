"""Table tests for the queue-sort plugins, through the cycle's own ordering step."""

from __future__ import annotations

import pytest
from sched_builders import Snap, profile

from scheduler.core import decide
from scheduler.core.cycle import queue_positions
from scheduler.core.framework import CycleContext
from scheduler.core.state import build_state


def queue_ids(snap: Snap, now: float = 1000.0, **plugins: object) -> list[str]:
    p = profile(**plugins)
    snapshot = snap.build()
    state, _ = build_state(snapshot)
    ctx = CycleContext(snapshot, now, state, {j.id: j for j in snapshot.running}, {})
    built = p.build()
    for plugin in built.by_name.values():
        prepare = getattr(plugin, "prepare", None)
        if prepare:
            prepare(ctx)
    return [snapshot.pending[i].id for i in queue_positions(snapshot.pending, built, ctx, p)]


CASES = [
    pytest.param(
        Snap().node("n0").pending("late", submitted_at=20).pending("early", submitted_at=10),
        {"queue_sort": ["fifo"]},
        ["early", "late"],
        id="fifo-by-submission",
    ),
    pytest.param(
        Snap()
        .node("n0")
        .pending("dev", submitted_at=1, priority=100)
        .pending("prod", submitted_at=5, priority=1000),
        {"queue_sort": ["priority", "fifo"]},
        ["prod", "dev"],
        id="priority-class-before-arrival",
    ),
    pytest.param(
        Snap()
        .node("n0")
        .pending("served", submitted_at=1, attained_gpu_s=7200)
        .pending("fresh", submitted_at=5)
        .pending("a-little", submitted_at=2, attained_gpu_s=100),
        {"queue_sort": ["las", "fifo"], "plugin_args": {"las": {"thresholds": [3600]}}},
        ["a-little", "fresh", "served"],
        id="las-queue-0-before-queue-1-fifo-inside",
    ),
    pytest.param(
        Snap()
        .node("n0")
        .pending("wide", gpus_=8, submitted_at=1, attained_gpu_s=8 * 600)
        .pending("narrow", gpus_=1, submitted_at=2, attained_gpu_s=600),
        {
            "queue_sort": ["las", "fifo"],
            "plugin_args": {"las": {"thresholds": [1000], "service": "gpu_time"}},
        },
        ["narrow", "wide"],
        id="las-2d-counts-gpu-time",
    ),
    pytest.param(
        Snap()
        .node("n0")
        .pending("wide", gpus_=8, submitted_at=1, attained_gpu_s=8 * 600)
        .pending("narrow", gpus_=1, submitted_at=2, attained_gpu_s=600),
        {"queue_sort": ["las", "fifo"], "plugin_args": {"las": {"thresholds": [1000], "service": "time"}}},
        ["wide", "narrow"],
        id="las-time-ignores-width",
    ),
    pytest.param(
        Snap()
        .node("n0")
        .pending("starved", submitted_at=0, attained_gpu_s=100, queued_at=0)
        .pending("fresh", submitted_at=900),
        {
            "queue_sort": ["las", "fifo"],
            "plugin_args": {"las": {"thresholds": [50], "starvation_factor": 5}},
        },
        ["starved", "fresh"],
        id="las-starvation-guard-promotes",
    ),
    pytest.param(
        Snap()
        .node("n0")
        .pending("long", submitted_at=1, estimated_runtime_s=9000)
        .pending("short", submitted_at=2, estimated_runtime_s=60)
        .pending("unknown", submitted_at=0),
        {"queue_sort": ["sef", "fifo"], "plugin_args": {"sef": {"default_runtime_s": 3600}}},
        ["short", "unknown", "long"],
        id="sef-uses-estimates-then-default",
    ),
    pytest.param(
        Snap()
        .node("n0")
        .running("r", [("n0", (0, 1, 2, 3))], user="alice")
        .pending("alice-2", submitted_at=1, user="alice")
        .pending("bob-1", submitted_at=2, user="bob")
        .pending("bob-2", submitted_at=3, user="bob"),
        {"queue_sort": ["drf", "fifo"]},
        ["bob-1", "bob-2", "alice-2"],
        id="drf-user-with-less-goes-first",
    ),
]


@pytest.mark.parametrize(("snap", "plugins", "expected"), CASES)
def test_queue_order(snap: Snap, plugins: dict[str, object], expected: list[str]) -> None:
    assert queue_ids(snap, **plugins) == expected


def test_vc_queueing_policy_reorders_only_inside_its_own_slots() -> None:
    snap = (
        Snap()
        .node("n0", 1)
        .vc("fifo-team", 8)
        .vc("sef-team", 8, queueing_policy="sef")
        .pending("s-long", vc="sef-team", submitted_at=1, estimated_runtime_s=5000)
        .pending("f-1", vc="fifo-team", submitted_at=2)
        .pending("s-short", vc="sef-team", submitted_at=3, estimated_runtime_s=10)
        .pending("f-2", vc="fifo-team", submitted_at=4)
    )
    assert queue_ids(snap, queue_sort=["fifo"]) == ["s-short", "f-1", "s-long", "f-2"]


def test_a_vc_policy_over_the_whole_queue_orders_the_jobs_in_queue_order() -> None:
    """Every pending job is the VC's, and the profile's order differs from the snapshot's: the
    VC's policy must rank the jobs standing in the queue, not the snapshot's list."""
    snap = (
        Snap()
        .node("n0", 1)
        .vc("sef-team", 8, queueing_policy="sef")
        .pending("a", vc="sef-team", submitted_at=1, estimated_runtime_s=300)
        .pending("b", vc="sef-team", submitted_at=2, estimated_runtime_s=100)
        .pending("c", vc="sef-team", submitted_at=3, estimated_runtime_s=200, priority=100)
    )
    # Priority first (c); inside a class shortest expected first (b before a).
    assert queue_ids(snap, queue_sort=["priority", "fifo"]) == ["c", "b", "a"]


def test_las_asks_for_a_cycle_when_a_running_job_crosses_a_threshold() -> None:
    snap = (
        Snap()
        .node("n0", 2)
        .running("r", [("n0", (0, 1))], attained_gpu_s=1000)
        .pending("p", gpus_=2, submitted_at=0)
    )
    p = profile(queue_sort=["las"], post_cycle=["las"], plugin_args={"las": {"thresholds": [3000]}})
    plan = decide(snap.build(), p, now=100.0)
    # 2000 GPU-seconds to go at 2 GPUs: 1000 s from now.
    assert plan.wake_at == pytest.approx(1100.0)


def test_las_can_order_by_service_inside_a_queue() -> None:
    snap = (
        Snap()
        .node("n0")
        .pending("early-more", submitted_at=1, attained_gpu_s=500)
        .pending("late-less", submitted_at=2, attained_gpu_s=100)
    )
    by_arrival = {"queue_sort": ["las"], "plugin_args": {"las": {"thresholds": [3600]}}}
    by_service = {
        "queue_sort": ["las"],
        "plugin_args": {"las": {"thresholds": [3600], "order_in_queue": "service"}},
    }
    assert queue_ids(snap, **by_arrival) == ["early-more", "late-less"]
    assert queue_ids(snap, **by_service) == ["late-less", "early-more"]


def test_guarantee_first_puts_borrowing_work_last() -> None:
    snap = (
        Snap()
        .node("n0", 8)
        .vc("owner", 4, borrow=4)
        .vc("lender", 4, borrow=4)
        .running("owner-running", [("n0", (0, 1, 2))], vc="owner")
        .pending("owner-borrows", 2, vc="owner", submitted_at=1)  # 3 + 2 > 4: would borrow
        .pending("lender-own", 4, vc="lender", submitted_at=2)  # inside lender's guarantee
        .pending("owner-fits", 1, vc="owner", submitted_at=3)  # 3 + 1 = 4: inside
    )
    assert queue_ids(snap, queue_sort=["guarantee_first", "fifo"]) == [
        "lender-own",
        "owner-fits",
        "owner-borrows",
    ]


def test_guarantee_first_leaves_vcs_without_borrowing_alone() -> None:
    # With 4 of 8 in use, "big" would not fit the guarantee; a VC that cannot borrow keeps
    # its order anyway (only admission decides for it).
    snap = (
        Snap()
        .node("n0", 16)
        .vc("solo", 8)
        .running("r", [("n0", (0, 1, 2, 3))], vc="solo")
        .pending("big", 8, vc="solo", submitted_at=1)
        .pending("small", 1, vc="solo", submitted_at=2)
    )
    assert queue_ids(snap, queue_sort=["guarantee_first", "fifo"]) == ["big", "small"]
    lending = Snap().node("n0", 16).vc("solo", 8, borrow=8).running("r", [("n0", (0, 1, 2, 3))], vc="solo")
    lending.pending("big", 8, vc="solo", submitted_at=1).pending("small", 1, vc="solo", submitted_at=2)
    assert queue_ids(lending, queue_sort=["guarantee_first", "fifo"]) == ["small", "big"]


def test_las_does_not_wake_for_a_crossing_that_changes_nothing() -> None:
    # The waiting job is already in queue 1; the running job crossing from queue 0 into
    # queue 1 does not let it preempt, so no cycle is needed for that.
    snap = (
        Snap()
        .node("n0", 2)
        .running("r", [("n0", (0, 1))], attained_gpu_s=1000)
        .pending("p", gpus_=2, submitted_at=0, attained_gpu_s=5000)
    )
    p = profile(queue_sort=["las"], post_cycle=["las"], plugin_args={"las": {"thresholds": [3000]}})
    assert decide(snap.build(), p, now=100.0).wake_at is None


def test_a_vc_policy_never_puts_a_lower_priority_class_first() -> None:
    """A requeued dev job submitted earlier must not pass the production job it was preempted
    for, whatever the VC's own policy (FIFO here) would say."""
    snap = (
        Snap()
        .node("n0")
        .vc("team", 8, queueing_policy="fifo")
        .pending("dev-requeued", vc="team", submitted_at=1, priority=100)
        .pending("prod", vc="team", submitted_at=5, priority=1000)
        .pending("dev-late", vc="team", submitted_at=9, priority=100)
    )
    assert queue_ids(snap, queue_sort=["priority", "fifo"]) == ["prod", "dev-requeued", "dev-late"]


@pytest.mark.parametrize(
    ("pending_service", "running_service", "preempt_levels", "preempts", "wake_at"),
    [
        # Thresholds 1000 and 4000 GPU-s: queues 0 (< 1000), 1 (< 4000) and 2. One GPU each.
        pytest.param(0, 2000, 1, True, None, id="one-queue-apart-preempts-by-default"),
        pytest.param(0, 2000, 2, False, 100.0 + 2000.0, id="one-queue-apart-waits-for-queue-2"),
        pytest.param(0, 5000, 2, True, None, id="two-queues-apart-preempts"),
        pytest.param(2000, 5000, 2, False, None, id="queue-1-never-preempts-with-two-levels"),
        pytest.param(0, 500, 2, False, 100.0 + 3500.0, id="wakes-only-for-the-crossing-that-matters"),
    ],
)
def test_las_preempt_levels(
    pending_service: float, running_service: float, preempt_levels: int, preempts: bool, wake_at: float | None
) -> None:
    snap = (
        Snap()
        .node("n0", 1)
        .running("r", [("n0", (0,))], attained_gpu_s=running_service)
        .pending("p", gpus_=1, submitted_at=0, attained_gpu_s=pending_service)
    )
    las = {"thresholds": [1000, 4000], "preempt_levels": preempt_levels}
    p = profile(queue_sort=["las"], preemption=["las"], post_cycle=["las"], plugin_args={"las": las})
    plan = decide(snap.build(), p, now=100.0)
    assert [pr.job_id for pr in plan.preemptions] == (["r"] if preempts else [])
    if not preempts:
        assert plan.wake_at == (None if wake_at is None else pytest.approx(wake_at))
        (status,) = plan.pending
        # The estimate is no later than the wake, when the running job would yield (in these
        # cases it is earlier: the running job is expected to end before it yields).
        if wake_at is not None:
            assert status.estimated_start == pytest.approx(min(wake_at, status.estimated_start))


def test_las_preempt_levels_must_be_positive() -> None:
    with pytest.raises(ValueError, match="preempt_levels"):
        profile(queue_sort=["las"], plugin_args={"las": {"thresholds": [1000], "preempt_levels": 0}})


@pytest.mark.parametrize("name", ["fifo", "tiresias"])
def test_shipped_profiles_start_the_owners_job_before_an_older_borrower(name: str) -> None:
    # Started first, the borrower would take the owner's last free GPUs and be reclaimed a
    # cycle later: a preemption and a grace period for nothing, again and again under load.
    from scheduler.core import load_profile

    snap = (
        Snap()
        .node("n0", 8)
        .vc("owner", 4, borrow=4)
        .vc("lender", 4, borrow=4)
        .running("owner-running", [("n0", (0, 1, 2, 3))], vc="owner", started_at=0)
        .pending("owner-borrows", 4, vc="owner", submitted_at=10)
        .pending("lender-own", 4, vc="lender", submitted_at=20)
    )
    plan = decide(snap.build(), load_profile(name), now=1000.0)
    assert [s.job_id for s in plan.starts] == ["lender-own"]
    assert not plan.preemptions


@pytest.mark.parametrize(
    ("policy", "preempts"),
    [
        pytest.param("", True, id="no-policy-of-its-own-the-profile-las-preempts"),
        pytest.param("las", True, id="las-vc-preempts-by-its-own-rule"),
        pytest.param("fifo", False, id="fifo-vc-never-lets-a-newer-job-preempt"),
        pytest.param("sef", False, id="shortest-first-vc-never-preempts"),
    ],
)
def test_inside_a_vc_with_its_own_policy_only_that_policy_preempts(policy: str, preempts: bool) -> None:
    """A VC set to FIFO keeps an older running job of its own from being preempted for a newer
    one of the same class by the profile's LAS, and its estimate says so; a job of another VC
    still borrows under the profile's rules, and a higher class still preempts."""
    snap = (
        Snap()
        .node("n0", 1)
        .vc("team", 1, queueing_policy=policy)
        .running("old", [("n0", (0,))], vc="team", attained_gpu_s=2000, estimated_runtime_s=3000)
        .pending("new", vc="team", submitted_at=50)
    )
    las = {"thresholds": [1000]}
    p = profile(queue_sort=["las", "fifo"], preemption=["priority", "las"], plugin_args={"las": las})
    plan = decide(snap.build(), p, now=100.0)
    assert [pr.job_id for pr in plan.preemptions] == (["old"] if preempts else [])
    if not preempts:
        # It waits for the running job's expected end (3,000 s expected, 2,000 run on its one
        # GPU: 1,000 s from now), not for a preemption now.
        (status,) = plan.pending
        assert status.estimated_start == pytest.approx(1100.0)

    urgent = Snap().node("n0", 1).vc("team", 1, queueing_policy=policy)
    urgent.running("old", [("n0", (0,))], vc="team", attained_gpu_s=2000, priority=100)
    urgent.pending("prod", vc="team", submitted_at=50, priority=1000)
    assert [pr.job_id for pr in decide(urgent.build(), p, now=100.0).preemptions] == ["old"]


def test_an_owner_moves_their_own_job_to_the_front_of_their_jobs_only() -> None:
    """Like Slurm's `scontrol top`: alice's moved jobs go first among her jobs of one VC and
    class, the latest moved first, in the places her jobs held; bob's job keeps its place, and
    her job of another class does not move."""
    snap = (
        Snap()
        .node("n0", 1)
        .pending("a-1", user="alice", submitted_at=1)
        .pending("b-1", user="bob", submitted_at=2)
        .pending("a-2", user="alice", submitted_at=3, topped_at=0.0)
        .pending("a-3", user="alice", submitted_at=4)
        .pending("a-4", user="alice", submitted_at=5, topped_at=50.0)
        .pending("a-dev", user="alice", submitted_at=6, priority=-1, topped_at=60.0)
    )
    assert queue_ids(snap, queue_sort=["priority", "fifo"]) == ["a-4", "b-1", "a-2", "a-1", "a-3", "a-dev"]
    plan = decide(snap.build(), profile(queue_sort=["priority", "fifo"]), now=100.0)
    assert [start.job_id for start in plan.starts] == ["a-4"]

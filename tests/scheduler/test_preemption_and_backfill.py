"""Table tests for preemption (priority, reclaim, LAS) and backfill behind a reservation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import Snap, profile

from scheduler.core import Plan, Quota, ReasonCode, Snapshot, VcName, VirtualCluster, decide, load_profile
from scheduler.core.plugins.backfill import running_end

PREEMPT = profile(
    queue_sort=["priority", "las", "fifo"],
    admission=["vc_quota"],
    preemption=["priority", "reclaim", "las"],
    plugin_args={"las": {"thresholds": [3600]}},
    cycle={"grace_period_s": 45, "min_runtime_s": 600},
)


def full_node() -> Snap:
    return Snap().node("n0", 8)


CASES = [
    pytest.param(
        full_node()
        .running("dev", [("n0", tuple(range(8)))], priority=100, started_at=0)
        .pending("prod", 8, priority=1000, submitted_at=5000),
        {"dev"},
        "priority",
        id="higher-priority-preempts-lower",
    ),
    pytest.param(
        full_node()
        .running("prod", [("n0", tuple(range(8)))], priority=1000, started_at=0)
        .pending("dev", 8, priority=100, submitted_at=5000),
        set(),
        None,
        id="lower-priority-never-preempts-higher",
    ),
    pytest.param(
        full_node()
        .running("dev", [("n0", tuple(range(8)))], priority=100, started_at=4800)
        .pending("prod", 8, priority=1000, submitted_at=5000),
        set(),
        None,
        id="minimum-runtime-protects-a-young-job",
    ),
    pytest.param(
        full_node()
        .running("dev", [("n0", tuple(range(8)))], priority=100, preemptible=False)
        .pending("prod", 8, priority=1000, submitted_at=5000),
        set(),
        None,
        id="non-preemptible-is-never-a-victim",
    ),
    pytest.param(
        full_node()
        .running("old", [("n0", tuple(range(8)))], attained_gpu_s=8 * 4000)
        .pending("new", 4, submitted_at=5000),
        {"old"},
        "las",
        id="las-demotes-the-job-with-more-service",
    ),
    pytest.param(
        full_node()
        .running("young", [("n0", tuple(range(8)))], attained_gpu_s=1000)
        .pending("new", 4, submitted_at=5000),
        set(),
        None,
        id="las-same-queue-does-not-preempt",
    ),
    pytest.param(
        full_node()
        .running("cheap", [("n0", (0, 1, 2, 3))], priority=100, last_checkpoint_at=4900)
        .running("costly", [("n0", (4, 5, 6, 7))], priority=100, last_checkpoint_at=1000)
        .pending("prod", 4, priority=1000, submitted_at=5000),
        {"cheap"},
        "priority",
        id="victim-loses-least-work-since-checkpoint",
    ),
    pytest.param(
        Snap()
        .node("n0", 8)
        .node("n1", 8)
        .running("gang", [("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3))], priority=100)
        .running("fill0", [("n0", (4, 5, 6, 7))], priority=1000)
        .running("fill1", [("n1", (4, 5, 6, 7))], priority=1000)
        .pending("prod", 4, priority=1000, submitted_at=5000),
        {"gang"},
        "priority",
        id="whole-gang-is-preempted",
    ),
]


@pytest.mark.parametrize(("snap", "victims", "reason"), CASES)
def test_preemption(snap: Snap, victims: set[str], reason: str | None) -> None:
    plan = decide(snap.build(), PREEMPT, now=5000.0)
    assert {p.job_id for p in plan.preemptions} == victims
    if victims:
        assert {p.reason for p in plan.preemptions} == {reason}
        assert all(p.grace_period_s == 45 for p in plan.preemptions)
        (waiting,) = plan.pending
        assert waiting.reason is ReasonCode.WAITING_FOR_PREEMPTION
        assert waiting.estimated_start == pytest.approx(5045.0)
    assert not plan.starts


def test_reclaim_takes_back_only_borrowed_work() -> None:
    snap = (
        Snap()
        .node("n0", 8)
        .vc("vision", 4)
        .vc("speech", 4, borrow=4)
        .running("speech-own", [("n0", (0, 1, 2, 3))], vc="speech", started_at=0)
        .running("speech-borrowed", [("n0", (4, 5, 6, 7))], vc="speech", started_at=100)
        .pending("vision-job", 4, vc="vision", submitted_at=5000)
    )
    plan = decide(snap.build(), PREEMPT, now=5000.0)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("speech-borrowed", "reclaim")]
    assert "reclaims its guaranteed GPUs" in plan.preemptions[0].message
    # The victim's owner (tenant speech) does not learn of vision's job or VC.
    message = plan.preemptions[0].message
    assert "vision" not in message and "another tenant's VC" in message
    assert "a job of another tenant" in message


def test_a_victim_learns_the_job_it_was_preempted_for_only_within_its_tenant() -> None:
    def plan_for(tenant: str) -> Plan:
        snap = (
            Snap()
            .node("n0", 4)
            .vc("lender", 4)
            .vc("borrower", 0, borrow=4)
            .running("victim", [("n0", (0, 1, 2, 3))], vc="borrower", started_at=0)
            .pending("urgent", 4, vc="lender", submitted_at=5000)
            .build()
        )
        vcs = tuple(replace(vc, tenant=tenant or vc.name) for vc in snap.vcs)
        return decide(replace(snap, vcs=vcs), PREEMPT, now=5000.0)

    shared = plan_for("one-tenant")  # two VCs of one tenant
    message = shared.preemptions[0].message
    assert message.startswith("VC lender reclaims its guaranteed GPUs") and "(job urgent)" in message
    other = plan_for("")  # each VC its own tenant
    message = other.preemptions[0].message
    assert message.startswith("another tenant's VC reclaims its guaranteed GPUs from borrowed work")
    assert "urgent" not in message and "lender" not in message
    # Nor does the waiting job's tenant learn how many of the other tenant's jobs run there.
    (waiting,) = shared.pending
    assert waiting.message == "waiting for 1 job(s) to release 4 A100 (1 preempted now, grace 45 s)"
    (waiting,) = other.pending
    assert waiting.message == "waiting for running jobs to release 4 A100 (preempted or stopping, grace 45 s)"


def test_no_reclaim_beyond_the_guarantee() -> None:
    snap = (
        Snap()
        .node("n0", 8)
        .vc("vision", 2, borrow=8)
        .vc("speech", 4, borrow=4)
        .running("speech-own", [("n0", (0, 1, 2, 3))], vc="speech", started_at=0)
        .running("speech-borrowed", [("n0", (4, 5, 6, 7))], vc="speech", started_at=100)
        .pending("vision-job", 4, vc="vision", submitted_at=5000)
    )
    plan = decide(snap.build(), PREEMPT, now=5000.0)
    assert not plan.preemptions  # 4 GPUs would exceed vision's guarantee of 2: it may only borrow


def test_stopping_jobs_are_counted_not_preempted_again() -> None:
    snap = (
        full_node()
        .running("dev", [("n0", tuple(range(8)))], priority=100, stopping=True)
        .pending("prod", 8, priority=1000, submitted_at=5000)
    )
    plan = decide(snap.build(), PREEMPT, now=5000.0)
    assert not plan.preemptions
    assert plan.pending[0].reason is ReasonCode.WAITING_FOR_PREEMPTION


BACKFILL = profile(queue_sort=["fifo"], backfill="backfill")


@pytest.mark.parametrize(
    ("limit", "gpus", "starts"),
    [
        pytest.param(500.0, 2, True, id="short-job-ends-before-the-reservation"),
        pytest.param(5000.0, 2, False, id="long-job-would-delay-the-reservation"),
        pytest.param(5000.0, 1, True, id="long-job-fits-in-the-spare-gpus"),
    ],
)
def test_backfill(limit: float, gpus: int, starts: bool) -> None:
    # 9 GPUs, 3 free now; a 6-GPU job runs until its time limit at t=1000. The 8-GPU head job
    # is reserved for t=1000, when 9 GPUs are free: 1 spare GPU for long jobs that start now.
    snap = (
        Snap()
        .node("n0", 8)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5))], time_limit_s=1000.0)
        .node("n1", 1)
        .pending("head", 8, submitted_at=1)
        .pending("later", gpus, submitted_at=2, time_limit_s=limit)
    )
    plan = decide(snap.build(), BACKFILL, now=0.0)
    assert plan.reservation == "head"
    assert ("later" in {s.job_id for s in plan.starts}) is starts
    if not starts:
        later = next(p for p in plan.pending if p.job_id == "later")
        assert later.reason is ReasonCode.HELD_FOR_RESERVATION
        assert later.message.startswith("held for the reservation of job head")
        # A job of another VC and tenant is held as well, without learning whose job it is.
        snap.pending("elsewhere", gpus, vc="other", submitted_at=3, time_limit_s=limit)
        statuses = decide(snap.build(), BACKFILL, now=0.0).pending
        elsewhere = next(p for p in statuses if p.job_id == "elsewhere")
        assert elsewhere.message.startswith("held for the reservation of a job of another tenant")
        assert "head" not in elsewhere.message


@pytest.mark.parametrize(
    ("guaranteed", "borrow", "reason", "held"),
    [
        pytest.param(0, 9, ReasonCode.INSUFFICIENT_GPUS, True, id="vc-may-borrow-the-whole-cluster"),
        pytest.param(9, 0, ReasonCode.INSUFFICIENT_GPUS, True, id="vc-guaranteed-the-whole-cluster"),
        pytest.param(0, 8, ReasonCode.VC_QUOTA, False, id="vc-limit-below-the-cluster"),
    ],
)
def test_a_vc_limit_that_covers_the_cluster_does_not_hide_the_wait_for_gpus(
    guaranteed: int, borrow: int, reason: ReasonCode, held: bool
) -> None:
    """With quotas on, a job of a VC that may take the whole cluster waits for the cluster's
    GPUs, not for its quota: the reason says so and it gets the reservation. Only a limit
    below the cluster binds by itself (no reservation helps then: the VC's own jobs must end)."""
    snap = (
        Snap()
        .node("n0", 8)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5))], time_limit_s=1000.0, vc="team")
        .node("n1", 1)
        .vc("team", guaranteed, borrow)
        .pending("head", 8, submitted_at=1)
        .pending("later", 2, submitted_at=2, time_limit_s=5000.0)
    )
    quotas_and_backfill = profile(queue_sort=["fifo"], admission=["vc_quota"], backfill="backfill")
    plan = decide(snap.build(), quotas_and_backfill, 0.0)
    head = next(p for p in plan.pending if p.job_id == "head")
    assert head.reason is reason
    if held:
        assert head.message.startswith("needs 8 A100, 3 of 9 free")
        assert plan.reservation == "head"
        assert not plan.starts
    else:
        assert head.message.startswith("VC team: 6 GPUs in use, 0 guaranteed and 6 borrowed, borrow limit 8")
        assert plan.reservation is None
        assert [s.job_id for s in plan.starts] == ["later"]


@pytest.mark.parametrize("history", [False, True], ids=["no-history", "finished-jobs"])
def test_the_reservation_counts_running_jobs_ends_as_the_estimated_starts_do(history: bool) -> None:
    """A user reads both "reserved, expected in N s" and the estimated start: the reservation
    takes a running job without time limit to end when the estimator does (history first),
    so the two agree and backfill is judged against the same time."""
    snap = (
        Snap()
        .node("n0", 8)
        .running("r", [("n0", tuple(range(8)))], started_at=0.0, attained_gpu_s=8 * 600.0)
        .pending("head", 8, submitted_at=1)
    )
    if history:
        # Half the 8-GPU jobs that ran 600 s ended at 2,000 s, half at 20,000 s.
        snap.finished(8, 8 * 2000.0, 30).finished(8, 8 * 20000.0, 30)
    now = 600.0
    plan = decide(snap.build(), BACKFILL, now)
    head = next(p for p in plan.pending if p.job_id == "head")
    assert plan.reservation == "head"
    expected_in = float(head.message.rsplit("expected in ", 1)[1].split(" s")[0])
    assert head.estimated_start is not None
    assert head.estimated_start == pytest.approx(now + expected_in, abs=1.0)
    if history:
        assert expected_in == pytest.approx(19400.0)  # the median of what is left: 20,000 - 600


def test_the_reservation_and_the_estimate_agree_when_other_jobs_hold_other_gpus() -> None:
    """The reservation looks only at jobs holding the reserved model, the estimator at every
    running job. Each running job's end is at a quantile set by its rank among all of them,
    so a job on other GPUs moves nobody's end, and the two still agree."""
    snap = (
        Snap()
        .node("a", 8)
        .node("t", 8, model="T4")
        .running("r", [("a", tuple(range(8)))], started_at=0.0, attained_gpu_s=8 * 600.0)
        .running("v", [("t", tuple(range(8)))], started_at=0.0, attained_gpu_s=8 * 600.0)
        .pending("head", 8, submitted_at=1, gpu_model="A100")
    )
    for k in range(1, 101):  # 8-GPU jobs that ran 700 to 10,600 s
        snap.finished(8, 8 * (600.0 + 100.0 * k))
    now = 600.0
    plan = decide(snap.build(), BACKFILL, now)
    head = next(p for p in plan.pending if p.job_id == "head")
    assert plan.reservation == "head"
    expected_in = float(head.message.rsplit("expected in ", 1)[1].split(" s")[0])
    assert head.estimated_start == pytest.approx(now + expected_in, abs=1.0)


def test_without_backfill_plugin_later_jobs_start_greedily() -> None:
    snap = (
        Snap()
        .node("n0", 8)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5, 6))], time_limit_s=1000.0)
        .pending("head", 8, submitted_at=1)
        .pending("later", 1, submitted_at=2, time_limit_s=50000.0)
    )
    plan = decide(snap.build(), profile(queue_sort=["fifo"]), now=0.0)
    assert [s.job_id for s in plan.starts] == ["later"]
    assert plan.reservation is None


DEFRAG = profile(preemption=["defrag"], score=["binpack"])


def test_defrag_moves_a_small_job_when_enough_gpus_stay_free() -> None:
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .running("x", [("a", (0,))], started_at=100)
        .running("y", [("b", (0,))], started_at=0, last_checkpoint_at=4990)
        .pending("wide", 4, submitted_at=5000)
    )
    plan = decide(snap.build(), DEFRAG, now=5000.0)
    # y checkpointed 10 s ago: moving it loses the least work.
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("y", "defrag")]
    assert "defragmentation" in plan.preemptions[0].message


def test_defrag_moves_another_vcs_job_inside_its_guarantee() -> None:
    """s and t run inside VC speech's guarantee, one on each node, so no node has the 4 GPUs
    free that vision's job needs. Evicting either would take speech's guarantee for vision's
    work; moving one does not (it restarts at once on the other node's free GPUs)."""
    now, later = 10_000.0, 100_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .vc("speech", 4, borrow=4)
        .vc("vision", 4, borrow=4)
        .running("s", [("a", (0,))], vc="speech", last_checkpoint_at=now - 10, time_limit_s=later)
        .running("t", [("b", (0,))], vc="speech", last_checkpoint_at=now - 10, time_limit_s=later)
        .pending("wide", 4, vc="vision", submitted_at=now)
    )
    plan = decide(snap.build(), DEFRAG, now=now)
    assert [p.reason for p in plan.preemptions] == ["defrag"]
    assert plan.preemptions[0].job_id in {"s", "t"}
    assert plan.pending[0].reason is ReasonCode.WAITING_FOR_PREEMPTION
    evicting = profile(queue_sort=["priority", "las", "fifo"], admission=["vc_quota"], preemption=["las"])
    assert decide(snap.build(), evicting, now=now).preemptions == ()


@pytest.mark.parametrize(
    ("stop_policy", "budget_message"), [("hold", ""), ("", "VC speech has used 12 of its 10 GPU-hours")]
)
def test_defrag_never_moves_a_job_of_a_stopped_vc(stop_policy: str, budget_message: str) -> None:
    """A moved job of a VC that starts none of its jobs would wait in the queue until the VC
    opens, so of the two jobs in the way only vision's own may move."""
    now, later = 10_000.0, 100_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .vc("speech", 4, borrow=4, stop_policy=stop_policy, budget_message=budget_message)
        .vc("vision", 4, borrow=4)
        .running("s", [("a", (0,))], vc="speech", last_checkpoint_at=now - 5, time_limit_s=later)
        .running("v", [("b", (0,))], vc="vision", last_checkpoint_at=now - 10, time_limit_s=later)
        .pending("wide", 4, vc="vision", submitted_at=now)
    )
    plan = decide(snap.build(), DEFRAG, now=now)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("v", "defrag")]
    open_snap = snap.build()
    open_vcs = tuple(replace(vc, stop_policy="", budget_message="") for vc in open_snap.vcs)
    # Open, speech's job is the cheaper move (it checkpointed more recently).
    moved = decide(replace(open_snap, vcs=open_vcs), DEFRAG, now=now).preemptions
    assert [(p.job_id, p.reason) for p in moved] == [("s", "defrag")]


@pytest.mark.parametrize(
    ("c_busy", "moves"),
    [
        pytest.param((0, 1, 2), False, id="no-2-gpu-block-left-for-y: it stays"),
        pytest.param((0, 1), True, id="c-has-2-free: y moves though 5 free < 4 + 2"),
    ],
)
def test_defrag_moves_a_job_only_where_it_can_restart(c_busy: tuple[int, ...], moves: bool) -> None:
    """4 GPUs free in total either way, 1 of them on node a: freeing node b for the 4-GPU job
    moves y, which needs a 2-GPU block on another node. It gives up as many GPUs as it takes,
    so a move needs no GPUs free beyond the blocked job's own, only a place to go."""
    now, later = 10_000.0, 100_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .node("c", 4)
        .running("x", [("a", (0, 1, 2))], checkpointable=False, time_limit_s=later)
        .running("w", [("c", c_busy)], checkpointable=False, time_limit_s=later)
        .running("y", [("b", (0, 1))], last_checkpoint_at=now - 10, time_limit_s=later)
        .pending("wide", 4, submitted_at=now)
    )
    plan = decide(snap.build(), DEFRAG, now=now)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == ([("y", "defrag")] if moves else [])
    expected = ReasonCode.WAITING_FOR_PREEMPTION if moves else ReasonCode.FRAGMENTATION
    assert plan.pending[0].reason is expected


def test_defrag_makes_the_fewest_moves() -> None:
    """Node a frees with two moves of 70 GPU-s each, node b with one of 320 (k: 2 GPUs, 100 s
    since its checkpoint, 60 s restart): one move it is, and k has a 2-GPU block on a."""
    now, later = 10_000.0, 100_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .node("c", 4)
        .running("j1", [("a", (0,))], last_checkpoint_at=now - 10, time_limit_s=later)
        .running("j2", [("a", (1,))], last_checkpoint_at=now - 10, time_limit_s=later)
        .running("k", [("b", (0, 1))], last_checkpoint_at=now - 100, time_limit_s=later)
        .running("w", [("c", (0, 1, 2))], checkpointable=False, time_limit_s=later)
        .pending("wide", 4, submitted_at=now)
    )
    plan = decide(snap.build(), DEFRAG, now=now)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("k", "defrag")]


@pytest.mark.parametrize(
    ("since_checkpoint_s", "moves"),
    [
        pytest.param(150.0, False, id="two moves of 210 GPU-s each: 420 > 400 gained"),
        pytest.param(100.0, True, id="two moves of 160 GPU-s each: 320 <= 400 gained"),
    ],
)
def test_defrag_moves_cost_together_at_most_the_blocked_jobs_gain(
    since_checkpoint_s: float, moves: bool
) -> None:
    """Node b frees by itself in 100 s (x's time limit): the 4-GPU job gains 400 GPU-s. Node a
    needs both j1 and j2 moved, each cheaper than that, together perhaps not."""
    now, later = 10_000.0, 100_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .node("c", 4)
        .running("j1", [("a", (0,))], last_checkpoint_at=now - since_checkpoint_s, time_limit_s=later)
        .running("j2", [("a", (1,))], last_checkpoint_at=now - since_checkpoint_s, time_limit_s=later)
        .running("x", [("b", (0, 1, 2))], checkpointable=False, time_limit_s=now + 100)
        .running("w", [("c", (0, 1))], checkpointable=False, time_limit_s=later)
        .pending("wide", 4, submitted_at=now)
    )
    plan = decide(snap.build(), DEFRAG, now=now)
    moved = sorted(p.job_id for p in plan.preemptions if p.reason == "defrag")
    assert moved == (["j1", "j2"] if moves else [])


@pytest.mark.parametrize(
    ("preemption", "expected"),
    [
        pytest.param(["las", "defrag"], [("small", "defrag")], id="migration-first: the gang keeps running"),
        pytest.param(["las"], [("gang", "las")], id="without-migration: LAS evicts the cheaper gang"),
    ],
)
def test_a_job_blocked_by_layout_moves_jobs_before_evicting_any(
    preemption: list[str], expected: list[tuple[str, str]]
) -> None:
    """The new 4-GPU job is in LAS queue 0 and both running jobs in queue 1. Evicting the gang
    loses less work (4 x 100 GPU-s against 1,000) but sends it back to the queue; moving the
    small job onto node c frees node b, and the small job restarts at once."""
    now, later = 10_000.0, 100_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .node("c", 4)
        .running(
            "gang", [("a", (0, 1, 2, 3))], started_at=now - 100, attained_gpu_s=4 * 5000, time_limit_s=later
        )
        .running(
            "small", [("b", (0,))], attained_gpu_s=9000, last_checkpoint_at=now - 1000, time_limit_s=later
        )
        .running("w", [("c", (0, 1, 2))], checkpointable=False, time_limit_s=later)
        .pending("wide", 4, submitted_at=now)
    )
    las_first = profile(
        queue_sort=["las", "fifo"],
        preemption=preemption,
        score=["binpack"],
        plugin_args={"las": {"thresholds": [3600]}},
    )
    plan = decide(snap.build(), las_first, now=now)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == expected


@pytest.mark.parametrize(
    ("c_busy", "d_busy", "room"),
    [
        pytest.param((0, 1), (0, 1, 2, 3), True, id="c-has-a-2-gpu-block: y moves there"),
        pytest.param((0, 1, 2), (0, 1, 2), False, id="only-node-a-has-2-free: y stays"),
    ],
)
def test_defrag_frees_a_node_for_a_gang_and_keeps_the_free_node_for_it(
    c_busy: tuple[int, ...], d_busy: tuple[int, ...], room: bool
) -> None:
    """A 2x4 gang, 8 GPUs free in total: node a has room, node b needs y (2 GPUs) moved. y may
    not restart on node a, which the gang's other replica takes."""
    now, later = 10_000.0, 100_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .node("c", 4)
        .node("d", 4)
        .running("y", [("b", (0, 1))], last_checkpoint_at=now - 10, time_limit_s=later)
        .running("w", [("c", c_busy)], checkpointable=False, time_limit_s=later)
        .running("v", [("d", d_busy)], checkpointable=False, time_limit_s=later)
        .pending("gang", 4, replicas=2, submitted_at=now)
    )
    plan = decide(snap.build(), DEFRAG, now=now)
    expected = ReasonCode.WAITING_FOR_PREEMPTION if room else ReasonCode.GANG_NODES
    assert plan.pending[0].reason is expected
    assert [(p.job_id, p.reason) for p in plan.preemptions] == ([("y", "defrag")] if room else [])


def test_defrag_never_moves_a_job_again_within_its_minimum_interval() -> None:
    def snap() -> Snap:
        return (
            Snap()
            .node("a", 4)
            .node("b", 4)
            .running("x", [("a", (0,))], started_at=4900, time_limit_s=86400.0)  # (re)started 100 s ago
            .running("y", [("b", (0,))], started_at=4900, time_limit_s=86400.0)
            .pending("wide", 4, submitted_at=5000)
        )

    held = decide(snap().build(), DEFRAG, now=5000.0)
    assert not held.preemptions and held.pending[0].reason is ReasonCode.FRAGMENTATION
    eager = profile(preemption=["defrag"], score=["binpack"], plugin_args={"defrag": {"min_interval_s": 60}})
    moved = decide(snap().build(), eager, now=5000.0)
    assert [p.reason for p in moved.preemptions] == ["defrag"]


@pytest.mark.parametrize(
    ("other_ends_in_s", "moves"),
    [
        pytest.param(30.0, False, id="a layout frees in 30 s: 4 x 30 GPU-s gained < 1 x 160 lost"),
        pytest.param(3600.0, True, id="a layout frees in an hour: worth a 160 GPU-s move"),
    ],
)
def test_defrag_moves_a_job_only_when_the_blocked_job_gains_more_than_the_move_costs(
    other_ends_in_s: float, moves: bool
) -> None:
    """y lost 100 s since its checkpoint plus a 60 s restart: 160 GPU-s. Node a frees up when x
    reaches its time limit; until then the 4-GPU job waits."""
    now = 10_000.0
    snap = (
        Snap()
        .node("a", 4)
        .node("b", 4)
        .running("x", [("a", (0,))], started_at=0, time_limit_s=now + other_ends_in_s, checkpointable=False)
        .running("y", [("b", (0,))], started_at=0, last_checkpoint_at=now - 100, time_limit_s=10 * now)
        .pending("wide", 4, submitted_at=now)
    )
    plan = decide(snap.build(), DEFRAG, now=now)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == ([("y", "defrag")] if moves else [])


@pytest.mark.parametrize(
    ("fields", "expected_end"),
    [
        pytest.param({"time_limit_s": 7200.0}, 7200.0, id="time-limit-wins"),
        pytest.param(
            {"estimated_runtime_s": 50_000.0, "attained_gpu_s": 1000.0},
            1000.0 + 1000.0,
            id="young-runs-its-age-again",
        ),
        pytest.param(
            {"estimated_runtime_s": 1500.0, "attained_gpu_s": 1000.0}, 1000.0 + 500.0, id="capped-by-estimate"
        ),
        pytest.param(
            {"estimated_runtime_s": 600.0, "attained_gpu_s": 1000.0},
            1000.0 + 500.0,
            id="past-estimate-half-age",
        ),
        pytest.param(
            {"estimated_runtime_s": 600.0, "attained_gpu_s": 10.0}, 1000.0 + 60.0, id="at-least-a-minute"
        ),
    ],
)
def test_expected_end_of_a_running_job(fields: dict[str, float], expected_end: float) -> None:
    assert _end_at_1000(fields) == pytest.approx(expected_end)


@pytest.mark.parametrize(
    ("fields", "expected_end"),
    [
        pytest.param(
            {"estimated_runtime_s": 50_000.0, "attained_gpu_s": 10.0},
            1000.0 + 5000.0,
            id="just-started-runs-a-tenth-of-its-estimate",
        ),
        pytest.param(
            {"estimated_runtime_s": 50_000.0, "attained_gpu_s": 8000.0},
            1000.0 + 8000.0,
            id="older-than-a-tenth-runs-its-age-again",
        ),
        pytest.param(
            {"estimated_runtime_s": 3000.0, "attained_gpu_s": 2900.0},
            1000.0 + 1450.0,
            id="near-its-estimate-half-age",
        ),
        pytest.param(
            {"estimated_runtime_s": 600.0, "attained_gpu_s": 10.0},
            1000.0 + 60.0,
            id="still-at-least-a-minute",
        ),
        pytest.param({"time_limit_s": 7200.0}, 7200.0, id="time-limit-still-wins"),
    ],
)
def test_expected_end_with_a_share_of_the_estimate(fields: dict[str, float], expected_end: float) -> None:
    assert _end_at_1000(fields, min_share=0.1) == pytest.approx(expected_end)


def _end_at_1000(fields: dict[str, float], min_share: float = 0.0) -> float:
    """running_end at now=1000 s of a one-GPU job started at 0 with `fields`."""
    snap = Snap().node("n0", 1).running("r", [("n0", (0,))], started_at=0.0, **fields)
    (job,) = snap.build().running
    return running_end(job, now=1000.0, default_runtime_s=3600.0, min_share=min_share)


def test_a_job_behind_a_fresh_start_is_not_promised_the_gpu_in_a_minute() -> None:
    # The only GPU went 10 s ago to a job whose history says 50,000 s: the queued job's
    # estimated start is a tenth of that away, not the one-minute floor.
    snap = (
        Snap()
        .node("n0", 1)
        .running("r", [("n0", (0,))], started_at=990.0, estimated_runtime_s=50_000.0, attained_gpu_s=10.0)
        .pending("p", 1, submitted_at=1000.0)
    )
    plan = decide(snap.build(), profile(queue_sort=["fifo"]), now=1000.0)
    (status,) = plan.pending
    assert status.estimated_start == pytest.approx(1000.0 + 5000.0)


def test_gpus_of_a_stopping_job_are_not_handed_to_anyone_else() -> None:
    # "new" is blocked by its VC's quota; the stopping "old" of the same VC frees that quota,
    # and "new" may land on other GPUs. Old's GPUs are still busy until it is gone, so the
    # later "other" must not start on them.
    snap = (
        Snap()
        .node("n0", 8)
        .vc("team", 4)
        .vc("free", 8)
        .running("old", [("n0", (4, 5, 6, 7))], vc="team", stopping=True)
        .pending("new", 4, vc="team", submitted_at=1)
        .pending("other", 4, vc="free", submitted_at=2)
    )
    plan = decide(snap.build(), PREEMPT, now=5000.0)
    used = {(r.node, i) for s in plan.starts for r in s.placement for i in r.gpu_indices}
    assert not used & {("n0", i) for i in range(4, 8)}
    assert next(p for p in plan.pending if p.job_id == "new").reason is ReasonCode.WAITING_FOR_PREEMPTION


def two_models_one_borrower(x_quotas: tuple[tuple[str, int, int], ...]) -> Snapshot:
    """An 8-A100 node held by VC other's own non-preemptible job, an 8-V100 node by its borrowed
    job y1 (other has no guarantee), and a 4-GPU job of any model of VC x with `x_quotas`."""
    snap = (
        Snap()
        .node("a0", 8, "A100")
        .node("v0", 8, "V100")
        .vc("other", 0, borrow=16)
        .running(
            "a-own",
            [("a0", tuple(range(8)))],
            vc="other",
            started_at=1_000.0,
            priority=1000,
            preemptible=False,
        )
        .running("y1", [("v0", tuple(range(8)))], vc="other", started_at=1_000.0)
        .pending("x1", 4, vc="x", submitted_at=9_000.0)
    ).build()
    x = VirtualCluster(VcName("x"), tuple(Quota(m, g, b) for m, g, b in x_quotas), tenant="tx")
    return replace(snap, vcs=(*snap.vcs, x))


@pytest.mark.parametrize(
    ("x_quotas", "victims"),
    [
        pytest.param((("A100", 8, 0), ("V100", 0, 8)), [], id="no-guarantee-on-the-victims-model"),
        pytest.param((("A100", 8, 0), ("V100", 4, 4)), ["y1"], id="guarantee-on-the-victims-model"),
        pytest.param((("A100", 8, 0), ("*", 4, 4)), ["y1"], id="all-models-row-covers-the-victims-model"),
        pytest.param((("A100", 8, 0), ("*", 2, 4)), [], id="all-models-row-too-small"),
        pytest.param((("*", 8, 0),), ["y1"], id="only-an-all-models-row"),
    ],
)
def test_reclaim_counts_the_guarantee_on_the_model_the_victim_holds(
    x_quotas: tuple[tuple[str, int, int], ...], victims: list[str]
) -> None:
    """A job that takes any model reclaims only GPUs its VC is guaranteed on the model the
    victim holds: a guarantee of 8 A100 is no claim on another tenant's V100."""
    for name in ("fifo", "default"):
        plan = decide(two_models_one_borrower(x_quotas), load_profile(name), now=10_000.0)
        assert [p.job_id for p in plan.preemptions] == victims, name
        assert all(p.reason == "reclaim" for p in plan.preemptions)


def test_gpus_a_victim_blocks_count_as_free_once_its_grace_ends() -> None:
    """prod takes 4 of dev's 8 GPUs; the other 4 stay dev's until dev is gone (after the
    45 s grace), and then they are free: the next waiting job is estimated to start then,
    not when prod ends."""
    snap = (
        full_node()
        .running("dev", [("n0", tuple(range(8)))], priority=100, started_at=0)
        .pending("prod", 4, priority=1000, submitted_at=5000)
        .pending("low", 4, priority=100, submitted_at=5001)
        .build()
    )
    plan = decide(snap, PREEMPT, now=5002.0)
    assert [p.job_id for p in plan.preemptions] == ["dev"]
    by_id = {status.job_id: status for status in plan.pending}
    assert by_id["prod"].estimated_start == pytest.approx(5047.0)
    assert by_id["low"].estimated_start == pytest.approx(5047.0)

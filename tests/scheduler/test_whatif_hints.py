"""What-if hints: the cheapest changes that would start a blocked job now or sooner."""

from __future__ import annotations

from dataclasses import replace

from sched_builders import Snap, profile, with_cycle

from scheduler.core import Flavor, HintKind, Plan, ReasonCode, decide

BASIC = profile(
    queue_sort=["fifo"],
    admission=["vc_quota"],
    gpu_chooser="buddy",
    score=[{"name": "topology", "weight": 1}],
    cycle={"default_runtime_s": 3600},
)
NOW = 10_000.0


def status_of(plan: Plan, job_id: str):  # type: ignore[no-untyped-def]
    return next(s for s in plan.pending if s.job_id == job_id)


def test_fragmented_single_node_job_is_told_to_spread_or_shrink() -> None:
    # Two nodes with four free GPUs each: an 8-GPU single-node job waits by fragmentation,
    # and 2x4 (spread) or 1x4 (fewer) would start now.
    snap = (
        Snap()
        .node("n0", 8)
        .node("n1", 8)
        .running("a", [("n0", (0, 1, 2, 3))], started_at=0, time_limit_s=NOW + 7200)
        .running("b", [("n1", (0, 1, 2, 3))], started_at=0, time_limit_s=NOW + 7200)
        .pending("big", 8, submitted_at=NOW - 60)
        .build()
    )
    status = status_of(decide(snap, BASIC, NOW), "big")
    assert status.reason is ReasonCode.FRAGMENTATION
    by_kind = {h.kind: h for h in status.hints}
    fewer, spread = by_kind[HintKind.FEWER_GPUS], by_kind[HintKind.SPREAD]
    assert (fewer.replicas, fewer.gpus_per_replica, fewer.starts_now) == (1, 4, True)
    assert (spread.replicas, spread.gpus_per_replica, spread.starts_now) == (2, 4, True)
    assert spread.estimated_start == NOW and "2x4" in spread.message and "starts now" in spread.message
    # Cheapest change first: shrinking comes before spreading.
    assert [h.kind for h in status.hints][:2] == [HintKind.FEWER_GPUS, HintKind.SPREAD]


def test_trial_placements_leave_no_trace_in_the_plan() -> None:
    snap = (
        Snap()
        .node("n0", 8)
        .node("n1", 8)
        .running("a", [("n0", (0, 1, 2, 3))], started_at=0)
        .running("b", [("n1", (0, 1, 2, 3))], started_at=0)
        .pending("big", 8, submitted_at=1)
        .pending("small", 4, submitted_at=2)
        .build()
    )
    with_hints = decide(snap, BASIC, NOW)
    without = decide(snap, with_cycle(BASIC, whatif_max_jobs=0), NOW)
    assert with_hints.starts == without.starts
    assert [(s.job_id, s.reason, s.estimated_start) for s in with_hints.pending] == [
        (s.job_id, s.reason, s.estimated_start) for s in without.pending
    ]
    assert all(s.hints == () for s in without.pending)
    assert decide(snap, BASIC, NOW) == with_hints  # deterministic


def test_another_gpu_model_that_is_free_is_proposed() -> None:
    snap = (
        Snap()
        .node("a0", 8, model="A100")
        .node("v0", 8, model="V100")
        .running("busy", [("a0", tuple(range(8)))], started_at=0, gpu_model="A100")
        .pending("job", 4, gpu_model="A100", submitted_at=NOW - 10)
        .build()
    )
    status = status_of(decide(snap, BASIC, NOW), "job")
    assert status.reason is ReasonCode.INSUFFICIENT_GPUS
    model_hints = [h for h in status.hints if h.kind is HintKind.GPU_MODEL]
    assert [(h.gpu_model, h.starts_now) for h in model_hints] == [("V100", True)]
    # Fewer A100s cannot help: none is free.
    assert all(h.kind is not HintKind.FEWER_GPUS or not h.starts_now for h in status.hints)


def test_quota_bound_job_is_told_how_many_gpus_fit_its_quota() -> None:
    snap = (
        Snap()
        .node("n0", 8)
        .vc("team", guaranteed=4)
        .running("mine", [("n0", (0, 1))], started_at=0)
        .pending("job", 4, submitted_at=NOW - 10)
        .build()
    )
    status = status_of(decide(snap, BASIC, NOW), "job")
    assert status.reason is ReasonCode.VC_QUOTA
    fewer = next(h for h in status.hints if h.kind is HintKind.FEWER_GPUS)
    assert (fewer.gpus_per_replica, fewer.starts_now) == (2, True)


def test_a_borrower_is_told_how_many_gpus_others_do_not_keep() -> None:
    """16 A100 free, 8 of them kept by a VC that lends none: 8 may be borrowed now."""
    snap = (
        Snap()
        .nodes(2, 8)
        .vc("keeper", 8, lend=0)
        .vc("team", 0, borrow=16)
        .pending("job", 4, replicas=4, vc="team", submitted_at=NOW - 10)
        .build()
    )
    status = status_of(decide(snap, BASIC, NOW), "job")
    assert status.reason is ReasonCode.NOT_LENT
    fewer = next(h for h in status.hints if h.kind is HintKind.FEWER_GPUS)
    assert (fewer.replicas * fewer.gpus_per_replica, fewer.starts_now) == (8, True)


def test_a_later_start_is_reported_only_when_clearly_sooner() -> None:
    # Eight GPUs busy: four free in 1 h, all eight in 5 h. Half the GPUs start in about 1 h
    # instead of 5 h, which is worth saying; nothing starts now.
    snap = (
        Snap()
        .node("n0", 8)
        .running("short", [("n0", (0, 1, 2, 3))], started_at=NOW - 60, time_limit_s=3660)
        .running("long", [("n0", (4, 5, 6, 7))], started_at=NOW - 60, time_limit_s=5 * 3600 + 60)
        .pending("job", 8, submitted_at=NOW - 10)
        .build()
    )
    status = status_of(decide(snap, BASIC, NOW), "job")
    assert status.estimated_start == NOW + 5 * 3600
    fewer = next(h for h in status.hints if h.kind is HintKind.FEWER_GPUS)
    assert not fewer.starts_now and fewer.gpus_per_replica == 4
    assert fewer.estimated_start == NOW + 3600
    assert "expected to start in 1 h" in fewer.message


def test_no_hint_when_nothing_helps() -> None:
    # The whole cluster is busy for one more hour with a job of the same VC: every smaller
    # shape waits as long as the job itself, so there is nothing useful to say.
    snap = (
        Snap()
        .node("n0", 8)
        .running("all", [("n0", tuple(range(8)))], started_at=NOW - 60, time_limit_s=3660)
        .pending("job", 2, submitted_at=NOW - 10)
        .build()
    )
    status = status_of(decide(snap, BASIC, NOW), "job")
    assert status.reason is ReasonCode.INSUFFICIENT_GPUS
    assert status.hints == ()


def test_a_shorter_time_limit_lets_a_held_job_backfill() -> None:
    backfill = profile(
        queue_sort=["fifo"],
        admission=["vc_quota"],
        backfill="backfill",
        cycle={"default_runtime_s": 3600},
    )
    # n0 has 4 free GPUs; the 8-GPU head job is reserved for when "run" ends (2 h). A 4-GPU
    # job with a 3 h limit would delay it; with at most 2 h it would not.
    snap = (
        Snap()
        .node("n0", 8)
        .running("run", [("n0", (0, 1, 2, 3))], started_at=NOW - 60, time_limit_s=7260)
        .pending("head", 8, submitted_at=NOW - 100)
        .pending("later", 4, submitted_at=NOW - 50, time_limit_s=3 * 3600)
        .build()
    )
    plan = decide(snap, backfill, NOW)
    assert plan.reservation == "head"
    status = status_of(plan, "later")
    assert status.reason is ReasonCode.HELD_FOR_RESERVATION
    limit = next(h for h in status.hints if h.kind is HintKind.TIME_LIMIT)
    assert limit.starts_now and limit.time_limit_s == 2 * 3600
    assert "time limit of 2 h" in limit.message


def test_only_the_head_of_the_queue_gets_hints() -> None:
    snap = Snap().node("n0", 8).running("all", [("n0", tuple(range(8)))], started_at=0)
    for i in range(6):
        snap.pending(f"j{i}", 16, submitted_at=NOW - 100 + i)
    plan = decide(snap.build(), with_cycle(BASIC, whatif_max_jobs=3), NOW)
    hinted = [s.job_id for s in plan.pending if s.hints]
    assert hinted == ["j0", "j1", "j2"]
    assert all(s.reason is ReasonCode.NO_MATCHING_GPU for s in plan.pending)


def test_another_model_takes_the_resources_of_its_flavor() -> None:
    # An A100 job asks 200 CPUs per replica; V100 nodes have 80. With the V100 flavor's 80
    # CPUs it fits there and the hint names that flavor; without flavors it does not fit.
    snap = (
        Snap()
        .node("a0", 8, model="A100", cpu_milli=256_000)
        .node("v0", 8, model="V100", cpu_milli=80_000)
        .running("busy", [("a0", tuple(range(8)))], started_at=0, gpu_model="A100")
        .pending("job", 8, gpu_model="A100", cpu_milli_per_replica=200_000, submitted_at=NOW - 10)
        .build()
    )
    checks_cpu = profile(queue_sort=["fifo"], admission=["vc_quota"], filter=["node_resources"])
    without = status_of(decide(snap, checks_cpu, NOW), "job")
    assert not any(h.kind is HintKind.GPU_MODEL and h.starts_now for h in without.hints)
    flavors = (Flavor("l-A100", "A100", 8, 256_000), Flavor("l-V100", "V100", 8, 80_000))
    status = status_of(decide(replace(snap, flavors=flavors), checks_cpu, NOW), "job")
    hint = next(h for h in status.hints if h.kind is HintKind.GPU_MODEL)
    assert (hint.gpu_model, hint.flavor, hint.starts_now) == ("V100", "l-V100", True)
    assert "flavor l-V100" in hint.message

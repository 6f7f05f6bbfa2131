"""Per-user CPU and memory caps of a VC through whole cycles: what jobs started or preempted in
the cycle hold counts at once, answers the cycle reuses tell jobs of other CPU apart, and the
what-if hints and preemption search go by the caps as by the GPU cap."""

from __future__ import annotations

from sched_builders import Snap, profile

from scheduler.core import HintKind, ReasonCode, decide

FIFO = profile(queue_sort=["fifo"], admission=["vc_quota", "user_limit"])
PRIORITY = profile(
    queue_sort=["priority", "fifo"], admission=["vc_quota", "user_limit"], preemption=["priority"]
)


def vision(cpu: int | None = 64_000, memory: int | None = None) -> Snap:
    """Four nodes of 8 GPUs and VC vision, whose users may hold `cpu` mCPU and `memory` MiB."""
    return Snap().nodes(4, 8).vc("vision", 32, max_cpu_milli_per_user=cpu, max_memory_mib_per_user=memory)


def test_a_cap_binds_past_it_for_that_user_in_that_vc_only() -> None:
    """alice holds 48 CPUs in vision and 48 in speech: a job of 16 brings her to vision's cap of
    64 exactly and starts, the next one of hers waits; bob's and her job in speech do not."""
    snap = (
        vision()
        .vc("speech", 32)
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=48_000)
        .running("s", [("n0", (1,))], vc="speech", cpu_milli_per_replica=48_000)
        .pending("to-the-cap", 1, vc="vision", submitted_at=1.0, cpu_milli_per_replica=16_000)
        .pending("past-it", 1, vc="vision", submitted_at=2.0, cpu_milli_per_replica=1_000)
        .pending("bobs", 1, vc="vision", user="bob", submitted_at=3.0, cpu_milli_per_replica=64_000)
        .pending("in-speech", 1, vc="speech", submitted_at=4.0, cpu_milli_per_replica=64_000)
    )
    plan = decide(snap.build(), FIFO, now=10.0)
    assert sorted(s.job_id for s in plan.starts) == ["bobs", "in-speech", "to-the-cap"]
    (status,) = plan.pending
    assert (status.job_id, status.reason) == ("past-it", ReasonCode.USER_LIMIT)


def test_no_cap_is_no_limit() -> None:
    def plan_with(cpu: int | None, memory: int | None) -> list[str]:
        snap = vision(cpu, memory).pending(
            "j", 1, vc="vision", cpu_milli_per_replica=10**6, memory_mib_per_replica=10**7
        )
        return [s.job_id for s in decide(snap.build(), FIFO, now=10.0).starts]

    assert plan_with(None, None) == ["j"]
    assert plan_with(64_000, None) == plan_with(None, 1024) == []


def test_what_a_job_started_in_the_cycle_holds_counts_for_the_next() -> None:
    snap = (
        vision()
        .pending("first", 1, vc="vision", submitted_at=1.0, cpu_milli_per_replica=40_000)
        .pending("second", 1, vc="vision", submitted_at=2.0, cpu_milli_per_replica=32_000)
    )
    plan = decide(snap.build(), FIFO, now=10.0)
    assert [s.job_id for s in plan.starts] == ["first"]
    (status,) = plan.pending
    assert (status.reason, status.message) == (
        ReasonCode.USER_LIMIT,
        "user alice holds 40 of 64 CPUs allowed per user in VC vision; job needs 32",
    )


def test_a_refusal_is_not_reused_for_a_job_that_asks_for_less_cpu() -> None:
    """The cycle reuses a blocked job's outcome for later jobs of the same shape, and an
    admission answer for jobs of the same width: neither may hold back a job of less CPU."""
    held = vision().running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=32_000)
    same_shape = held.pending("big", 1, vc="vision", submitted_at=1.0, cpu_milli_per_replica=48_000).pending(
        "small", 1, vc="vision", submitted_at=2.0, cpu_milli_per_replica=16_000
    )
    plan = decide(same_shape.build(), FIFO, now=10.0)
    assert [s.job_id for s in plan.starts] == ["small"]

    held = vision().running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=32_000)
    same_width = held.pending(
        "big", 1, replicas=2, vc="vision", submitted_at=1.0, cpu_milli_per_replica=24_000
    ).pending("small", 2, vc="vision", submitted_at=2.0, cpu_milli_per_replica=16_000)
    plan = decide(same_width.build(), FIFO, now=10.0)
    assert [s.job_id for s in plan.starts] == ["small"]


def test_a_job_held_back_by_memory_counts_what_started_before_it() -> None:
    snap = (
        vision(cpu=None, memory=1024 * 1024)
        .pending("first", 1, vc="vision", submitted_at=1.0, memory_mib_per_replica=768 * 1024)
        .pending("second", 1, vc="vision", submitted_at=2.0, memory_mib_per_replica=512 * 1024)
    )
    plan = decide(snap.build(), FIFO, now=10.0)
    assert [s.job_id for s in plan.starts] == ["first"]
    assert plan.pending[0].message == (
        "user alice holds 768 GB of 1024 GB of memory allowed per user in VC vision; job needs 512 GB"
    )


def test_a_job_over_its_users_cpu_cap_preempts_only_that_users_lower_priority_work() -> None:
    snap = (
        vision()
        .running("bobs", [("n1", (0,))], vc="vision", user="bob", cpu_milli_per_replica=48_000)
        .running("low", [("n0", (0,))], vc="vision", priority=0, cpu_milli_per_replica=48_000)
        .pending("j", 1, vc="vision", priority=1000, cpu_milli_per_replica=32_000)
    )
    plan = decide(snap.build(), PRIORITY, now=10_000.0)
    assert [p.job_id for p in plan.preemptions] == ["low"]
    (status,) = plan.pending
    assert status.reason is ReasonCode.WAITING_FOR_PREEMPTION


def test_a_failed_preemption_search_does_not_stop_a_job_of_less_cpu_from_trying() -> None:
    """Preempting `low` frees too little CPU for `big`, enough for `small`, which asks for as
    many GPUs: the cycle skips searches that cannot do better, but this one can."""
    snap = (
        vision()
        .running("keep", [("n0", (0,))], vc="vision", priority=2000, cpu_milli_per_replica=40_000)
        .running("low", [("n0", (1,))], vc="vision", priority=0, cpu_milli_per_replica=16_000)
        .pending("big", 1, vc="vision", priority=1000, submitted_at=1.0, cpu_milli_per_replica=50_000)
        .pending("small", 1, vc="vision", priority=1000, submitted_at=2.0, cpu_milli_per_replica=20_000)
    )
    plan = decide(snap.build(), PRIORITY, now=10_000.0)
    assert [(p.job_id, p.for_job) for p in plan.preemptions] == [("low", "small")]


def test_a_preempted_job_holds_its_cpu_for_its_user_until_it_is_gone() -> None:
    """`high` takes the GPUs of `low`, of the same user, which keeps its 48 CPUs through its
    grace period: a third job of the user may not start on them in the meantime."""
    snap = (
        Snap()
        .node("n0", 2)
        .node("n1", 1)
        .vc("vision", 8, max_cpu_milli_per_user=64_000)
        .running("low", [("n0", (0, 1))], vc="vision", priority=0, cpu_milli_per_replica=48_000)
        .pending("high", 2, vc="vision", priority=1000, submitted_at=1.0, cpu_milli_per_replica=32_000)
        .pending("third", 1, vc="vision", priority=1000, submitted_at=2.0, cpu_milli_per_replica=24_000)
    )
    plan = decide(snap.build(), PRIORITY, now=10_000.0)
    assert [p.job_id for p in plan.preemptions] == ["low"]
    assert not plan.starts
    reasons = {s.job_id: s.reason for s in plan.pending}
    assert reasons == {"high": ReasonCode.WAITING_FOR_PREEMPTION, "third": ReasonCode.USER_LIMIT}


def test_a_hint_proposes_a_request_within_the_cpu_cap() -> None:
    """Half the GPUs come with half the CPU (no flavor of that shape): 48 + 16 of 64 CPUs."""
    snap = (
        vision()
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=48_000)
        .pending("j", 4, vc="vision", cpu_milli_per_replica=32_000)
    )
    plan = decide(snap.build(), FIFO, now=10.0)
    (status,) = plan.pending
    assert status.reason is ReasonCode.USER_LIMIT
    assert [(h.kind, h.gpus_per_replica, h.starts_now) for h in status.hints] == [
        (HintKind.FEWER_GPUS, 2, True)
    ]


def estimated_starts(snap: Snap, now: float = 10.0) -> dict[str, float | None]:
    return {s.job_id: s.estimated_start for s in decide(snap.build(), FIFO, now=now).pending}


def test_a_job_held_back_by_a_cap_is_estimated_to_start_when_its_users_jobs_leave_room() -> None:
    """alice's job holding 48 of her 64 CPUs ends at 1,000 s (its time limit); her next job of
    32 CPUs waits for it although GPUs are free, and its estimate says so, not "now". Her job
    behind it waits for that one as well (booked to its end, 1,000 + 500 s)."""
    snap = (
        vision()
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=48_000, time_limit_s=1_000.0)
        .pending("next", 1, vc="vision", submitted_at=1.0, cpu_milli_per_replica=32_000, time_limit_s=500.0)
        .pending("after", 1, vc="vision", submitted_at=2.0, cpu_milli_per_replica=40_000, time_limit_s=500.0)
        .pending("bobs", 1, vc="vision", user="bob", submitted_at=3.0, cpu_milli_per_replica=64_000)
    )
    plan = decide(snap.build(), FIFO, now=10.0)
    assert [s.job_id for s in plan.starts] == ["bobs"]
    starts = {s.job_id: s.estimated_start for s in plan.pending}
    assert starts == {"next": 1_000.0, "after": 1_500.0}


def test_the_gpu_and_memory_caps_bind_the_estimate_too_and_a_job_past_a_cap_has_none() -> None:
    snap = (
        Snap()
        .nodes(4, 8)
        .vc("vision", 32, max_gpus_per_user=4, max_memory_mib_per_user=8192)
        .running("r", [("n0", (0, 1))], vc="vision", time_limit_s=2_000.0)
        .running("r-later", [("n0", (2, 3))], vc="vision", time_limit_s=5_000.0)
        .running(
            "m", [("n1", (0,))], vc="vision", user="bob", memory_mib_per_replica=8192, time_limit_s=3_000.0
        )
        .pending("gpus", 2, vc="vision", submitted_at=1.0)
        .pending("memory", 1, vc="vision", user="bob", submitted_at=2.0, memory_mib_per_replica=1024)
        .pending("never", 1, vc="vision", user="carol", submitted_at=3.0, memory_mib_per_replica=9000)
    )
    assert estimated_starts(snap) == {"gpus": 2_000.0, "memory": 3_000.0, "never": None}


def test_a_search_that_fails_on_one_users_cap_does_not_stop_another_users_search() -> None:
    """alice's job would fit vision's quota only by preempting, and then her CPU cap refuses
    it; bob's job of the same priority, model and VC still preempts carol's low-priority job."""

    def preemptions(with_alices_job: bool) -> list[tuple[str, str | None]]:
        snap = (
            Snap()
            .nodes(2, 8)
            .vc("vision", 3, max_cpu_milli_per_user=64_000)
            .running("r", [("n0", (0,))], vc="vision", priority=2000, cpu_milli_per_replica=48_000)
            .running("low", [("n0", (1, 2))], vc="vision", user="carol", cpu_milli_per_replica=1_000)
        )
        if with_alices_job:
            snap = snap.pending(
                "alices", 1, vc="vision", priority=1000, submitted_at=1.0, cpu_milli_per_replica=32_000
            )
        snap = snap.pending(
            "bobs", 1, vc="vision", user="bob", priority=1000, submitted_at=2.0, cpu_milli_per_replica=1_000
        )
        return [(p.job_id, p.for_job) for p in decide(snap.build(), PRIORITY, now=10_000.0).preemptions]

    assert preemptions(False) == preemptions(True) == [("low", "bobs")]


def test_the_ends_of_shares_do_not_give_back_a_whole_gpu_each() -> None:
    """alice holds one GPU in four quarter shares (ending at 100 to 400 s) and one whole GPU:
    2 of her 2. Her next job cannot start before every share has ended, whatever the estimate
    errs by."""
    snap = Snap().nodes(2, 8).vc("vision", 16, max_gpus_per_user=2)
    for k, end in enumerate((100.0, 200.0, 300.0, 400.0)):
        snap = snap.running(f"share-{k}", [("n0", (0,))], vc="vision", gpu_share_milli=250, time_limit_s=end)
    snap = snap.running("whole", [("n0", (1,))], vc="vision", time_limit_s=5_000.0)
    start = estimated_starts(snap.pending("next", 1, vc="vision", submitted_at=1.0))["next"]
    assert start is not None and start >= 400.0


def test_a_hint_is_not_estimated_sooner_than_its_users_cap_allows() -> None:
    """alice's A100 job waits for her CPU (48 of 64 held until 10,000 s; it needs 32). On the
    H100, free at 1,000 s, the same request is still over her cap, so no hint may promise it
    before 10,000 s."""
    snap = (
        Snap()
        .node("a0", 2, "A100")
        .node("h0", 1, "H100")
        .vc("vision", 4, max_cpu_milli_per_user=64_000)
        .running(
            "r",
            [("a0", (0,))],
            vc="vision",
            gpu_model="A100",
            cpu_milli_per_replica=48_000,
            time_limit_s=10_000.0,
        )
        .running("b", [("a0", (1,))], vc="vision", user="bob", gpu_model="A100", time_limit_s=5_000.0)
        .running("bh", [("h0", (0,))], vc="vision", user="bob", gpu_model="H100", time_limit_s=1_000.0)
        .pending(
            "j",
            1,
            vc="vision",
            gpu_model="A100",
            submitted_at=1.0,
            cpu_milli_per_replica=32_000,
            time_limit_s=600.0,
        )
    )
    (status,) = decide(snap.build(), FIFO, now=10.0).pending
    assert (status.reason, status.estimated_start) == (ReasonCode.USER_LIMIT, 10_000.0)
    assert all(h.estimated_start is not None and h.estimated_start >= 10_000.0 for h in status.hints), (
        status.hints
    )

"""The cycle's shortcuts give the same answers as the long way round.

A long queue is decided fast because the cycle reuses answers: a blocked job's outcome for
later jobs with the same request while the state is unchanged, what a node offers a request
of one shape until that node changes, GPU choices and scores per node layout and free GPUs,
queue keys and preemption horizons computed for the whole queue at once, a preemption search
that takes one victim back per trial and asks only whether a single replica fits (first
feasible node, unscored), sort keys concatenated column by column, pending statuses written
through their slots, a queue already in arrival order not sorted again, shared key tuples,
and the estimate's releases ordered by sorting positions by time. Each is checked here
against the plain computation, including a state that changes in the middle of the walk.
"""

from __future__ import annotations

import dataclasses
import gc
import random
from collections.abc import Iterator, Mapping, Sequence

import pytest
from sched_builders import Snap, profile, with_cycle

from bench.scheduler_scale import build_snapshot
from scheduler.core import (
    FinishedService,
    Gpu,
    JobId,
    Node,
    NodeName,
    PendingJob,
    PendingStatus,
    Plan,
    Profile,
    ReasonCode,
    ReplicaPlacement,
    RunningJob,
    Snapshot,
    UserName,
    VcName,
    decide,
    load_profile,
)
from scheduler.core import cycle as cycle_module
from scheduler.core import estimate as estimate_module
from scheduler.core.framework import CycleContext, Status
from scheduler.core.plugins import queue_sort as queue_sort_module
from scheduler.core.plugins.placement import (
    BuddyCells,
    BuddyChooser,
    TopologyAffinity,
    TopologyChooser,
    choose_buddy,
    choose_by_topology,
)
from scheduler.core.plugins.queue_sort import (
    DiscretizedLas,
    DominantResourceFairness,
    Fifo,
    GittinsIndex,
    GuaranteeFirst,
    PriorityClass,
    ShortestExpectedFirst,
)
from scheduler.core.plugins.sharing import FragmentationGradient, node_free_vector
from scheduler.core.state import GpuHold, NodeSlot, SharedGpu, build_state

NOW = 100_000.0


def random_jobs(rng: random.Random, count: int) -> list[PendingJob]:
    return [
        PendingJob(
            JobId(f"p{k}"),
            VcName(f"vc{k % 3}"),
            UserName(f"u{k % 5}"),
            replicas=rng.choice([1, 1, 2]),
            gpus_per_replica=rng.choice([1, 2, 4, 8]),
            submitted_at=float(rng.randint(0, 1000)),
            priority=rng.choice([0, 100, 500]),
            estimated_runtime_s=rng.choice([None, 600.0, 90_000.0]),
            time_limit_s=rng.choice([None, 3600.0]),
            attained_gpu_s=rng.choice([0.0, 500.0, 20_000.0, 4_000_000.0]),
            queued_at=rng.choice([None, float(rng.randint(0, int(NOW)))]),
        )
        for k in range(count)
    ]


def random_running(rng: random.Random, count: int) -> list[RunningJob]:
    return [
        RunningJob(
            JobId(f"r{k}"),
            VcName(f"vc{k % 3}"),
            UserName(f"u{k % 5}"),
            (),
            started_at=float(rng.randint(0, 50_000)),
            priority=rng.choice([0, 100, 500]),
            preemptible=rng.random() < 0.8,
            attained_gpu_s=float(rng.randint(0, 2_000_000)),
        )
        for k in range(count)
    ]


def context(pending: list[PendingJob], running: list[RunningJob]) -> CycleContext:
    snapshot = build_snapshot(8, 0)
    snapshot = Snapshot(snapshot.nodes, snapshot.vcs, tuple(running), tuple(pending))
    state, _ = build_state(snapshot)
    return CycleContext(snapshot, NOW, state, {r.id: r for r in running}, {r.id: r.gpus for r in running})


def queue_sorters() -> Iterator[object]:
    yield Fifo({})
    yield Fifo({"by_requeue_time": True})
    yield PriorityClass({})
    yield DiscretizedLas({"thresholds": [900, 3600, 57600], "service": "gpu_time"})
    yield DiscretizedLas({"thresholds": [3600], "service": "time", "starvation_factor": 2})
    yield DiscretizedLas({"thresholds": [3600, 36000], "order_in_queue": "service"})
    yield DiscretizedLas({"thresholds": [900, 3600, 57600], "group_window_s": 2000, "preempt_levels": 2})
    yield ShortestExpectedFirst({"by": "gpu_time"})
    yield DominantResourceFairness({})
    yield GuaranteeFirst({})


@pytest.mark.parametrize("seed", range(5))
def test_whole_queue_keys_equal_one_call_per_job(seed: int) -> None:
    rng = random.Random(seed)
    pending, running = random_jobs(rng, 200), random_running(rng, 50)
    for plugin in queue_sorters():
        ctx = context(pending, running)
        plugin.prepare(ctx)  # type: ignore[attr-defined]
        one_by_one = [plugin.sort_key(job, ctx) for job in pending]  # type: ignore[attr-defined]
        assert plugin.sort_keys(pending, ctx) == one_by_one  # type: ignore[attr-defined]
        if hasattr(plugin, "horizon_keys"):
            assert plugin.horizon_keys(pending, ctx) == [plugin.horizon_key(j, ctx) for j in pending]
            for job in pending[:20]:
                expected = [plugin.yields_at(job, victim, ctx) for victim in running]
                assert plugin.yields_at_all(job, running, ctx) == expected


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("service", ["gpu_time", "time"])
@pytest.mark.parametrize("group_window_s", [0, 2000])
@pytest.mark.parametrize("plugin_class", [GittinsIndex, DiscretizedLas])
def test_gittins_yields_for_a_whole_list_equal_one_call_per_victim(
    seed: int, service: str, group_window_s: int, plugin_class: type[DiscretizedLas]
) -> None:
    """The Gittins plugin groups the victims once per list; every kind asking about the same
    list must get what it would get victim by victim, in the list's order. With a group
    window of 2,000 s every job is in one window, so many waiting jobs have a group running
    and rise through the queues while they wait; LAS answers through the same spans."""
    rng = random.Random(seed)
    pending = random_jobs(rng, 60)
    running = [
        dataclasses.replace(
            job,
            placement=(ReplicaPlacement(NodeName("node00000"), tuple(range(rng.choice([1, 2, 4, 8])))),),
        )
        for job in random_running(rng, 80)
    ]
    history = FinishedService(
        tuple((w, w * rng.lognormvariate(8.0, 2.0)) for w in (rng.choice([1, 2, 4, 8]) for _ in range(400)))
    )
    ctx = context(pending, running)
    ctx = dataclasses.replace(ctx, snapshot=dataclasses.replace(ctx.snapshot, finished=history))
    plugin = plugin_class(
        {"thresholds": [900 * 2**k for k in range(10)], "service": service, "group_window_s": group_window_s}
    )
    plugin.prepare(ctx)
    assert plugin.horizon_keys(pending, ctx) == [plugin.horizon_key(job, ctx) for job in pending]
    if group_window_s:
        assert any(len(plugin.waiting_levels(job, NOW)) > 1 for job in pending)
    victims = list(running)
    answers = set()
    for job in pending:
        expected = [plugin.yields_at(job, victim, ctx) for victim in victims]
        assert plugin.yields_at_all(job, victims, ctx) == expected
        answers.add(tuple(expected))
    assert len(answers) > 3  # the kinds asked about do differ
    # A different list (one job fewer) is grouped anew, not answered from the first one.
    shorter = victims[1:]
    assert plugin.yields_at_all(pending[0], shorter, ctx) == [
        plugin.yields_at(pending[0], victim, ctx) for victim in shorter
    ]


def slot(idx: int, free: set[int], nvlink: int = 4) -> NodeSlot:
    gpus = {i: Gpu(i, "A100", f"G{idx}-{i}", 0, i // nvlink, i // 2, i // 4) for i in range(8)}
    node = Node(NodeName(f"n{idx}"), tuple(gpus.values()))
    return NodeSlot(idx, node, True, {"A100": set(free)}, gpus, None, None)


@pytest.mark.parametrize("strict", [False, True])
def test_remembered_gpu_choices_and_scores_equal_fresh_ones(strict: bool) -> None:
    rng = random.Random(7)
    buddy, topology = BuddyChooser({"strict": strict}), TopologyChooser({})
    cells, affinity = BuddyCells({}), TopologyAffinity({})
    ctx = context([], [])
    for step in range(400):
        free = {i for i in range(8) if rng.random() < 0.5}
        node = slot(step % 5, free, nvlink=rng.choice([2, 4]))
        for count in (1, 2, 3, 4, 8):
            chosen = buddy.choose(node.free["A100"], node, count)
            assert chosen == choose_buddy(node.free["A100"], node, count, strict)
            assert topology.choose(node.free["A100"], node, count) == choose_by_topology(
                node.free["A100"], node, count
            )
            if chosen:
                fresh_cells, fresh_affinity = BuddyCells({}), TopologyAffinity({})
                assert cells.score(node, "A100", chosen, [], ctx) == fresh_cells.score(
                    node, "A100", chosen, [], ctx
                )
                assert affinity.score(node, "A100", chosen, [], ctx) == fresh_affinity.score(
                    node, "A100", chosen, [], ctx
                )


FGD_WORKLOAD = [
    {"gpus": 1, "share_milli": 0, "cpu_milli": 4000, "weight": 5},
    {"gpus": 0, "share_milli": 500, "cpu_milli": 2000, "weight": 3},
    {"gpus": 2, "share_milli": 0, "cpu_milli": 8000, "model": "T4", "weight": 2},
]


def test_remembered_fgd_scores_equal_the_gradient_computed_anew() -> None:
    """The FGD score remembers its answers per free vector, headroom and models: the same as
    the fragmentation after minus before, through the sigmoid, on nodes with unhealthy and
    shared GPUs, tracked CPU and replicas of a gang already placed."""
    rng = random.Random(11)
    remembering = FragmentationGradient({"workload": FGD_WORKLOAD, "memory": True})
    remembering.prepare(context([], []))
    ctx = context([], [])
    for step in range(600):
        unhealthy = {i for i in range(8) if rng.random() < 0.1}
        gpus = {
            i: Gpu(
                i,
                rng.choice(["A100", "A100", "T4"]) if step % 2 else "A100",
                f"G{i}",
                healthy=i not in unhealthy,
            )
            for i in range(8)
        }
        free = {i for i in range(8) if i not in unhealthy and rng.random() < 0.6}
        by_model: dict[str, set[int]] = {}
        for i in free:
            by_model.setdefault(gpus[i].model, set()).add(i)
        shared = {
            i: SharedGpu(rng.choice([200, 500, 700]), 0, "t")
            for i in range(8)
            if i not in free and i not in unhealthy and rng.random() < 0.3
        }
        node = NodeSlot(
            step % 7,
            Node(NodeName(f"n{step % 7}"), tuple(gpus.values())),
            True,
            by_model,
            gpus,
            rng.choice([None, 2000, 6000, 12000]),
            rng.choice([None, 64_000]),
            shared,
        )
        placed = [GpuHold(0, "A100", (0,), rng.choice([0, 1000, 4000]), 1024, "vc", "u")] if step % 3 else []
        ctx.placing = random_jobs(rng, 1)[0]
        for model, indices in by_model.items():
            chosen = tuple(sorted(indices)[: rng.choice([1, 2, 4])])
            fresh = FragmentationGradient({"workload": FGD_WORKLOAD, "memory": True})
            vector = node_free_vector(node)
            expected = 50.0
            if vector:
                after = list(vector)
                healthy = [i for i in sorted(gpus) if gpus[i].healthy]
                for index in chosen:
                    after[healthy.index(index)] = 0
                cpu, memory = (placed[0].cpu_milli, placed[0].memory_mib) if placed else (0, 0)
                expected = fresh.score_of(
                    fresh.node_fragmentation(node, after, cpu, memory)
                    - fresh.node_fragmentation(node, vector)
                )
            assert remembering.score(node, model, chosen, placed, ctx) == expected


def decide_the_long_way(
    snapshot: Snapshot, profile_: Profile, now: float, monkeypatch: pytest.MonkeyPatch
) -> Plan:
    """decide() with outcome reuse off, every node assessed anew for every job, the
    preemption search releasing all victims anew and placing every trial in full (scored),
    sort keys added up job by job, pending statuses built by their constructor, the queue
    sorted by arrival every time, and the estimate's running releases sorted as (time,
    position, job) tuples at each change of horizon key."""
    original_init = cycle_module._CycleRun.__init__
    original_place = cycle_module._CycleRun._place

    def init(self: cycle_module._CycleRun, *args: object) -> None:
        original_init(self, *args)  # type: ignore[arg-type]
        self._reuse_outcomes = False
        self._node_answers = None

    def place(
        self: cycle_module._CycleRun, job: PendingJob, model: str, statement: object, any_fit: bool = False
    ) -> Status:
        return original_place(self, job, model, statement)  # type: ignore[arg-type]

    def keys_added_up(
        columns: Sequence[Sequence[tuple[float, ...]]], jobs: Sequence[PendingJob]
    ) -> list[tuple[object, ...]]:
        tails = [(job.submitted_at, job.id) for job in jobs]
        return [sum(parts, ()) for parts in zip(*columns, tails, strict=True)]

    def statuses(
        queue: Sequence[PendingJob],
        started: Mapping[str, str],
        reasons: Mapping[str, Status],
        estimates: Mapping[str, float | None],
        hints: Mapping[str, tuple[object, ...]],
    ) -> tuple[PendingStatus, ...]:
        return tuple(
            PendingStatus(
                job.id,
                reasons[job.id].reason or ReasonCode.QUEUED_BEHIND,
                reasons[job.id].message,
                estimates.get(job.id),
                hints.get(job.id, ()),  # type: ignore[arg-type]
            )
            for job in queue
            if job.id not in started
        )

    with monkeypatch.context() as patch:
        patch.setattr(cycle_module._CycleRun, "__init__", init)
        patch.setattr(cycle_module._CycleRun, "_holds_disjoint", lambda self: False)
        patch.setattr(cycle_module._CycleRun, "_place", place)
        patch.setattr(
            cycle_module,
            "_lexicographic_order",
            lambda columns, jobs: sorted(range(len(jobs)), key=keys_added_up(columns, jobs).__getitem__),
        )
        patch.setattr(cycle_module, "_pending_statuses", statuses)
        patch.setattr(
            queue_sort_module, "by_arrival", lambda jobs: sorted(jobs, key=queue_sort_module._ARRIVAL)
        )
        patch.setattr(estimate_module, "_has_nan", lambda times: True)
        return decide(snapshot, profile_, now)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("profile_name", ["default", "tiresias"])
def test_shortcuts_decide_as_the_long_way(
    seed: int, profile_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    many_attempts = with_cycle(load_profile(profile_name), max_preemption_attempts=40)
    snapshot = build_snapshot(24, 600, busy=0.97, seed=seed)
    plan = decide(snapshot, many_attempts, NOW)
    assert plan.preemptions, "the case should exercise the preemption search"
    assert plan == decide_the_long_way(snapshot, many_attempts, NOW, monkeypatch)


@pytest.mark.parametrize("seed", range(4))
def test_shortcuts_decide_as_the_long_way_on_a_shuffled_queue_of_tied_arrivals(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrival ties and a queue out of order take the sorting path; the estimates are kept."""
    rng = random.Random(seed)
    snapshot = build_snapshot(16, 400, busy=0.95, seed=seed)
    pending = [
        dataclasses.replace(
            job, submitted_at=float(int(job.submitted_at) // 5), priority=rng.choice([0, 100])
        )
        for job in snapshot.pending
    ]
    rng.shuffle(pending)
    snapshot = Snapshot(snapshot.nodes, snapshot.vcs, snapshot.running, tuple(pending))
    plan = decide(snapshot, load_profile("default"), NOW)
    assert any(status.estimated_start is not None for status in plan.pending)
    assert plan == decide_the_long_way(snapshot, load_profile("default"), NOW, monkeypatch)


@pytest.mark.parametrize("seed", range(5))
def test_a_queue_in_arrival_order_is_not_sorted_again(seed: int) -> None:
    rng = random.Random(seed)
    jobs = random_jobs(rng, 100)
    by_key = sorted(jobs, key=queue_sort_module._ARRIVAL)
    assert list(queue_sort_module.by_arrival(jobs)) == by_key
    assert list(queue_sort_module.by_arrival(by_key)) == by_key  # ties: sorted again
    rising = [dataclasses.replace(job, submitted_at=float(k)) for k, job in enumerate(jobs)]
    assert queue_sort_module.by_arrival(rising) is rising
    rising[50] = dataclasses.replace(rising[50], submitted_at=float("nan"))
    assert queue_sort_module.by_arrival(rising) == sorted(rising, key=queue_sort_module._ARRIVAL)


def test_estimate_releases_in_time_then_position_order() -> None:
    """Positions sorted by time alone give the order of (time, position) tuples."""
    rng = random.Random(7)
    times = [float(rng.choice([0, 5, 5, 9, 12])) for _ in range(200)]
    positions = sorted(range(len(times)), key=times.__getitem__)
    assert [(times[i], i) for i in positions] == sorted((t, i) for i, t in enumerate(times))
    assert estimate_module._has_nan([1.0, float("nan")]) and not estimate_module._has_nan(times)


def test_sort_keys_of_uneven_widths_are_added_up() -> None:
    jobs = random_jobs(random.Random(3), 4)
    columns = [[(1.0,), (1.0, 2.0), (0.5,), ()], [(3.0,)] * 4]
    expected = [
        (*sum(parts, ()), job.submitted_at, job.id) for *parts, job in zip(*columns, jobs, strict=True)
    ]
    assert cycle_module._concatenated_keys(columns, jobs) == expected
    even = [[(float(i), 2.0) for i in range(4)], [(1.0,)] * 4]
    expected = [(*sum(parts, ()), job.submitted_at, job.id) for *parts, job in zip(*even, jobs, strict=True)]
    assert cycle_module._concatenated_keys(even, jobs) == expected


SPOILERS: dict[str, list[tuple[object, ...]]] = {
    "none": [],
    "nan": [(float("nan"), 1.0)],
    "infinities": [(float("inf"), 1.0), (float("-inf"), 2.0)],
    "uneven": [(1.0,), (1.0, 2.0, 3.0)],
}


@pytest.mark.parametrize("spoiler", SPOILERS)
@pytest.mark.parametrize("arrivals", ["tied-and-shuffled", "rising", "nan-times"])
def test_the_queue_order_sorted_element_by_element_is_that_of_the_concatenated_keys(
    spoiler: str, arrivals: str
) -> None:
    """Few distinct values per element (as priorities and queues have), ints beside floats,
    and columns or submission times that take the slow way (a NaN, an infinity of each sign,
    uneven widths)."""
    rng = random.Random(f"{spoiler}-{arrivals}")
    jobs = [dataclasses.replace(job, submitted_at=float(rng.randrange(40))) for job in random_jobs(rng, 300)]
    if arrivals == "rising":
        jobs.sort(key=queue_sort_module._ARRIVAL)
        jobs = [dataclasses.replace(job, submitted_at=float(k)) for k, job in enumerate(jobs)]
    if arrivals == "nan-times":  # an order stable sorting does not keep (tuples treat NaN apart)
        for k in (7, 90, 211):
            jobs[k] = dataclasses.replace(jobs[k], submitted_at=float("nan"))
    columns: list[list[tuple[object, ...]]] = [
        [(rng.choice([0, 100, -0.0, 0.0]),) for _ in jobs],
        [(rng.choice([0.0, 1.0]), float(rng.randrange(5))) for _ in jobs],
        [(rng.choice([0.25, 0.5, 2.0]),) for _ in jobs],  # ties left for the arrival order
    ]
    for key in SPOILERS[spoiler]:
        columns[1][rng.randrange(len(jobs))] = key
    keys = cycle_module._concatenated_keys(columns, jobs)
    assert cycle_module._lexicographic_order(columns, jobs) == sorted(range(len(jobs)), key=keys.__getitem__)


def test_only_numbers_that_add_up_to_a_number_are_sorted_alone() -> None:
    plain = cycle_module._plain_numbers
    assert plain([1, 2.5, -0.0]) and plain([])
    assert not plain([1.0, float("nan")]) and not plain([float("inf"), float("-inf")])
    assert not plain(["a", "b"]) and not plain([(1.0,), (2.0,)])


def test_the_collector_is_paused_for_a_cycle_only() -> None:
    snapshot = build_snapshot(8, 50)
    seen: list[bool] = []
    original = cycle_module._decide

    def spy(*args: object) -> Plan:
        seen.append(gc.isenabled())
        return original(*args)  # type: ignore[arg-type]

    assert gc.isenabled()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_module, "_decide", spy)
        decide(snapshot, load_profile("default"), NOW)
        assert seen == [False] and gc.isenabled()
        gc.disable()
        try:
            decide(snapshot, load_profile("default"), NOW)
            assert not gc.isenabled(), "a caller that paused the collector keeps it paused"
        finally:
            gc.enable()
        patch.setattr(cycle_module, "_decide", lambda *args: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            decide(snapshot, load_profile("default"), NOW)
        assert gc.isenabled()


def test_a_preempted_job_s_vc_gains_no_quota_in_the_cycle_that_preempts_it() -> None:
    """`a-1` reclaims VC a's guarantee from `b-borrowed`, which keeps its GPUs through the grace
    period. `b-2` asks what `b-1` asked and is refused for the same reason: b still holds all 8
    (the reclaim hands b's quota back only when the job is gone; before, b-2 was offered the
    quota and only lacked GPUs, and a later start could have taken b above its limit)."""
    snapshot = (
        Snap()
        .node("n0", 8)
        .node("n1", 2)
        .vc("a", 4, 4)
        .vc("b", 4, 4)
        .running("b-borrowed", [("n0", tuple(range(8)))], vc="b", started_at=0.0)
        .pending("b-1", 1, vc="b", submitted_at=1.0)
        .pending("a-1", 4, vc="a", submitted_at=2.0)
        .pending("b-2", 1, vc="b", submitted_at=3.0)
        .build()
    )
    plan = decide(snapshot, profile(queue_sort=["fifo"], preemption=["reclaim"]), 60.0)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("b-borrowed", "reclaim")]
    assert not plan.starts  # n1 has 2 free GPUs, but b's quota is taken until b-borrowed is gone
    reasons = {status.job_id: status.reason for status in plan.pending}
    assert reasons["b-1"] is ReasonCode.VC_QUOTA
    assert reasons["a-1"] is ReasonCode.WAITING_FOR_PREEMPTION
    assert reasons["b-2"] is ReasonCode.VC_QUOTA


def test_a_blocked_outcome_is_not_reused_after_a_start_changes_the_free_gpus() -> None:
    """`big-2` asks what `big-1` asked, and is blocked for the same reason, but `small` has
    started in between: its reason must tell the GPUs free now, not those free before."""
    snapshot = (
        Snap()
        .node("n0", 8)
        .running("busy", [("n0", (0, 1, 2, 3, 4))], submitted_at=0.0)
        .pending("big-1", 4, submitted_at=1.0)
        .pending("small", 1, submitted_at=2.0)
        .pending("big-2", 4, submitted_at=3.0)
        .build()
    )
    plan = decide(snapshot, profile(queue_sort=["fifo"]), 60.0)
    assert [start.job_id for start in plan.starts] == ["small"]
    messages = {status.job_id: status.message for status in plan.pending}
    assert "3 of 8 free" in messages["big-1"]
    assert "2 of 8 free" in messages["big-2"]


def test_a_node_s_answer_is_not_reused_once_a_job_lands_on_it() -> None:
    """Jobs of one shape look at the same node in turn: each must see the GPUs the one before
    took, so the answers the cycle keeps per node are dropped when the node changes."""
    snapshot = (
        Snap()
        .node("n0", gpus_=8)
        .pending("a", gpus_=2, submitted_at=1.0)
        .pending("b", gpus_=2, submitted_at=2.0)
        .pending("c", gpus_=2, submitted_at=3.0)
        .pending("d", gpus_=2, submitted_at=4.0)
        .build()
    )
    plan = decide(snapshot, load_profile("default"), NOW)
    assert len(plan.starts) == 4
    taken = [i for start in plan.starts for replica in start.placement for i in replica.gpu_indices]
    assert sorted(taken) == list(range(8))

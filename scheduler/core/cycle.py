"""The scheduling cycle: `decide(snapshot, profile, now) -> Plan`.

One cycle, in numbered steps (the comments in `decide` carry the numbers):

1. Build the working state from the snapshot: free GPUs per node and model, fit indexes,
   and quota usage per VC and user. The snapshot itself is never changed.
2. Work out which running jobs borrow GPUs above their VC's guarantee.
3. Order the queue with the queue-sort plugins; VCs with their own queueing policy reorder
   their jobs inside the positions the profile gave them.
4. Walk the queue. For each job: admission (quota), the backfill gate, then gang placement
   through a Statement (filter, choose GPUs, score, reserve replica by replica; all replicas
   or none). A placed job is committed into a Start.
5. A blocked job may look for victims (preemption plugins), whole gangs only; the freed GPUs
   are held for it while the victims get their grace period.
6. The first job blocked for lack of GPUs gets the backfill reservation, if the profile has one.
7. Post-cycle plugins say when the next cycle is due even without new events.
8. Every job that did not start gets a reason and an estimated start from a forward
   simulation of the resulting state.
9. The first blocked jobs whose reason names a resource shape get what-if hints: changed
   requests tried against the resulting state (see whatif.py).

The core reads no clock and no global state: same snapshot, profile and `now`, same plan.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import attrgetter, itemgetter, lt
from typing import Any, NamedTuple

from scheduler.core.estimate import estimate_starts
from scheduler.core.framework import (
    SUCCESS,
    Code,
    CycleContext,
    PreemptionHorizonPlugin,
    PreemptionPlugin,
    QueueSortPlugin,
    RotationPlugin,
    Status,
)
from scheduler.core.plugins.admission import UserLimit, model_label
from scheduler.core.plugins.placement import node_resources_fit
from scheduler.core.plugins.sharing import WHOLE, ShareCandidate
from scheduler.core.plugins.timeslice import gpus_of
from scheduler.core.profile import PluginSet, Profile
from scheduler.core.registry import build_plugin
from scheduler.core.state import ClusterState, GpuHold, NodeSlot, build_state, whole_gpus
from scheduler.core.statement import Statement
from scheduler.core.types import (
    ALL_MODELS,
    ANY_MODEL,
    Gpu,
    JobId,
    NodeState,
    PendingJob,
    PendingStatus,
    Plan,
    Preemption,
    ReasonCode,
    ReplicaPlacement,
    RunningJob,
    Snapshot,
    Start,
    Suspend,
    WhatIfHint,
)
from scheduler.core.whatif import HINT_REASONS, Proposals, Trial, choose, propose

_CAPACITY_REASONS = frozenset(
    {ReasonCode.INSUFFICIENT_GPUS, ReasonCode.FRAGMENTATION, ReasonCode.GANG_NODES, ReasonCode.NODE_RESOURCES}
)
_QUOTA_REASONS = frozenset({ReasonCode.VC_QUOTA, ReasonCode.USER_LIMIT})
# A job blocked by GPUs other VCs keep may preempt where its priority allows (a borrower of
# any VC frees GPUs it may take; a lender's job only adds to what is kept).
_PREEMPTION_REASONS = _CAPACITY_REASONS | _QUOTA_REASONS | {ReasonCode.NOT_LENT}
_LAYOUT_REASONS = frozenset({ReasonCode.FRAGMENTATION, ReasonCode.GANG_NODES})


def decide(snapshot: Snapshot, profile: Profile, now: float) -> Plan:
    """Run one scheduling cycle over an immutable snapshot and return what to do.

    The garbage collector is paused for the cycle (and turned back on only if it was on): a
    cycle allocates hundreds of thousands of short-lived objects, nearly all freed by
    reference counting, and each collection they triggered would traverse the snapshot's
    tens of thousands of live jobs again, about a tenth of the cycle. Nothing the cycle
    decides depends on it."""
    check_unique_ids(snapshot)
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        return _decide(snapshot, profile, now)
    finally:
        if collecting:
            gc.enable()


def check_unique_ids(snapshot: Snapshot) -> None:
    """Raise ValueError naming a job id that occurs twice among the snapshot's running and
    pending jobs. The cycle keys everything by id: two pending jobs of one id got two Starts,
    and a pending job with a running job's id was started again while it ran. The portal's
    and the simulator's ids are unique, so a duplicate is a caller's bug, better reported
    than turned into a wrong plan. One set over all jobs: a few ms for 50,000 jobs."""
    ids = [job.id for job in snapshot.running]
    ids.extend(job.id for job in snapshot.pending)
    if len(set(ids)) == len(ids):
        return
    seen: set[str] = set()
    for job_id in ids:
        if job_id in seen:
            raise ValueError(f"job id {job_id!r} occurs more than once in the snapshot (running and pending)")
        seen.add(job_id)


def spread_waited_jobs(snapshot: Snapshot, now: float) -> Snapshot:
    """The snapshot with every job that has waited past its `spread_after_s` asking for one
    GPU per replica instead (the same GPUs; CPU and memory divided, rounded up).

    Placement then scores the replicas by the profile's scores; under `default` the affinity
    score keeps them on one node or one switch when there is room there, so they spread only
    when there is not: Slurm's `--switches=N@max-time` and Philly's locality relaxed after a
    wait. (A profile that weighs packing as much as affinity fills partly used nodes first.)
    A job requeued later waits for its own shape again, from its new queueing time."""
    pending = snapshot.pending
    if not any(job.spread_after_s is not None for job in pending):
        return snapshot
    changed = False
    spread: list[PendingJob] = []
    for job in pending:
        per = job.gpus_per_replica
        if job.spread_after_s is None or per <= 1 or now - job.waiting_since < job.spread_after_s:
            spread.append(job)
            continue
        changed = True
        spread.append(
            dataclasses.replace(
                job,
                replicas=job.replicas * per,
                gpus_per_replica=1,
                cpu_milli_per_replica=-(-job.cpu_milli_per_replica // per),
                memory_mib_per_replica=-(-job.memory_mib_per_replica // per),
            )
        )
    return dataclasses.replace(snapshot, pending=tuple(spread)) if changed else snapshot


def own_order_evictors(ctx: CycleContext, plugins: PluginSet) -> dict[str, list[Any]]:
    """Per VC with a queueing policy of its own: the only preemption rule between two of its
    jobs of one priority class. That policy orders them (queue_positions), so it alone may
    let one take another's GPUs: LAS does once the runner has dropped queues, FIFO, priority
    and shortest-expected-first never do. Otherwise a VC set to FIFO would still see a newer
    job preempt an older one for the profile's Gittins index. Built after queue_positions,
    which makes the VCs' sorters."""
    evictors: dict[str, list[Any]] = {}
    for vc in ctx.snapshot.vcs:
        order = plugins.by_name.get(vc.queueing_policy) if vc.queueing_policy else None
        if order is not None:
            evictors[vc.name] = [order] if isinstance(order, PreemptionPlugin) else []
    return evictors


DRAIN = "drain"  # the reason of a preemption that moves a job off a draining node
_DRAIN_MESSAGE = (
    "node {node} is being drained: the job checkpoints and stops, and then waits to start again "
    "elsewhere from its checkpoint"
)
VC_DRAIN = "vc-drain"  # the reason of a preemption that empties a VC stopped with a drain
_VC_DRAIN_MESSAGE = (
    "VC {vc} was stopped and drained by an admin: the job checkpoints and stops, and waits to "
    "start again from its checkpoint once the VC is open"
)
HOLD, HOLD_AND_DRAIN = "hold", "hold-and-drain"  # VirtualCluster.stop_policy


_EVICTED = (
    "the GPUs it is suspended on went to a job ranked before it: it checkpoints and stops, and "
    "then waits to start again from its checkpoint"
)


class Drains(NamedTuple):
    """What empties this cycle: draining nodes and VCs stopped with a drain (by name)."""

    nodes: set[str]
    vcs: set[str]


def drains_of(snapshot: Snapshot) -> Drains:
    return Drains(
        {node.name for node in snapshot.nodes if node.state is NodeState.DRAINING},
        {vc.name for vc in snapshot.vcs if vc.stop_policy == HOLD_AND_DRAIN},
    )


def leave_draining_nodes(
    snapshot: Snapshot, drains: Drains, grace_period_s: float
) -> tuple[Snapshot, list[Preemption]]:
    """The snapshot with every running job that has a replica on a draining node, or that is of
    a VC stopped with a drain, told to stop, and those preemptions. A drain (an admin's, or an
    agent's whose runtime failed the version gate) empties the node, where a cordon only keeps
    new work away; so it moves jobs that are not preemptible too, past or before their minimum
    runtime. The jobs then count as stopping for the rest of the cycle, as if told in an
    earlier one: their GPUs are soon free and no one preempts them again. (Suspended jobs
    parked there: _CycleRun.leave_draining_nodes.)"""
    draining, drained_vcs = drains
    if not draining and not drained_vcs:
        return snapshot, []
    preemptions: list[Preemption] = []
    running: list[RunningJob] = []
    for job in snapshot.running:
        on = next((r.node for r in job.placement if r.node in draining), None)
        if job.stopping or (on is None and job.vc not in drained_vcs):
            running.append(job)
            continue
        running.append(dataclasses.replace(job, stopping=True))
        if on is not None:
            preemptions.append(
                Preemption(job.id, DRAIN, _DRAIN_MESSAGE.format(node=on), grace_period_s, JobId(""))
            )
        else:
            message = _VC_DRAIN_MESSAGE.format(vc=job.vc)
            preemptions.append(Preemption(job.id, VC_DRAIN, message, grace_period_s, JobId("")))
    if not preemptions:
        return snapshot, []
    return dataclasses.replace(snapshot, running=tuple(running)), preemptions


def _decide(snapshot: Snapshot, profile: Profile, now: float) -> Plan:
    # 0. Jobs that may spread after a wait and have waited long enough; jobs on draining nodes
    # told to move.
    snapshot = spread_waited_jobs(snapshot, now)
    drains = drains_of(snapshot)
    snapshot, drained = leave_draining_nodes(snapshot, drains, profile.cycle.grace_period_s)
    plugins = profile.build()
    # 1. Working state: every running job's GPUs taken, quota usage counted.
    state, holds = build_state(snapshot)
    # 2. Borrowed GPUs per running job (the ones reclaim may take back).
    ctx = CycleContext(
        snapshot=snapshot,
        now=now,
        state=state,
        running_by_id={job.id: job for job in snapshot.running},
        borrowed_gpus=borrowed_by_job(snapshot, state, holds),
    )
    for plugin in plugins.by_name.values():
        prepare = getattr(plugin, "prepare", None)
        if prepare is not None:
            prepare(ctx)
    # 3. Queue order; jobs of stopped VCs take no part (stopped_statuses).
    positions = queue_positions(snapshot.pending, plugins, ctx, profile)
    stopped = stopped_vcs(snapshot)
    if stopped:
        positions = [i for i in positions if snapshot.pending[i].vc not in stopped]
    queue = [snapshot.pending[i] for i in positions]
    # 4.-6. Admission, placement, preemption, reservation.
    run = _CycleRun(ctx, plugins, profile, holds, stopped)
    run.preemptions.extend(drained)
    run.leave_draining_nodes(drains)
    run.consider_all(queue)
    # 6b. Time-slicing: waiting jobs take turns on the GPUs of their VC's jobs whose quantum is up.
    suspends = run.rotate(queue)
    # 7. Post-cycle hooks.
    wake_times = [t for t in (p.wake_at(ctx) for p in plugins.post_cycle) if t is not None and t > now]
    # 8.-9. Reasons, estimated starts from a forward simulation, and what-if hints: their
    # trial placements come first, their changed requests ride along in the simulation.
    estimates: dict[str, float | None] = {}
    hints: Mapping[str, tuple[WhatIfHint, ...]] = {}
    if profile.cycle.estimate_starts:
        proposals = run.propose_changes(queue, profile.cycle.whatif_max_jobs)
        horizons = [p for p in plugins.preemption if isinstance(p, PreemptionHorizonPlugin)]
        estimates = estimate_starts(
            ctx,
            queue,
            run.started,
            run.waiting,
            holds,
            profile.cycle,
            run.released,
            horizons,
            blocked=run.blocked,
            probes=proposals.probes,
            positions=positions,
            vc_horizons=run.vc_horizons,
            user_limits=any(isinstance(p, UserLimit) for p in plugins.admission),
        )
        hints = choose(proposals, estimates, now)
    return Plan(
        starts=tuple(run.starts),
        # In job id order, as the stopped VCs' statuses: drains and parked jobs are found in
        # snapshot order, and a plan must not depend on it (a few entries to sort).
        preemptions=tuple(sorted(run.preemptions, key=attrgetter("job_id"))),
        pending=_pending_statuses(queue, run.started, run.reasons, estimates, hints)
        + stopped_statuses(snapshot, stopped),
        reservation=run.reserved_for.id if run.reserved_for else None,
        wake_at=min(wake_times) if wake_times else None,
        suspends=tuple(suspends),
    )


# PendingStatus is a frozen dataclass: its generated __init__ sets each field through
# object.__setattr__, about three times the cost of writing the slots directly, and the plan
# holds one status per waiting job (10,000 to 50,000 a cycle). _pending_statuses writes them
# through the slot descriptors instead, every field by name.
_STATUS_FIELDS = ("job_id", "reason", "message", "estimated_start", "hints")
if tuple(f.name for f in dataclasses.fields(PendingStatus)) != _STATUS_FIELDS or hasattr(
    PendingStatus, "__post_init__"
):  # (a __post_init__ would be skipped too)
    raise TypeError("PendingStatus changed: update _STATUS_FIELDS and _pending_statuses")
_STATUS_SETTERS: tuple[Callable[[PendingStatus, Any], None], ...] = tuple(
    getattr(PendingStatus, name).__set__ for name in _STATUS_FIELDS
)


def _pending_statuses(
    queue: Sequence[PendingJob],
    started: Mapping[str, str],
    reasons: Mapping[str, Status],
    estimates: Mapping[str, float | None],
    hints: Mapping[str, tuple[WhatIfHint, ...]],
) -> tuple[PendingStatus, ...]:
    """The plan's status of every job that did not start, in queue order: the same objects
    as PendingStatus(job_id, reason, message, estimated_start, hints)."""
    set_job_id, set_reason, set_message, set_estimate, set_hints = _STATUS_SETTERS
    new = object.__new__
    queued_behind = ReasonCode.QUEUED_BEHIND
    no_hints: tuple[WhatIfHint, ...] = ()
    statuses: list[PendingStatus] = []
    append = statuses.append
    for job in queue:
        job_id = job.id
        if job_id in started:
            continue
        status = reasons[job_id]
        entry = new(PendingStatus)
        set_job_id(entry, job_id)
        set_reason(entry, status.reason or queued_behind)
        set_message(entry, status.message)
        set_estimate(entry, estimates.get(job_id))
        set_hints(entry, hints.get(job_id, no_hints))
        append(entry)
    return tuple(statuses)


def stopped_vcs(snapshot: Snapshot) -> set[str]:
    """VCs none of whose jobs may start: stopped by an admin, or with their budget spent."""
    return {vc.name for vc in snapshot.vcs if vc.stop_policy or vc.budget_message}


def stopped_statuses(snapshot: Snapshot, stopped: set[str]) -> tuple[PendingStatus, ...]:
    """The jobs of stopped VCs (by an admin, or by their spent budget), after the queue and in
    job id order: they wait, with no estimate, until the VC is open again. An admin's stop is
    named first: it outlasts the budget's month."""
    reasons = {
        vc.name: (
            (
                ReasonCode.VC_STOPPED,
                f"VC {vc.name} was stopped by an admin: none of its jobs starts until it is open again",
            )
            if vc.stop_policy
            else (ReasonCode.BUDGET_SPENT, vc.budget_message)
        )
        for vc in snapshot.vcs
        if vc.name in stopped
    }
    waiting = sorted((job for job in snapshot.pending if job.vc in stopped), key=attrgetter("id"))
    return tuple(PendingStatus(job.id, *reasons[job.vc], None) for job in waiting)


def borrowed_by_job(
    snapshot: Snapshot, state: ClusterState, holds: dict[str, list[GpuHold]]
) -> dict[str, int]:
    """GPUs of each running job above its VC's guarantee. The VC's jobs fill the guarantee in
    start order, so the most recently started work is the borrowed (reclaimable) part."""
    groups: dict[tuple[str, str], list[RunningJob]] = {}
    for job in snapshot.running:
        if job.parked:
            continue  # charged to no VC
        job_holds = holds.get(job.id)
        model = job_holds[0].model if job_holds else job.gpu_model
        rows = state.quotas.get(job.vc)
        if rows is None:
            continue
        key_model = model if model in rows else ALL_MODELS
        groups.setdefault((job.vc, key_model), []).append(job)
    borrowed: dict[str, int] = {}
    for (vc, key_model), jobs in groups.items():
        row = state.quotas[vc].get(key_model)
        guaranteed = row.guaranteed if row is not None else 0
        used = 0
        for job in sorted(jobs, key=lambda j: (j.started_at, j.id)):
            before = used
            used += job.gpus
            borrowed[job.id] = max(0, used - guaranteed) - max(0, before - guaranteed)
    return borrowed


def queue_positions(
    pending: Sequence[PendingJob], plugins: PluginSet, ctx: CycleContext, profile: Profile
) -> list[int]:
    """The queue order as positions in `pending`: what stands first in the queue, then second,
    and so on. The cycle keeps them so that work on every job that does not depend on the
    order (the estimator's horizon keys) can run over `pending`, in the order the jobs were
    made, which reads them from memory several times faster than in queue order."""

    def ordered(positions: Sequence[int], sorters: Sequence[QueueSortPlugin]) -> list[int]:
        # One column of keys per plugin, then the order of their concatenation, worked out
        # column by column (_lexicographic_order).
        whole = isinstance(positions, range)  # all of `pending`, in its own order
        jobs = pending if whole else [pending[i] for i in positions]
        columns = [_sort_keys(sorter, jobs, ctx) for sorter in sorters]
        order = _lexicographic_order(columns, jobs)
        return order if whole else [positions[k] for k in order]

    order = ordered(range(len(pending)), plugins.queue_sort)
    for vc in ctx.snapshot.vcs:
        if not vc.queueing_policy:
            continue
        sorter = plugins.by_name.get(vc.queueing_policy)
        if sorter is None:
            sorter = build_plugin(vc.queueing_policy, profile.plugin_args.get(vc.queueing_policy, {}))
            if not isinstance(sorter, QueueSortPlugin):
                raise ValueError(f"VC {vc.name}: {vc.queueing_policy!r} is not a queue-sort plugin")
            sorter.prepare(ctx)
            plugins.by_name[vc.queueing_policy] = sorter
        assert isinstance(sorter, QueueSortPlugin)
        places = [k for k, i in enumerate(order) if pending[i].vc == vc.name]
        own = ordered([order[k] for k in places], [sorter])
        # A VC's policy orders its jobs within a priority class, never across classes: a
        # production job preempts for its GPUs and must not lose them to the job it preempted.
        own.sort(key=lambda i: -pending[i].priority)
        for k, i in zip(places, own, strict=True):
            order[k] = i
    if any(job.topped_at is not None for job in pending):
        _owners_order(order, pending)
    if any(job.first_in_line or job.moved for job in pending):
        # Jobs that GPUs were freed for go first, then moved jobs, each in the order above.
        order.sort(key=lambda i: 0 if pending[i].first_in_line else 1 if pending[i].moved else 2)
    return order


def _owners_order(order: list[int], pending: Sequence[PendingJob]) -> None:
    """Jobs their owner moved to the front (`topped_at`) go first among the owner's jobs of
    one VC and priority class, the latest moved first, the rest as they were, all within the
    places those jobs held: an owner reorders only their own jobs, never ahead of anyone."""
    topped = {(job.vc, job.user, job.priority) for job in pending if job.topped_at is not None}
    places: dict[tuple[str, str, int], list[int]] = {}
    for k, i in enumerate(order):
        job = pending[i]
        key = (job.vc, job.user, job.priority)
        if key in topped:
            places.setdefault(key, []).append(k)
    for spots in places.values():
        jobs = sorted((order[k] for k in spots), key=lambda i: _latest_topped_first(pending[i]))
        for k, i in zip(spots, jobs, strict=True):
            order[k] = i


def _latest_topped_first(job: PendingJob) -> float:
    return math.inf if job.topped_at is None else -job.topped_at


def _lexicographic_order(
    columns: Sequence[Sequence[tuple[Any, ...]]], jobs: Sequence[PendingJob]
) -> list[int]:
    """Positions in `jobs` sorted by each job's plugin keys in column order, then (submitted_at,
    id): the order of the concatenated keys (_concatenated_keys). Where every key of a column
    has the same length and its elements and the submission times are numbers, not NaN, the
    positions are put in arrival order and then sorted, stably, by one key element at a time
    from the last to the first: numbers compare several times faster than tuples whose first
    elements are mostly equal (a few priorities and queues over thousands of jobs)."""
    count = len(jobs)
    elements = _key_elements(columns)
    times = [job.submitted_at for job in jobs]
    if elements is None or not _plain_numbers(times):
        keys = _concatenated_keys(columns, jobs)
        return sorted(range(count), key=keys.__getitem__)
    if all(map(lt, times, times[1:])):
        order = list(range(count))
    else:
        arrival = [(job.submitted_at, job.id) for job in jobs]
        order = sorted(range(count), key=arrival.__getitem__)
    for values in reversed(elements):
        order.sort(key=values.__getitem__)
    return order


def _key_elements(columns: Sequence[Sequence[tuple[Any, ...]]]) -> list[list[Any]] | None:
    """The keys' elements, one list per element in column order; None where a column's keys
    differ in length or an element is not a plain number (_plain_numbers)."""
    elements: list[list[Any]] = []
    for column in columns:
        widths = set(map(len, column))
        if len(widths) > 1:
            return None
        for i in range(max(widths, default=0)):
            values = list(map(itemgetter(i), column))
            if not _plain_numbers(values):
                return None
            elements.append(values)
    return elements


def _plain_numbers(values: Sequence[Any]) -> bool:
    """Whether `values` add up to a number that is not NaN: numbers (as the sort keys are
    typed) without NaN, which sort alone as they do inside tuples (a NaN element of a tuple is
    equal to itself there, and unordered alone). An infinity of each sign also gives NaN, and
    the slower way; anything that does not add up takes it too."""
    try:
        total = sum(values)
    except TypeError:
        return False
    return bool(total == total)


def _concatenated_keys(
    columns: Sequence[Sequence[tuple[float, ...]]], jobs: Sequence[PendingJob]
) -> list[tuple[Any, ...]]:
    """Each job's plugin keys concatenated in column order, then (submitted_at, id). When every
    key of a column has the same length (as every shipped plugin's has), the columns are
    split into one list per key element and the tuples built in one zip, without the
    intermediate tuples of adding them up; otherwise they are added up job by job."""
    parts: list[Sequence[Any]] = []
    for column in columns:
        widths = set(map(len, column))
        if len(widths) > 1:
            tails = [(job.submitted_at, job.id) for job in jobs]
            return [sum(keys, ()) for keys in zip(*columns, tails, strict=True)]
        parts.extend(list(map(itemgetter(i), column)) for i in range(max(widths, default=0)))
    return list(zip(*parts, [job.submitted_at for job in jobs], [job.id for job in jobs], strict=True))


def _sort_keys(
    sorter: QueueSortPlugin, jobs: Sequence[PendingJob], ctx: CycleContext
) -> list[tuple[float, ...]]:
    """Every job's key from one plugin: in one call where the plugin offers `sort_keys`."""
    bulk = getattr(sorter, "sort_keys", None)
    if bulk is not None:
        keys: list[tuple[float, ...]] = bulk(jobs, ctx)
        return keys
    return [sorter.sort_key(job, ctx) for job in jobs]


# A node not assessed yet for a request (None is an answer: no GPUs chosen there).
_UNASKED = object()

# What decides whether a blocked job's outcome holds for a later job (see consider_all).
_OUTCOME_KEY = attrgetter("gpu_model", "vc", "user", "gpus_per_replica", "replicas", "priority")
# With a VC that caps its users' CPU or memory, admission depends on those too.
_CAPPED_OUTCOME_KEY = attrgetter(
    "gpu_model",
    "vc",
    "user",
    "gpus_per_replica",
    "replicas",
    "priority",
    "cpu_milli_per_replica",
    "memory_mib_per_replica",
)


class _CycleRun:
    """Mutable bookkeeping of one cycle. Lives only inside `decide`."""

    def __init__(
        self,
        ctx: CycleContext,
        plugins: PluginSet,
        profile: Profile,
        holds: dict[str, list[GpuHold]],
        stopped_vcs: set[str],
    ) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.plugins = plugins
        self.settings = profile.cycle
        self.holds = holds
        self.stopped_vcs = stopped_vcs
        self.starts: list[Start] = []
        self.started: dict[str, str] = {}  # job id -> GPU model it got
        self.waiting: dict[str, tuple[float, str]] = {}  # job id -> (victims gone by, model)
        self.preemptions: list[Preemption] = []
        self.reasons: dict[str, Status] = {}
        self.reservation: Any = None
        self.reserved_for: PendingJob | None = None  # the job holding the reservation
        self.preemption_attempts = 0
        self.released: set[str] = set()  # running jobs whose GPUs this cycle handed on
        # GPUs of this cycle's victims that their preemptors do not take: busy until the grace ends.
        self.blocked: list[GpuHold] = []
        # Time-slicing: GPUs a suspended job is parked on, with that job. Its paused processes
        # stay there, so only a job of its tenant may use them meanwhile (see _start).
        self.parked: dict[tuple[int, int], PendingJob] = {
            (idx, index): job
            for job in ctx.snapshot.pending
            if job.suspended_on
            for replica in job.suspended_on
            if (idx := self.state.node_idx_by_name.get(replica.node)) is not None
            for index in replica.gpu_indices
        }
        # Suspended jobs told to leave the GPUs they are parked on, with what they wait for.
        self.evicted: dict[str, str] = {}
        self._victim_base: list[tuple[tuple[float, ...], RunningJob, frozenset[str]]] | None = None
        # Preemption searches that found nothing, by what decides eligibility; a later job
        # with the same key and at least as many GPUs cannot do better.
        self._failed_preemptions: dict[tuple[Any, ...], int] = {}
        self._horizons = [p for p in plugins.preemption if isinstance(p, PreemptionHorizonPlugin)]
        # A migration plugin (its victims restart at once elsewhere, not back in the queue)
        # plans the moves for a job blocked only by layout: see _try_preempt.
        self._migrator: Any = next((p for p in plugins.preemption if hasattr(p, "plan_moves")), None)
        self._evictors = [p for p in plugins.preemption if p is not self._migrator]
        self._vc_evictors = own_order_evictors(ctx, plugins)
        self.vc_horizons = {
            vc: [p for p in rules if isinstance(p, PreemptionHorizonPlugin)]
            for vc, rules in self._vc_evictors.items()
        }
        self._blocked_shapes: dict[tuple[str, int, int], tuple[int, Status]] = {}
        self._admissions: dict[tuple[Any, ...], tuple[int, Status]] = {}
        self._rack_nodes: dict[str, list[int]] | None = None
        self._placement_score = 0.0  # sum of the chosen replicas' scores in the last _place
        # Blocked jobs' outcomes, by what decides them when the job was turned away before
        # any node was looked at (by _never_fits, admission or _quick_fit), with the state
        # version they hold for. Only without backfill, whose gate has side effects.
        self._outcomes: dict[tuple[Any, ...], tuple[int, Status]] = {}
        self._reuse_outcomes = plugins.backfill is None
        self._disjoint: bool | None = None  # see _holds_disjoint
        # What a node offers a first replica, by (node, its changes, model, GPUs, CPU and memory
        # per replica): a filter's refusal, None (no GPUs chosen), or (score, GPUs). Only when
        # every filter and score plugin is node-local (see FilterPlugin).
        plugins_asked = [*plugins.filter, *(plugin for plugin, _ in plugins.score)]
        self._node_answers: dict[tuple[int, int, str, int, int, int], Any] | None = (
            {} if all(getattr(p, "node_local", False) for p in plugins_asked) else None
        )
        # Fixed for the cycle: the bucket lists never grow, the usable capacity never changes.
        self._max_node_gpus = {model: self.state.max_node_gpus(model) for model in self.state.buckets}

    # -- step 4 ------------------------------------------------------------------------

    def _may_preempt(self, failure: Status) -> bool:
        """Whether step 5 would look for victims for a whole-GPU job that failed so."""
        return (
            failure.code is Code.UNSCHEDULABLE
            and failure.reason in _PREEMPTION_REASONS
            and bool(self.plugins.preemption)
            and self.preemption_attempts < self.settings.max_preemption_attempts
        )

    def consider_all(self, queue: Sequence[PendingJob]) -> None:
        """Steps 4-6 for each job in queue order.

        Most of a long queue is turned away for the same reason as a job just before it with
        the same request, while nothing changed: that outcome is reused, in this loop rather
        than in a call per job, which would cost more than the lookup. Fractional jobs are
        left out (their quota use depends on the shares already held). Only outcomes that may
        not preempt are kept, and none of them may later in the cycle (the preemption attempts
        only grow), so a kept one needs no second check."""
        consider = self._consider
        if not self._reuse_outcomes:
            for job in queue:
                consider(job, None)
            return
        outcomes, reasons, state = self._outcomes, self.reasons, self.state
        outcome_of = _CAPPED_OUTCOME_KEY if state.resource_capped else _OUTCOME_KEY
        for job in queue:
            if job.gpu_share_milli:
                consider(job, None)
                continue
            outcome_key = outcome_of(job)
            known = outcomes.get(outcome_key)
            if known is not None and known[0] == state.version:
                reasons[job.id] = known[1]
            else:
                consider(job, outcome_key)

    def _consider(self, job: PendingJob, outcome_key: tuple[Any, ...] | None) -> None:
        """Steps 4-6 for one job; its outcome is kept under `outcome_key` when it may be reused."""
        if job.replicas <= 0 or job.gpus_per_replica <= 0:
            self.reasons[job.id] = Status(
                Code.UNRESOLVABLE, ReasonCode.NO_MATCHING_GPU, "requests no GPUs; nothing to place"
            )
            return
        if job.id in self.evicted:
            self.reasons[job.id] = Status(Code.UNSCHEDULABLE, ReasonCode.QUEUED_BEHIND, self.evicted[job.id])
            return
        looked_at_nodes = False
        models = [job.gpu_model] if job.gpu_model != ANY_MODEL else self.state.models
        if not models:
            models = [job.gpu_model]
        failures: list[tuple[str, Status]] = []
        # A job that takes any GPU model goes to the first model with room, or with
        # `any_model = "best"` to the model whose placement scores best (a share looks at
        # every model's GPUs at once, in _place_share).
        compare = self.settings.any_model == "best" and len(models) > 1 and job.replicas == 1
        if job.gpu_share_milli and job.gpu_model == ANY_MODEL and compare:
            models = models[:1]
        best_model: tuple[float, str] | None = None
        for model in models:
            status = self._never_fits(job, model)
            if status.ok:
                status = self._admit(job, model)
            backfill = self.plugins.backfill
            if (
                status.ok
                and self.reservation is not None
                and backfill is not None
                and not backfill.allows(job, model, self.reservation, self.ctx)
            ):
                status = self._held_status(job)
            if status.ok and not job.gpu_share_milli:
                status = self._quick_fit(job, model)
            if status.ok:
                looked_at_nodes = True
                statement = Statement(self.state)
                status = self._place(job, model, statement)
                if status.ok and compare and not job.gpu_share_milli:
                    statement.discard()
                    if best_model is None or self._placement_score > best_model[0]:
                        best_model = (self._placement_score, model)
                    continue
                if status.ok:
                    self._start(job, statement, model)
                    return
                # NODE_RESOURCES and a share's room depend on the job, not only on its shape.
                if status.reason is not ReasonCode.NODE_RESOURCES and not job.gpu_share_milli:
                    shape = (model, job.gpus_per_replica, job.replicas)
                    self._blocked_shapes[shape] = (self.state.version, status)
            failures.append((model, status))
        if best_model is not None:
            statement = Statement(self.state)
            if self._place(job, best_model[1], statement).ok:  # the same state: the same placement
                self._start(job, statement, best_model[1])
                return
            statement.discard()
        model, failure = failures[0] if len(failures) == 1 else self._most_telling(failures)
        if outcome_key is not None and not looked_at_nodes and not self._may_preempt(failure):
            self._outcomes[outcome_key] = (self.state.version, failure)
        # 5. Preemption. Shares free no whole GPU, and a suspended job would only have to move
        # to the GPUs freed for it (it waits for its own, or for free ones).
        if not job.gpu_share_milli and not job.suspended_on and self._may_preempt(failure):
            self.preemption_attempts += 1
            for candidate_model in models:
                key = self._preemption_key(job, candidate_model, failure)
                if job.gpus >= self._failed_preemptions.get(key, job.gpus + 1):
                    continue
                # Blocked only by layout: first try moving jobs (they restart at once) before
                # evicting any to the queue, where it would wait in the job's place.
                layout = failure.reason in _LAYOUT_REASONS and self._migrator is not None
                if layout and self._try_preempt(job, candidate_model, failure, migrate=True):
                    return
                if self._try_preempt(job, candidate_model, failure):
                    return
                self._failed_preemptions[key] = min(job.gpus, self._failed_preemptions.get(key, job.gpus))
        # 6. Reservation for the first job blocked by capacity.
        if (
            failure.reason in _CAPACITY_REASONS
            and self.plugins.backfill is not None
            and self.reservation is None
        ):
            self.reservation = self.plugins.backfill.reserve(job, model, self.ctx, self.holds)
            if self.reservation is not None:
                self.reserved_for = job
                wait = max(self.reservation.start_at - self.ctx.now, 0.0)
                failure = Status(
                    failure.code, failure.reason, f"{failure.message}; reserved, expected in {wait:.0f} s"
                )
        self.reasons[job.id] = failure

    # -- step 6b -----------------------------------------------------------------------

    def rotate(self, queue: list[PendingJob]) -> list[Suspend]:
        rotators = [p for p in self.plugins.post_cycle if isinstance(p, RotationPlugin)]
        if not rotators:
            return []
        turn_reasons = _CAPACITY_REASONS | {ReasonCode.VC_QUOTA}
        waiting = [
            job
            for job in queue
            if job.id not in self.started
            and job.id not in self.waiting
            and job.id not in self.evicted
            and job.id in self.reasons
            and self.reasons[job.id].reason in turn_reasons
        ]
        suspends: list[Suspend] = []
        for plugin in rotators:
            for running, job in plugin.rotate(waiting, self.released, self.ctx):
                holds = self.holds.get(running.id)
                if not holds or job.id in self.started or running.id in self.released:
                    continue
                if not all(self._placeable(hold) for hold in holds):
                    continue  # new work only on ready nodes and healthy GPUs, swap or not
                statement = Statement(self.state)
                for hold in holds:
                    statement.release(hold)
                # A swap keeps the VC's usage, but a VC can stand above its limit (its quota
                # was cut) or a user above theirs: the waiting job takes the GPUs only if
                # admission would give them to it once the running job has let them go, for
                # every model of the turn (a snapshot can show a job on GPUs of two).
                if not all(self._admit(job, model).ok for model in sorted({h.model for h in holds})):
                    statement.discard()
                    continue
                # The waiting job may ask for more CPU or memory per replica than the running
                # one had: its replicas must fit what their nodes have left.
                if not self._resources_fit(job, holds):
                    statement.discard()
                    continue
                for hold in holds:
                    statement.reserve(
                        GpuHold(
                            hold.node_idx,
                            hold.model,
                            hold.gpu_indices,
                            job.cpu_milli_per_replica,
                            job.memory_mib_per_replica,
                            job.vc,
                            job.user,
                        )
                    )
                statement.commit()
                self.released.add(running.id)
                borrowed = self.ctx.borrowed_gpus.get(running.id, 0)
                self.starts.append(Start(job.id, running.placement, borrowed, resume=bool(job.suspended_on)))
                self.started[job.id] = holds[0].model
                suspends.append(
                    Suspend(
                        running.id,
                        job.id,
                        f"time slice: its turn is up; job {job.id} of VC {job.vc} "
                        + ("resumes" if job.suspended_on else "starts")
                        + " on its GPUs, and it resumes when its own turn comes",
                        plugin.suspend_cost_s,
                    )
                )
        return suspends

    # -- step 9 ------------------------------------------------------------------------

    def propose_changes(self, queue: list[PendingJob], max_jobs: int) -> Proposals:
        trials: list[Trial] = []
        for job in queue:
            if len(trials) >= max_jobs:
                break
            status = self.reasons.get(job.id)
            if job.id in self.started or status is None or status.reason not in HINT_REASONS:
                continue
            if job.replicas <= 0 or job.gpus_per_replica <= 0:
                continue
            reservation_start = None
            if status.reason is ReasonCode.HELD_FOR_RESERVATION:
                reservation_start = getattr(self.reservation, "start_at", None)
            trials.append(Trial(job, status.reason, reservation_start))
        return propose(trials, self.state.models, self.ctx.snapshot.flavors, self.ctx.now, self.fits_now)

    def fits_now(self, job: PendingJob) -> bool:
        """Would `job` start in what this cycle left free? The checks of `_consider`, through a
        statement that is always discarded, so nothing of the trial stays in the state."""
        if job.replicas <= 0 or job.gpus_per_replica <= 0:
            return False
        backfill = self.plugins.backfill
        models = [job.gpu_model] if job.gpu_model != ANY_MODEL else self.state.models
        for model in models:
            if not (self._never_fits(job, model).ok and self._admit(job, model).ok):
                continue
            if (
                self.reservation is not None
                and backfill is not None
                and (self.reserved_for is None or job.id != self.reserved_for.id)
                and not backfill.allows(job, model, copy.copy(self.reservation), self.ctx)
            ):
                continue
            if not job.gpu_share_milli and not self._quick_fit(job, model).ok:
                continue
            statement = Statement(self.state)
            placed = self._place(job, model, statement, any_fit=True).ok
            statement.discard()
            if placed:
                return True
        return False

    @staticmethod
    def _most_telling(failures: list[tuple[str, Status]]) -> tuple[str, Status]:
        """With several GPU models tried, report the one closest to fitting: a capacity
        problem beats a quota problem beats a model that cannot hold the job at all."""
        rank = {Code.UNSCHEDULABLE: 0, Code.UNRESOLVABLE: 1, Code.SUCCESS: 2}
        return min(failures, key=lambda f: (rank[f[1].code], f[1].reason not in _CAPACITY_REASONS))

    def _held_status(self, job: PendingJob) -> Status:
        res = self.reservation
        wait = max(res.start_at - self.ctx.now, 0.0)
        same_tenant = self.reserved_for is not None and self._same_tenant(job, self.reserved_for)
        holder = f"job {res.job_id}" if same_tenant else "a job of another tenant"
        return Status(
            Code.UNSCHEDULABLE,
            ReasonCode.HELD_FOR_RESERVATION,
            f"held for the reservation of {holder} ({res.gpus} {model_label(res.model)} "
            f"expected free in {wait:.0f} s); this job would delay it",
        )

    def _quota_model(self, job: PendingJob, model: str) -> str:
        return job.gpu_model if job.gpu_model != ANY_MODEL else model

    def _admit(self, job: PendingJob, model: str) -> Status:
        """Admission plugins decide from the job's VC, user, model, width and priority (and
        its CPU and memory in a VC that caps them per user) and the working state (their
        contract), so an answer is reused until the state changes: in a long queue most jobs
        repeat a question asked a moment ago."""
        key: tuple[Any, ...] = (job.vc, job.user, model, job.gpus, job.priority, job.gpu_share_milli)
        if job.vc in self.state.resource_capped:
            key += (job.replicas * job.cpu_milli_per_replica, job.replicas * job.memory_mib_per_replica)
        cached = self._admissions.get(key)
        if cached is not None and cached[0] == self.state.version:
            return cached[1]
        status = SUCCESS
        for plugin in self.plugins.admission:
            status = plugin.admit(job, model, self.ctx)
            if not status.ok:
                break
        self._admissions[key] = (self.state.version, status)
        return status

    def _start(self, job: PendingJob, statement: Statement, model: str) -> None:
        reserved = statement.reserved()
        placement = tuple(
            ReplicaPlacement(self.state.nodes[h.node_idx].node.name, h.gpu_indices) for h in reserved
        )
        if job.suspended_on and gpus_of(placement) != gpus_of(job.suspended_on):
            # A paused process cannot move: a suspended job placed anywhere but where it is
            # parked checkpoints and stops there instead, to start from its checkpoint later.
            statement.discard()
            self._leave_parked(
                job,
                "time-slice-move",
                "its GPUs are taken: it checkpoints and stops, to start again from its checkpoint elsewhere",
                job.id,
            )
            self.reasons[job.id] = Status(
                Code.UNSCHEDULABLE,
                ReasonCode.QUEUED_BEHIND,
                "the GPUs it is suspended on are taken and a paused job cannot move: it checkpoints "
                "and stops, to start again from its checkpoint",
            )
            return
        statement.commit()
        if self.parked:
            in_the_way = self._parked_in_the_way(job, reserved)
            if in_the_way:
                self._wait_for_parked(job, model, in_the_way)
                return
        # The reservation is already counted in the VC's usage: borrowed = what lies above
        # the guarantee now minus what lay above it before.
        quota_model = self._quota_model(job, model)
        quota = self.state.quota_for(job.vc, quota_model)
        added = job.gpus
        if job.gpu_share_milli:
            milli = (self.state.share_used.get(job.vc) or {}).get(quota_model, 0)
            added = whole_gpus(milli) - whole_gpus(milli - job.gpu_share_milli)
        borrowed = added
        if quota is not None:
            guaranteed, _, used, _ = quota
            borrowed = max(0, used - guaranteed) - max(0, used - added - guaranteed)
        self.starts.append(
            Start(
                job.id,
                placement,
                borrowed,
                job.gpu_share_milli,
                job.gpu_memory_mib if job.gpu_share_milli else 0,
                resume=bool(job.suspended_on),
            )
        )
        self.started[job.id] = model

    def _parked_in_the_way(self, job: PendingJob, holds: Sequence[GpuHold]) -> list[PendingJob]:
        """Suspended jobs of another tenant parked on the GPUs of `holds`, in id order."""
        found: dict[str, PendingJob] = {}
        for hold in holds:
            for index in hold.gpu_indices:
                parked = self.parked.get((hold.node_idx, index))
                if parked is not None and parked.id != job.id and not self._same_tenant(job, parked):
                    found[parked.id] = parked
        return [found[job_id] for job_id in sorted(found)]

    def _wait_for_parked(self, job: PendingJob, model: str, in_the_way: Sequence[PendingJob]) -> None:
        """The job keeps the GPUs it was given, held for it as for a preemption, while the
        suspended jobs parked there checkpoint and leave; it starts first in line once they
        have."""
        grace = self.settings.grace_period_s
        for parked in in_the_way:
            if parked.id not in self.evicted:
                self._leave_parked(
                    parked,
                    "time-slice-evict",
                    "the GPUs it is suspended on went to a job of another tenant: it checkpoints "
                    "and stops, to start again from its checkpoint later",
                    job.id,
                )
        self._wait(
            job,
            model,
            f"waiting for a suspended job to checkpoint and leave the {job.gpus} {model_label(model)} "
            f"it was given (grace {grace:.0f} s)",
        )

    def _wait(self, job: PendingJob, model: str, message: str) -> None:
        """The job keeps the GPUs it was given while others leave them, for one grace period."""
        self.waiting[job.id] = (self.ctx.now + self.settings.grace_period_s, model)
        self.reasons[job.id] = Status(Code.UNSCHEDULABLE, ReasonCode.WAITING_FOR_PREEMPTION, message)

    def leave_draining_nodes(self, drains: Drains) -> None:
        """Suspended jobs parked on a draining node, or of a VC stopped with a drain, are told to
        checkpoint and leave, as the running jobs there are (leave_draining_nodes)."""
        draining, drained_vcs = drains
        if not draining and not drained_vcs:
            return
        for job in self.ctx.snapshot.pending:
            if not job.suspended_on:
                continue
            on = next((r.node for r in job.suspended_on if r.node in draining), None)
            if on is not None:
                message = _DRAIN_MESSAGE.format(node=on)
                self._leave_parked(job, DRAIN, message, JobId(""), waits=message)
            elif job.vc in drained_vcs:
                message = _VC_DRAIN_MESSAGE.format(vc=job.vc)
                self._leave_parked(job, VC_DRAIN, message, JobId(""), waits=message)

    def _leave_parked(
        self, parked: PendingJob, reason: str, message: str, for_job: JobId, waits: str = _EVICTED
    ) -> None:
        """Tell a suspended job to checkpoint and stop where it is parked; it takes no further
        part in this cycle, and `waits` is its pending message."""
        self.evicted[parked.id] = waits
        self._hold_for_checkpoint(parked)
        self.preemptions.append(Preemption(parked.id, reason, message, self.settings.grace_period_s, for_job))

    def _hold_for_checkpoint(self, parked: PendingJob) -> None:
        """A parked job told to leave checkpoints on its GPUs until it is gone: those still
        free stay out of reach for the rest of the cycle, charged to no one (RunningJob.parked)."""
        state = self.state
        for replica in parked.suspended_on:
            idx = state.node_idx_by_name.get(replica.node)
            if idx is None:
                continue
            slot = state.nodes[idx]
            by_model: dict[str, list[int]] = {}
            for i in replica.gpu_indices:
                if i in slot.gpus and i in slot.free.get(slot.gpus[i].model, ()):
                    by_model.setdefault(slot.gpus[i].model, []).append(i)
            for model, indices in by_model.items():
                state.occupy(GpuHold(idx, model, tuple(indices), 0, 0, parked.vc, parked.user))

    # -- placement ---------------------------------------------------------------------

    def _never_fits(self, job: PendingJob, model: str) -> Status:
        """A job wider than every usable GPU of the model (or than any node) cannot start
        whatever happens to quotas or other jobs; say so before anything else."""
        state = self.state
        capacity = state.capacity_total.get(model, 0)
        if capacity >= job.gpus and self._max_node_gpus.get(model, 0) >= job.gpus_per_replica:
            return SUCCESS
        label = model_label(model)
        return Status(
            Code.UNRESOLVABLE,
            ReasonCode.NO_MATCHING_GPU,
            f"needs {job.replicas}x{job.gpus_per_replica} {label}; the cluster has {capacity} usable "
            f"{label}, at most {state.max_node_gpus(model)} per node",
        )

    def _quick_fit(self, job: PendingJob, model: str) -> Status:
        """Counting checks that need no node scan: enough free GPUs of the model, and enough
        nodes with room for each replica. A shape that failed since the last change of the
        state fails again without looking."""
        cached = self._blocked_shapes.get((model, job.gpus_per_replica, job.replicas))
        if cached is not None and cached[0] == self.state.version:
            return cached[1]
        state = self.state
        free = state.free_total.get(model, 0)
        if free < job.gpus:
            capacity = state.capacity_total.get(model, 0)
            status = Status(
                Code.UNSCHEDULABLE,
                ReasonCode.INSUFFICIENT_GPUS,
                f"needs {job.gpus} {model_label(model)}, {free} of {capacity} free",
            )
        elif state.replica_slots(model, job.gpus_per_replica) < job.replicas:
            status = self._no_room(model, job.gpus_per_replica, job.replicas, free)
        else:
            return SUCCESS
        self._blocked_shapes[(model, job.gpus_per_replica, job.replicas)] = (state.version, status)
        return status

    def _place(self, job: PendingJob, model: str, statement: Statement, any_fit: bool = False) -> Status:
        """Gang placement: every replica reserved through `statement`, or none (discarded).

        With `any_fit`, for callers that only ask whether the job fits and discard the
        placement, a single replica takes the first feasible node unscored: it fits there
        exactly when it fits on the best one. A gang is placed as usual, since where one
        replica goes decides whether the next fits."""
        state = self.state
        per_replica, replicas = job.gpus_per_replica, job.replicas
        never = self._never_fits(job, model)
        if not never.ok:
            return never
        if job.gpu_share_milli:
            return self._place_share(job, model, statement)
        if job.suspended_on and self._place_where_suspended(job, model, statement):
            return SUCCESS
        self.ctx.placing = job
        quick = self._quick_fit(job, model)
        if not quick.ok:
            return quick
        free = state.free_total.get(model, 0)
        placed: list[GpuHold] = []
        self._placement_score = 0.0
        limit = self.settings.max_candidates * (4 if replicas > 1 else 1)
        first_fit = any_fit and replicas == 1
        answers = None if first_fit else self._node_answers
        shape = (model, per_replica, job.cpu_milli_per_replica, job.memory_mib_per_replica)
        for _ in range(replicas):
            best: tuple[float, int, tuple[int, ...]] | None = None
            filter_failure: Status | None = None
            feasible = 0
            for idx in self._candidates(model, per_replica, placed):
                slot = state.nodes[idx]
                if answers is not None and not placed:
                    key = (idx, slot.changes, *shape)
                    answer = answers.get(key, _UNASKED)
                    if answer is _UNASKED:
                        answer = answers[key] = self._assess(job, slot, model, placed, first_fit)
                else:
                    answer = self._assess(job, slot, model, placed, first_fit)
                if answer is None:
                    continue
                if isinstance(answer, Status):
                    filter_failure = answer
                    continue
                score, gpus = answer
                if first_fit:
                    best = (0.0, idx, gpus)
                    break
                if best is None or score > best[0]:
                    best = (score, idx, gpus)
                feasible += 1
                if feasible >= limit:
                    break
            if best is None:
                statement.discard()
                if filter_failure is not None:
                    return filter_failure
                return self._no_room(model, per_replica, replicas, free)
            hold = GpuHold(
                best[1],
                model,
                best[2],
                job.cpu_milli_per_replica,
                job.memory_mib_per_replica,
                job.vc,
                job.user,
            )
            statement.reserve(hold)
            placed.append(hold)
            self._placement_score += best[0]
        return SUCCESS

    def _assess(
        self, job: PendingJob, slot: NodeSlot, model: str, placed: list[GpuHold], first_fit: bool
    ) -> Status | tuple[float, tuple[int, ...]] | None:
        """What the node offers the job's next replica: the first filter's refusal, None when
        the GPU chooser picks nothing there, else (score, GPUs); unscored with `first_fit`."""
        for plugin in self.plugins.filter:
            status = plugin.filter(job, slot, model, self.ctx)
            if not status.ok:
                return status
        gpus = self.plugins.gpu_chooser.choose(slot.free[model], slot, job.gpus_per_replica)
        if gpus is None:
            return None
        if first_fit:
            return 0.0, gpus
        return sum([w * p.score(slot, model, gpus, placed, self.ctx) for p, w in self.plugins.score]), gpus

    def _resources_fit(self, job: PendingJob, holds: Sequence[GpuHold]) -> bool:
        """Whether the CPU and memory of `job`'s replicas fit the nodes of `holds`, one
        replica per hold, as the state stands (for a swap: with the running job released)."""
        per_node = Counter(hold.node_idx for hold in holds)
        return all(node_resources_fit(job, self.state.nodes[idx], n) for idx, n in per_node.items())

    def _same_tenant(self, job: PendingJob, other: PendingJob | RunningJob) -> bool:
        return self.state.tenant_of(job.vc) == self.state.tenant_of(other.vc)

    def _placeable(self, hold: GpuHold) -> bool:
        slot = self.state.nodes[hold.node_idx]
        return slot.usable and all(i in slot.gpus and slot.gpus[i].healthy for i in hold.gpu_indices)

    def _place_where_suspended(self, job: PendingJob, model: str, statement: Statement) -> bool:
        """A suspended job goes back to the GPUs it left when they are all free; otherwise it
        is placed like any job (and restores its state elsewhere)."""
        state = self.state
        holds = []
        for replica in job.suspended_on:
            idx = state.node_idx_by_name.get(replica.node)
            if idx is None or not state.nodes[idx].usable:
                return False
            if not set(replica.gpu_indices) <= state.nodes[idx].free.get(model, set()):
                return False
            holds.append(
                GpuHold(
                    idx,
                    model,
                    replica.gpu_indices,
                    job.cpu_milli_per_replica,
                    job.memory_mib_per_replica,
                    job.vc,
                    job.user,
                )
            )
        if len(holds) != job.replicas:
            return False
        if not self._resources_fit(job, holds):
            return False  # others took the CPU or memory it gave up while suspended
        for hold in holds:
            statement.reserve(hold)
        return True

    def _place_share(self, job: PendingJob, model: str, statement: Statement) -> Status:
        """A fractional job: one share of one GPU, on a GPU its tenant already shares with room
        for the share and its GPU memory, or on a free GPU; the share chooser decides."""
        state, share = self.state, job.gpu_share_milli
        tenant = state.tenant_of(job.vc)
        candidates: list[ShareCandidate] = []
        node_ok: dict[int, bool] = {}
        models = [model]
        if job.gpu_model == ANY_MODEL and self.settings.any_model == "best":
            models = [m for m in state.models if m == model or self._admit(job, m).ok]

        def fits_node(idx: int) -> bool:
            ok = node_ok.get(idx)
            if ok is None:
                slot = state.nodes[idx]
                ok = node_ok[idx] = all(p.filter(job, slot, model, self.ctx).ok for p in self.plugins.filter)
            return ok

        def memory_fits(gpu: Gpu, used_mib: int) -> bool:
            return not gpu.memory_mib or used_mib + job.gpu_memory_mib <= gpu.memory_mib

        for idx in sorted(state.shared_nodes):
            slot = state.nodes[idx]
            if not slot.usable:
                continue
            for index, entry in slot.shared.items():
                gpu = slot.gpus[index]
                if (
                    gpu.model in models
                    and gpu.healthy
                    and entry.tenant == tenant
                    and entry.used_milli + share <= WHOLE
                    and memory_fits(gpu, entry.memory_mib)
                    and fits_node(idx)
                ):
                    candidates.append(ShareCandidate(idx, index, WHOLE - entry.used_milli))
        window = self.settings.max_candidates * 4
        for candidate_model in models:
            seen = 0
            for idx in self._candidates(candidate_model, 1, []):
                if seen >= window:
                    break
                slot = state.nodes[idx]
                free = [i for i in sorted(slot.free.get(candidate_model, ())) if memory_fits(slot.gpus[i], 0)]
                if free and fits_node(idx):
                    candidates.append(ShareCandidate(idx, free[0], WHOLE))  # free GPUs of a node are alike
                    seen += 1
        choice = self.plugins.share_chooser.choose_share(job, candidates, self.ctx) if candidates else None
        if choice is None:
            label = model_label(model)
            return Status(
                Code.UNSCHEDULABLE,
                ReasonCode.INSUFFICIENT_GPUS,
                f"needs {share / 10:g} % of one {label}"
                + (f" and {job.gpu_memory_mib} MiB of its memory" if job.gpu_memory_mib else "")
                + f"; no free {label} and none of tenant {tenant}'s shared ones has the room",
            )
        statement.reserve(
            GpuHold(
                choice.node_idx,
                state.nodes[choice.node_idx].gpus[choice.gpu_index].model,
                (choice.gpu_index,),
                job.cpu_milli_per_replica,
                job.memory_mib_per_replica,
                job.vc,
                job.user,
                share_milli=share,
                gpu_memory_mib=job.gpu_memory_mib,
            )
        )
        return SUCCESS

    def _no_room(self, model: str, per_replica: int, replicas: int, free: int) -> Status:
        label = model_label(model)
        if replicas == 1:
            return Status(
                Code.UNSCHEDULABLE,
                ReasonCode.FRAGMENTATION,
                f"{free} {label} free but no node has {per_replica} free (fragmentation)",
            )
        have = self.state.nodes_with_free(model, per_replica)
        return Status(
            Code.UNSCHEDULABLE,
            ReasonCode.GANG_NODES,
            f"gang needs {replicas} nodes with {per_replica} free {label}; {have} have them",
        )

    def _candidates(self, model: str, per_replica: int, placed: list[GpuHold]) -> Iterator[int]:
        """Nodes with room for one replica, in a deterministic order: for gangs first the
        racks already used, then by free-count bucket (fullest or emptiest first), by index."""
        state = self.state
        buckets = state.buckets[model]
        seen: set[int] = set()
        if placed:
            if self._rack_nodes is None:
                self._rack_nodes = {}
                for slot in state.nodes:
                    self._rack_nodes.setdefault(slot.node.rack, []).append(slot.idx)
            racks = sorted({state.nodes[h.node_idx].node.rack for h in placed})
            for rack in racks:
                for idx in self._rack_nodes[rack]:
                    slot = state.nodes[idx]
                    if slot.usable and slot.free_count(model) >= per_replica:
                        seen.add(idx)
                        yield idx
        sizes = range(per_replica, len(buckets))
        if self.settings.candidate_order == "emptiest":
            sizes = range(len(buckets) - 1, per_replica - 1, -1)
        window = self.settings.max_candidates * 4
        for size in sizes:
            bucket = buckets[size]
            if not bucket:
                continue
            if len(bucket) <= window:
                for idx in sorted(bucket):
                    if idx not in seen:
                        seen.add(idx)
                        yield idx
                continue
            # A large bucket (an empty cluster has all nodes in one) is read in index order
            # lazily: the caller stops after a few feasible nodes, so a heap built in one step
            # and popped as far as needed beats sorting or selecting a window of it.
            heap = list(bucket)
            heapq.heapify(heap)
            while heap:
                idx = heapq.heappop(heap)
                if idx not in seen:
                    seen.add(idx)
                    yield idx

    # -- step 5: preemption ------------------------------------------------------------

    def _preemption_key(self, job: PendingJob, model: str, failure: Status) -> tuple[Any, ...]:
        horizons = self._horizons + self.vc_horizons.get(job.vc, [])
        horizon = tuple(h.horizon_key(job, self.ctx) for h in horizons)
        vc = self.state.vcs.get(job.vc)
        if failure.reason is not ReasonCode.USER_LIMIT and not (vc is not None and vc.caps_users):
            return (job.priority, horizon, model, job.vc, "", failure.reason)
        # In a VC that caps its users, a search may fail on its user's cap (once victims free
        # the quota, admission asks again), which says nothing of another user's search.
        key: tuple[Any, ...] = (job.priority, horizon, model, job.vc, job.user, failure.reason)
        if job.vc in self.state.resource_capped:
            # More GPUs cannot do better only with as much CPU and memory.
            key += (job.replicas * job.cpu_milli_per_replica, job.replicas * job.memory_mib_per_replica)
        return key

    def _victim_candidates(self) -> list[tuple[tuple[float, ...], RunningJob, frozenset[str]]]:
        """Running jobs that could be victims of anyone, cheapest loss first, with the GPU
        models each holds (asked for every victim of every search); once per cycle."""
        if self._victim_base is None:
            now = self.ctx.now
            base = []
            for victim in self.ctx.snapshot.running:
                holds = self.holds.get(victim.id)
                if not holds:
                    continue
                if victim.gpu_share_milli or victim.parked:
                    continue  # a share frees no whole GPU; a parked job's GPUs are not charged
                models = frozenset(h.model for h in holds)
                if victim.stopping:
                    base.append(((-1.0,), victim, models))
                elif victim.preemptible and now - victim.started_at >= self.settings.min_runtime_s:
                    base.append((self._loss(victim), victim, models))
            base.sort(key=lambda v: (v[0], v[1].id))
            self._victim_base = base
        return self._victim_base

    def _victims(
        self, job: PendingJob, model: str, failure: Status, migrate: bool = False
    ) -> list[tuple[RunningJob, str | None]]:
        """Running jobs whose GPUs may go to `job`, cheapest loss first. Jobs already stopping
        cost nothing and come first. Rules for every plugin: whole gangs only, preemptible,
        past the minimum runtime, and for evictions of the same VC or borrowing (a guarantee
        is never taken for someone else's work). With `migrate` only the migration plugin is
        asked, about every running job of any VC but a stopped one, whose moved job could not
        start again (it keeps few: see _try_preempt; a moved job keeps its GPU count); otherwise
        all the others."""
        ctx = self.ctx
        unmovable = self.stopped_vcs if migrate else set()
        asked = [self._migrator] if migrate else self._evictors
        # Between jobs of one class in a VC with a policy of its own, only that policy asks.
        own_rules = None if migrate else self._vc_evictors.get(job.vc)
        limit = len(ctx.snapshot.running) if migrate else self.settings.max_victims
        same_vc_only = failure.reason in _QUOTA_REASONS
        same_user_only = failure.reason is ReasonCode.USER_LIMIT
        victims: list[tuple[RunningJob, str | None]] = []
        released = self.released
        for _, victim, models in self._victim_candidates():
            if victim.id in released:
                continue
            if same_vc_only and victim.vc != job.vc:
                continue
            if same_user_only and victim.user != job.user:
                continue
            if victim.vc in unmovable and not victim.stopping:
                continue
            if model not in models:
                continue
            if victim.stopping:
                victims.append((victim, None))
            elif migrate or victim.vc == job.vc or ctx.borrowed_gpus.get(victim.id, 0) > 0:
                # A moved job restarts elsewhere on as many GPUs as it gave up, so its VC
                # loses nothing: the VC rule binds evictions only.
                rules = asked
                if own_rules is not None and victim.vc == job.vc and victim.priority == job.priority:
                    rules = own_rules
                for plugin in rules:
                    reason = plugin.may_preempt(job, victim, ctx)
                    if reason:
                        victims.append((victim, reason))
                        break
            if len(victims) >= limit:
                break
        return victims

    def _loss(self, victim: RunningJob) -> tuple[float, ...]:
        """Work lost by preempting: GPU-seconds since the last checkpoint (since the start if
        it cannot checkpoint), then priority, then size."""
        now = self.ctx.now
        since = victim.started_at
        if victim.checkpointable and victim.last_checkpoint_at is not None:
            since = max(since, victim.last_checkpoint_at)
        return (max(now - since, 0.0) * victim.gpus, float(victim.priority), float(victim.gpus))

    def _fits_after_releasing(
        self, job: PendingJob, model: str, victims: list[RunningJob]
    ) -> Statement | None:
        """Tentatively give back the victims' GPUs and place the job. Returns the statement
        holding both (to commit) or None with the state untouched."""
        statement = Statement(self.state)
        for victim in victims:
            for hold in self.holds[victim.id]:
                statement.release(hold)
        if self.state.free_total.get(model, 0) >= job.gpus and self._admit(job, model).ok:
            placement = Statement(self.state)
            if self._place(job, model, placement).ok:
                statement.absorb(placement)
                return statement
        statement.discard()
        return None

    def _fits_as_released(self, job: PendingJob, model: str, keep_in: Statement | None = None) -> bool:
        """Whether the job fits in the state as it is (victims released). The placement is
        discarded, or with `keep_in` added to that statement."""
        if self.state.free_total.get(model, 0) < job.gpus or not self._admit(job, model).ok:
            return False
        placement = Statement(self.state)
        if not self._place(job, model, placement, any_fit=keep_in is None).ok:
            return False
        if keep_in is None:
            placement.discard()
        else:
            keep_in.absorb(placement)
        return True

    def _holds_disjoint(self) -> bool:
        """No GPU in two running jobs' holds (a snapshot should never say otherwise)."""
        if self._disjoint is None:
            seen: set[tuple[int, str, int]] = set()
            count = 0
            for job_holds in self.holds.values():
                for hold in job_holds:
                    count += len(hold.gpu_indices)
                    seen.update((hold.node_idx, hold.model, i) for i in hold.gpu_indices)
            self._disjoint = len(seen) == count
        return self._disjoint

    def _try_preempt(self, job: PendingJob, model: str, failure: Status, migrate: bool = False) -> bool:
        candidates = self._victims(job, model, failure, migrate)
        if migrate and candidates:
            # The migration plugin keeps the fewest moves that free room for the job, on the
            # nodes it picks, in the order to release them; the search below checks the fit.
            choose = self.plugins.gpu_chooser.choose
            candidates = self._migrator.plan_moves(job, model, candidates, self.ctx, choose)
        if not candidates:
            return False
        reclaimable = sum(
            len(h.gpu_indices) for v, _ in candidates for h in self.holds[v.id] if h.model == model
        )
        if self.state.free_total.get(model, 0) + reclaimable < job.gpus:
            return False
        free_before = self.state.free_total.get(model, 0)
        # Grow the victim set cheapest first until the job fits (releases accumulate in one
        # statement; a placement is tried only once enough GPUs are free) ...
        chosen: list[tuple[RunningJob, str | None]] = []
        growing = Statement(self.state)
        fitted = False
        for candidate in candidates:
            chosen.append(candidate)
            for hold in self.holds[candidate[0].id]:
                growing.release(hold)
            if self.state.free_total.get(model, 0) < job.gpus or not self._admit(job, model).ok:
                continue
            placement = Statement(self.state)
            if self._place(job, model, placement, any_fit=True).ok:
                placement.discard()
                fitted = True
                break
        if not fitted:
            growing.discard()
            return False
        # ... then drop, most expensive first, every victim the fit does not need.
        incremental = self._holds_disjoint()
        if incremental:
            # Each trial takes one victim's GPUs back from the released set and tries the
            # fit there: with no GPU in two holds that is the very state of releasing all
            # the others, at the cost of one victim instead of all of them.
            for candidate in reversed(chosen[:-1]):
                kept = Statement(self.state)
                for hold in self.holds[candidate[0].id]:
                    kept.reserve(hold)
                if self._fits_as_released(job, model):
                    growing.absorb(kept)
                    chosen = [c for c in chosen if c is not candidate]
                else:
                    kept.discard()
        else:
            growing.discard()
            for candidate in reversed(chosen[:-1]):
                trial = [c for c in chosen if c is not candidate]
                attempt = self._fits_after_releasing(job, model, [v for v, _ in trial])
                if attempt is not None:
                    attempt.discard()
                    chosen = trial
        # Moved jobs restart on what is left free once the job has its GPUs: the GPUs free
        # before and the victims' own, less the job's.
        moved = sum(v.gpus for v, r in chosen if r == "defrag")
        released = sum(len(h.gpu_indices) for v, _ in chosen for h in self.holds[v.id] if h.model == model)
        if moved and moved > free_before + released - job.gpus:
            growing.discard()
            return False  # the moved jobs would find no room to restart
        if incremental:
            placed = self._fits_as_released(job, model, keep_in=growing)
            assert placed, "a victim set that fitted must fit again"
            final: Statement | None = growing
        else:
            final = self._fits_after_releasing(job, model, [v for v, _ in chosen])
        assert final is not None, "a victim set that fitted must fit again"
        final.commit()
        # The victims' GPUs that the job does not take stay busy until the victims are gone
        # (a quota-driven preemption frees quota, not necessarily the GPUs the job lands on),
        # and those it takes stay charged to the victims' VCs until then too. So do the CPU
        # and memory of each victim's replica, for its user's caps: once, by the charge when
        # the job takes some of the replica's GPUs, else by the block.
        for victim, _ in chosen:
            for hold in self.holds[victim.id]:
                free = self.state.nodes[hold.node_idx].free.get(hold.model, set())
                still_free = tuple(i for i in hold.gpu_indices if i in free)
                taken = tuple(i for i in hold.gpu_indices if i not in free)
                if taken:
                    self.state.charge(
                        GpuHold(
                            hold.node_idx,
                            hold.model,
                            taken,
                            hold.cpu_milli,
                            hold.memory_mib,
                            hold.vc,
                            hold.user,
                        )
                    )
                if still_free:
                    whole = len(still_free) == len(hold.gpu_indices)
                    blocked = GpuHold(
                        hold.node_idx,
                        hold.model,
                        still_free,
                        hold.cpu_milli if whole else 0,
                        hold.memory_mib if whole else 0,
                        hold.vc,
                        hold.user,
                    )
                    self.state.block(blocked)
                    self.blocked.append(blocked)
        grace = self.settings.grace_period_s
        for victim, reason in chosen:
            self.released.add(victim.id)
            if reason is None:
                continue  # already stopping
            message = _preemption_message(reason, job, victim, self._same_tenant(job, victim))
            self.preemptions.append(Preemption(victim.id, reason, message, grace, job.id))
        gpus = f"{job.gpus} {model_label(model)}"
        if all(self._same_tenant(job, victim) for victim, _ in chosen):
            new_victims = sum(1 for _, r in chosen if r is not None)
            waits = f"waiting for {len(chosen)} job(s) to release {gpus} ({new_victims} preempted now"
        else:
            # Counted, another tenant's jobs would tell this tenant how many of them run there.
            waits = f"waiting for running jobs to release {gpus} (preempted or stopping"
        self._wait(job, model, f"{waits}, grace {grace:.0f} s)")
        return True


def _preemption_message(reason: str, job: PendingJob, victim: RunningJob, same_tenant: bool) -> str:
    """What the victim's owner reads. A job or VC of another tenant is not named: its owner
    must not learn that it exists."""
    other = f"job {job.id}" if same_tenant else "a job of another tenant"
    if reason == "priority":
        return f"preempted for {other}: priority {job.priority} over {victim.priority}"
    if reason == "reclaim":
        owner = f"VC {job.vc}" if same_tenant else "another tenant's VC"
        return f"{owner} reclaims its guaranteed GPUs from borrowed work of VC {victim.vc} ({other})"
    if reason == "las":
        return f"preempted for {other}: it has attained less GPU service (LAS demotion)"
    if reason == "gittins":
        return f"preempted for {other}: jobs like it usually finish sooner (Gittins index)"
    if reason == "defrag":
        return f"moved to make room for {other}: enough GPUs are free, but scattered (defragmentation)"
    return f"preempted for {other} ({reason})"

"""Estimated start times by forward simulation of the state a cycle leaves behind.

Running jobs release their GPUs at their expected end (time limit, else history-based
estimate); pending jobs then take GPUs in queue order. The simulation counts GPUs per model
and respects each VC's quota and its per-user caps, but ignores topology: it is an estimate that
users read as "about when", and it must stay cheap enough to run for every pending job in every
cycle (one heap pass, O(n log n)).

Start times are monotone in queue order, as in conservative scheduling: a job is never
estimated to start before a job ahead of it of the same model. Backfill can beat the
estimate, which errs on the late side.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from scheduler.core.framework import CycleContext, PreemptionHorizonPlugin
from scheduler.core.plugins.admission import kept_free, kept_of
from scheduler.core.plugins.backfill import expected_ends
from scheduler.core.plugins.queue_sort import expected_runtime
from scheduler.core.profile import CycleSettings
from scheduler.core.state import ClusterState, GpuHold, whole_gpus
from scheduler.core.types import ALL_MODELS, ANY_MODEL, PendingJob, RunningJob

# The "model" of a release that ends a VC's charge without freeing any GPU: a job preempted in
# this cycle stops counting against its VC's quota when it is gone, while the GPUs its preemptor
# took stay taken. No GPU has this model, so no job's walk waits for it.
QUOTA_ONLY = "<quota only>"
_UNREAD: Any = object()  # a quota not looked up yet

# The horizon key of the kinds past `estimate_max_kinds`: running jobs release at their end only.
_ENDS_ONLY: tuple[tuple[float, ...], ...] = ((),)


def estimate_starts(
    ctx: CycleContext,
    queue: Sequence[PendingJob],
    started: Mapping[str, str],
    waiting: Mapping[str, tuple[float, str]],
    holds: Mapping[str, list[GpuHold]],
    settings: CycleSettings,
    released: set[str] | None = None,
    horizons: Sequence[PreemptionHorizonPlugin] = (),
    blocked: Sequence[GpuHold] = (),
    probes: Mapping[str, Sequence[PendingJob]] | None = None,
    positions: Sequence[int] | None = None,
    vc_horizons: Mapping[str, Sequence[PreemptionHorizonPlugin]] | None = None,
    user_limits: bool = False,
) -> dict[str, float | None]:
    """Estimated start per pending job id (None when it cannot start on this cluster).

    `probes` are changed requests (what-if hints) to estimate at the place of a queued job:
    each is estimated as if it stood there instead of that job, without booking anything, so
    one pass serves every probe and the estimates of the real jobs do not change.

    With preemption in the profile, a running job stops counting as an obstacle for a pending
    job from the moment the job could preempt it (`yields_at`), e.g. when a LAS victim's
    service crosses into a lower queue.

    `positions`, when given, says where each job of `queue` stands in the snapshot's pending
    list (queue_positions): the horizon keys are then worked out over that list, read in the
    order the jobs were made, and put in queue order by position.

    `vc_horizons` are the horizons of VCs with a queueing policy of their own (of their rules,
    cycle.own_order_evictors): between two jobs of such a VC and one priority class only those
    count, as in the cycle; a VC listed with none lets no such job yield before its end.

    `blocked` are the GPUs of jobs preempted in this cycle that their preemptors do not take
    (ClusterState.block): busy until the victims are gone, free after the grace period.

    `user_limits`: the profile admits by the VCs' per-user caps (user_limit), so a job of a VC
    with caps starts no earlier than its user's own jobs leave it room."""
    now, state = ctx.now, ctx.state
    default_s = settings.default_runtime_s
    released = released or set()
    probes = probes or {}
    # Releases that do not depend on who is asking: jobs stopping, started or about to start
    # in this cycle, and the bookings of jobs estimated earlier in the queue.
    fixed: list[tuple[float, str, int, str]] = []
    going_on: list[RunningJob] = []
    # VCs that cap what one user holds (user_limit): their users' jobs are followed as well.
    user_caps = _user_caps(state) if user_limits else {}
    # Per (VC, user) of such a VC: when their jobs end and what each gives back (GPUs, CPU,
    # memory), unsorted; what they hold now comes from the working state.
    user_ends: defaultdict[tuple[str, str], list[tuple[float, int, int, int]]] = defaultdict(list)
    for job in ctx.snapshot.running:
        if job.id in released:
            # Preempted in this cycle: its VC is charged for its GPUs (those its preemptor takes
            # as well) until it is gone, and its user's caps count it until then. The GPUs its
            # preemptor takes come back through the preemptor's release, the others (`blocked`)
            # when it is gone.
            if not job.parked:
                for hold in holds.get(job.id, ()):
                    quota_gpus = whole_gpus(hold.share_milli) if hold.share_milli else len(hold.gpu_indices)
                    fixed.append((now + settings.grace_period_s, QUOTA_ONLY, quota_gpus, job.vc, hold.model))
            if job.vc in user_caps:
                user_ends[job.vc, job.user].append((now + settings.grace_period_s, *_amounts(job)))
            continue
        if job.stopping:
            vc = "" if job.parked else job.vc  # a parked job's GPUs are charged to no VC
            for hold in holds.get(job.id, ()):
                gone_at = now + settings.grace_period_s
                fixed.append((gone_at, hold.model, len(hold.gpu_indices), vc, hold.model))
            if job.vc in user_caps and not job.parked:
                user_ends[job.vc, job.user].append((now + settings.grace_period_s, *_amounts(job)))
        else:
            going_on.append(job)
    for hold in blocked:  # the victims' VCs get their charge back by the QUOTA_ONLY releases
        fixed.append((now + settings.grace_period_s, hold.model, len(hold.gpu_indices), "", hold.model))
    ends = expected_ends(going_on, ctx, default_s)
    running: list[tuple[RunningJob, float]] = list(zip(going_on, ends, strict=True))
    if user_caps:
        for r, end in running:
            if r.vc in user_caps:
                user_ends[r.vc, r.user].append((end, *_amounts(r)))
    # Jobs started or waiting for their victims in this cycle: their releases are fixed, and
    # the walk below passes over them (looked up only when there are any).
    settled = started.keys() | waiting.keys()
    if settled:
        by_id = {job.id: job for job in queue if job.id in settled}
        for job_id, model in started.items():
            job = by_id[job_id]
            end = now + _remaining(job, default_s)
            fixed.append((end, model, job.gpus, job.vc, model))
            if job.vc in user_caps:
                user_ends[job.vc, job.user].append((end, *_amounts(job)))
        for job_id, (at, model) in waiting.items():
            job = by_id[job_id]
            end = at + _remaining(job, default_s)
            fixed.append((end, model, job.gpus, job.vc, model))
            if job.vc in user_caps:
                user_ends[job.vc, job.user].append((end, *_amounts(job)))
    # Each capped user's room, made when one of their jobs is first reached in the walk.
    user_rooms: dict[tuple[str, str], _UserRoom | _UserGpuRoom] = {}

    def user_room(vc: str, user: str) -> _UserRoom | _UserGpuRoom:
        room = user_rooms.get((vc, user))
        if room is None:
            room = user_rooms[vc, user] = _user_room(
                user_caps[vc], _user_holds(state, vc, user), user_ends.pop((vc, user), []), now
            )
        return room

    # Two time-ordered release streams are merged on the fly: the running jobs' releases
    # (a sorted list), which depend on who asks, and the fixed ones plus bookings (a heap),
    # which do not. The queue is walked
    # once with one cursor; when the kind of job changes (its horizon key), only the running
    # jobs' release times are recomputed, and a job already counted as released that is no
    # longer preemptible for the new kind takes its GPUs back. Start times stay monotone in
    # queue order, and the walk costs O(queue + running x kinds), not O(queue x kinds).
    seq = 0
    # (time, seq, model freed or QUOTA_ONLY, GPUs, VC, model of the VC's usage)
    booked: list[tuple[float, int, str, int, str, str]] = []
    # Per VC: (time, seq, GPUs, model) of its bookings, in time order. Those up to
    # `booked_done`, the (time, seq) of the last booking the walk took off the heap, are given
    # back already.
    vc_booked: defaultdict[str, list[tuple[float, int, int, str]]] = defaultdict(list)
    booked_done: tuple[float, int] = (-math.inf, 0)
    for at, model, gpus, vc, used_model in fixed:
        seq += 1
        booked.append((at, seq, model, gpus, vc, used_model))
        vc_booked[vc].append((at, seq, gpus, used_model))
    heapq.heapify(booked)
    for entries in vc_booked.values():
        entries.sort()
    parts: dict[str, list[tuple[str, int]]] = {
        r.id: [(h.model, len(h.gpu_indices)) for h in holds.get(r.id, ())] for r, _ in running
    }
    released_running: set[int] = set()  # positions in `running`
    latest_end = max((end for _, end in running), default=now)
    # Free GPUs per model; a model not seen yet has none (read without a default each time).
    free: defaultdict[str, int] = defaultdict(int, state.free_total)
    vc_used = {vc: state.vc_used(vc, ALL_MODELS) for vc in state.quotas}
    # What each VC holds of each model that a quota row of its own governs: such a row counts
    # that model alone, as admission does (ClusterState.quota_for), where `vc_used` counts all.
    # Empty on a cluster whose VCs have rows for all models only, and then never read.
    model_used = {
        (vc, model): state.vc_used(vc, model)
        for vc, rows in state.quotas.items()
        for model in rows
        if model != ALL_MODELS
    }

    def row_used(vc: str, row: str) -> int:
        """What a VC's quota row counts: the VC's usage of the row's model, or of every model."""
        if row in (ALL_MODELS, ANY_MODEL):
            return vc_used.get(vc, 0)
        return model_used.get((vc, row), 0)

    # The working state does not change during the estimate: read its per-model figures and
    # quota rows once instead of once per job.
    capacity = state.capacity_total
    # Per model: (GPUs in all, most on one node); a model not listed has none.
    sizes = {model: (gpus, state.max_node_gpus(model)) for model, gpus in capacity.items()}
    # Per (VC, model): guarantee plus borrow limit and the governing row's model, or None where
    # no quota covers it.
    limits: dict[tuple[str, str], tuple[int, str] | None] = {}
    # VCs that keep part of their guarantee from borrowers (a lending limit), with the model of
    # the quota row. A borrowing job waits until the free GPUs cover its own and what the others
    # keep, as admission counts them (lending_fits, each row by row_used).
    keepers = [
        (vc, row_model, quota)
        for vc, rows in state.quotas.items()
        for row_model, quota in rows.items()
        if kept_free(quota, 0)
    ]

    def kept_from(vc: str, quota_model: str, model: str, need: int) -> int:
        """GPUs of `model` other VCs keep from a job of `vc` (none unless the job borrows), as
        admission counts them (kept_of): rows of every model, the all-model rows covered first
        by the free GPUs of other models that their own rows leave over."""
        quota = state.quota_for(vc, quota_model)
        if quota is None or row_used(vc, quota[3]) + need <= quota[0]:
            return 0
        of_model: dict[str, int] = {}
        of_any = 0
        for keeper, row_model, row in keepers:
            if keeper == vc:
                continue
            kept = kept_free(row, row_used(keeper, row_model))
            if row_model == ALL_MODELS:
                of_any += kept
            elif kept:
                of_model[row_model] = of_model.get(row_model, 0) + kept
        return kept_of(model, of_model, of_any, free)

    # Bookings of VCs with a quota, (VC, end, GPUs), go to their VC's list only when one is
    # read (a job held back by its quota, a probe): most bookings are never read back.
    unfiled: list[tuple[str, float, int, int]] = []

    def sort_booked() -> None:
        if not unfiled:
            return
        touched = set()
        for vc, at, booking, gpus, model in unfiled:
            vc_booked[vc].append((at, booking, gpus, model))
            touched.add(vc)
        unfiled.clear()
        for vc in touched:
            vc_booked[vc].sort()

    def own_releases(vc: str, row: str) -> Iterator[tuple[float, int]]:
        """The releases of `vc`'s GPUs that its quota row `row` counts (running jobs and
        bookings; of the row's model only, unless the row is for all models) that the walk has
        not given back yet, in time order: exactly those `row_used` still counts, whatever
        their time. (A release at or before the cursor that the walk did not need for free GPUs
        still frees quota; skipping it by time made the estimate depend on the running jobs'
        order.) Lazy: read at once, before the walk moves on, and only as far as the quota check
        needs."""
        nonlocal vc_passing
        sort_booked()
        if vc_passing is None:
            vc_passing = _by_vc(passing)
        if row in (ALL_MODELS, ANY_MODEL):
            return heapq.merge(
                ((at, gpus) for at, k, gpus, _ in vc_passing.get(vc, ()) if k >= next_passing),
                ((at, gpus) for at, booking, gpus, _ in vc_booked.get(vc, ()) if (at, booking) > booked_done),
            )
        return heapq.merge(
            (
                (at, sum(g for m, g in parts[job_id] if m == row))
                for at, k, _, job_id in vc_passing.get(vc, ())
                if k >= next_passing
            ),
            (
                (at, gpus)
                for at, booking, gpus, model in vc_booked.get(vc, ())
                if model == row and (at, booking) > booked_done
            ),
        )

    # When each running job would yield to a kind of job (horizon key), before the VC rule:
    # the queue is sorted by more than the horizon key, so the same kind comes back after
    # other kinds and reuses its answers.
    yields_by_key: dict[tuple[tuple[float, ...], ...], list[float]] = {}
    borrowing = [ctx.borrowed_gpus.get(r.id, 0) > 0 for r, _ in running]
    victims = going_on
    min_runtime = settings.min_runtime_s
    floors = [r.started_at + min_runtime if r.preemptible else None for r in victims]

    any_model: dict[int, str | None] = {}  # GPUs -> model an any-model job is estimated on
    estimates: dict[str, float | None] = {}
    segment: tuple[tuple[float, ...], ...] | None = None
    all_gone = False
    # (release time, position in `running`, job): the position breaks ties in running order.
    passing: list[tuple[float, int, RunningJob]] = []
    # By VC, made when first read: (time, place in `passing`, GPUs).
    vc_passing: dict[str, list[tuple[float, int, int]]] | None = {}
    next_passing = passing_end = 0
    cursor = now
    if positions is not None:
        pending = ctx.snapshot.pending
        columns = [
            list(map(keys.__getitem__, positions))
            for keys in (_horizon_keys(h, pending, ctx) for h in horizons)
        ]
    else:
        columns = [_horizon_keys(h, queue, ctx) for h in horizons]
    # One key object per kind (the walk then tells a job of the kind it is already on by
    # identity, without hashing or comparing its key).
    kinds: dict[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]] = {}
    horizon_keys: list[tuple[tuple[float, ...], ...]] = (
        [kinds.setdefault(k, k) for k in zip(*columns, strict=True)] if columns else [()] * len(queue)
    )
    heappush, heappop = heapq.heappush, heapq.heappop
    max_kinds = settings.estimate_max_kinds
    for job, key in zip(queue, horizon_keys, strict=True):
        job_id = job.id
        if settled and job_id in settled:
            if job_id not in started:
                estimates[job_id] = waiting[job_id][0]
            continue
        if key is not segment and key not in yields_by_key and len(yields_by_key) >= max_kinds:
            key = _ENDS_ONLY
        if not all_gone and key is not segment and key != segment:
            # Once every running job is gone by its expected end, no kind of job can see one
            # later, so the remaining kinds need no recomputation (and that stays so: the
            # cursor only moves on, and nothing is taken back any more).
            all_gone = len(released_running) == len(running) and cursor >= latest_end
            if not all_gone:
                segment = key
                yields = yields_by_key.get(key)
                if yields is None:
                    if key is _ENDS_ONLY:
                        yields = yields_by_key[key] = [end for _, end in running]
                    else:
                        yields = _yield_times(job, running, victims, floors, ctx, horizons)
                        yields_by_key[key] = yields
                vc = job.vc
                # Only work of the job's own VC and borrowed work yield to it before their end.
                # The VC is the first job's of this run of one kind: later jobs of the run from
                # another VC share its releases (an approximation, see docs/scheduler.md).
                ats = [
                    at if at == end or r.vc == vc or lends else end
                    for at, (r, end), lends in zip(yields, running, borrowing, strict=True)
                ]
                if vc_horizons and vc in vc_horizons:
                    ats = _own_order_yields(job, ats, running, floors, vc_horizons[vc], ctx)
                for i in [i for i in released_running if not ats[i] <= cursor]:
                    # Counted as gone for the kind before, but not yet for this kind: back in use.
                    released_running.discard(i)
                    r = running[i][0]
                    for rmodel, gpus in parts[r.id]:
                        free[rmodel] -= gpus
                        if r.vc in vc_used:
                            vc_used[r.vc] += gpus
                            if model_used and (r.vc, rmodel) in model_used:
                                model_used[r.vc, rmodel] += gpus
                # The releases still to come in the order of (time, position): their positions
                # sorted by time alone, which keeps equal times in position order. A NaN time
                # would make that order depend on how it is reached: then the tuples are sorted.
                if _has_nan(ats):
                    # (time, position) is unique, so the jobs themselves are never compared.
                    passing = sorted(
                        (at, i, running[i][0]) for i, at in enumerate(ats) if i not in released_running
                    )
                else:
                    to_come = [i for i in range(len(ats)) if i not in released_running]
                    to_come.sort(key=ats.__getitem__)
                    passing = [(ats[i], i, running[i][0]) for i in to_come]
                vc_passing = None
                next_passing = 0
                passing_end = len(passing)
        if probes and job_id in probes:
            for probe in probes[job_id]:
                probe_start = _probe_start(
                    probe,
                    cursor,
                    free,
                    passing[next_passing:],
                    parts,
                    booked,
                    row_used,
                    own_releases,
                    ctx,
                )
                if probe_start is not None and probe.vc in user_caps:
                    room = user_room(probe.vc, probe.user)
                    probe_start = room.peek(room.asks(probe), probe_start)
                estimates[probe.id] = probe_start
        asked = model = job.gpu_model
        per_replica = job.gpus_per_replica
        need = job.replicas * per_replica  # job.gpus
        if need <= 0 or per_replica <= 0:
            # Asks for no GPU: the cycle never places it (no-matching-gpu), so it has no start.
            estimates[job_id] = None
            continue
        if model == ANY_MODEL:
            model = any_model.get(need, ANY_MODEL)
            if model == ANY_MODEL:
                model = any_model[need] = _pick_model(job, capacity)
        size = sizes.get(model) if model is not None else None
        if size is None or size[0] < need or size[1] < per_replica:
            estimates[job_id] = None
            continue
        have = free[model]
        quota_model = asked if asked != ANY_MODEL else model
        kept = kept_from(job.vc, quota_model, model, need) if keepers else 0
        while have < need + kept:
            if next_passing < passing_end and (not booked or passing[next_passing][0] <= booked[0][0]):
                at, i, r = passing[next_passing]
                next_passing += 1
                released_running.add(i)
                if at > cursor:
                    cursor = at
                for rmodel, gpus in parts[r.id]:
                    free[rmodel] += gpus
                    if r.vc in vc_used:
                        vc_used[r.vc] -= gpus
                        if model_used and (r.vc, rmodel) in model_used:
                            model_used[r.vc, rmodel] -= gpus
            elif booked:
                at, booking, rmodel, gpus, vc, used_model = heappop(booked)
                booked_done = (at, booking)
                if at > cursor:
                    cursor = at
                if rmodel != QUOTA_ONLY:
                    free[rmodel] += gpus
                if vc in vc_used:
                    vc_used[vc] -= gpus
                    if model_used and (vc, used_model) in model_used:
                        model_used[vc, used_model] -= gpus
            else:
                break
            have = free[model]
            if keepers:
                kept = kept_from(job.vc, quota_model, model, need)
        if have < need + kept:
            estimates[job_id] = None
            continue
        start = cursor
        vc = job.vc
        quota_key = (vc, quota_model)
        limit_row = limits.get(quota_key, _UNREAD)
        if limit_row is _UNREAD:
            quota = state.quota_for(*quota_key)
            limit_row = limits[quota_key] = None if quota is None else (quota[0] + quota[1], quota[3])
        limit = None
        if limit_row is not None:
            limit, row = limit_row
            if need > limit:
                estimates[job_id] = None
                continue
            used = row_used(vc, row)
            if used + need > limit:
                quota_start = _quota_time(own_releases(vc, row), used, need, limit)
                if quota_start is None:
                    estimates[job_id] = None
                    continue
                if quota_start > start:
                    start = quota_start
        # _remaining(job, default_s), written out: this runs for every job of the queue.
        runtime = job.estimated_runtime_s
        if runtime is None:
            runtime = job.time_limit_s if job.time_limit_s is not None else default_s
        remaining = runtime - job.attained_gpu_s / (need if need > 1 else 1)
        if remaining < 60.0:
            remaining = 60.0
        if user_caps and vc in user_caps:
            # The user's room books the job up to its end as well (take: start, then book).
            user_start = user_room(vc, job.user).take(job, start, remaining)
            if user_start is None:
                estimates[job_id] = None
                continue
            start = user_start
        estimates[job_id] = start
        end = start + remaining
        # Book the job as holding its GPUs from now to its end (errs late, never double-counts).
        free[model] = have - need
        if vc in vc_used:
            vc_used[vc] += need
            if model_used and (vc, model) in model_used:
                model_used[vc, model] += need
        seq += 1
        heappush(booked, (end, seq, model, need, vc, model))
        if limit is not None:
            unfiled.append((vc, end, seq, need, model))
    return estimates


def _user_caps(state: ClusterState) -> dict[str, tuple[int | None, int | None, int | None]]:
    """Each VC's caps per user (GPUs, milli-CPUs, MiB of memory), for the VCs with any."""
    return {
        name: (vc.max_gpus_per_user, vc.max_cpu_milli_per_user, vc.max_memory_mib_per_user)
        for name, vc in state.vcs.items()
        if vc.caps_users
    }


def _amounts(job: PendingJob | RunningJob) -> tuple[int, int, int]:
    """What a job counts against its user's caps: GPUs, milli-CPUs, MiB of memory. A fractional
    job counts no GPU: its user holds shares rounded up per GPU, which no one share's end gives
    back (so the estimate errs late for the releases, early for the share's own GPU)."""
    replicas = job.replicas if isinstance(job, PendingJob) else len(job.placement)
    gpus = 0 if job.gpu_share_milli else job.gpus
    return gpus, replicas * job.cpu_milli_per_replica, replicas * job.memory_mib_per_replica


def _user_holds(state: ClusterState, vc: str, user: str) -> tuple[int, int, int]:
    return state.user_gpus(vc, user), state.user_cpu_milli(vc, user), state.user_memory_mib(vc, user)


class _Takes:
    """`take`, what the walk asks of a user's room for each of its jobs, over the room's own
    `asks`, `start` and `book` (of lists, or of plain numbers)."""

    __slots__ = ()

    def asks(self, job: PendingJob) -> Any:
        raise NotImplementedError

    def start(self, asks: Any, not_before: float) -> float | None:
        raise NotImplementedError

    def book(self, asks: Any, end: float) -> None:
        raise NotImplementedError

    def take(self, job: PendingJob, not_before: float, runtime: float) -> float | None:
        """`start` for a job of the walk, booked from then for `runtime` when it starts."""
        asks = self.asks(job)
        at = self.start(asks, not_before)
        if at is not None:
            self.book(asks, at + runtime)
        return at


class _UserRoom(_Takes):
    """What one user of a VC with per-user caps holds as the walk goes on, and when their jobs
    give it back, in the capped amounts only (of GPUs, milli-CPUs, MiB of memory). A user's jobs
    are estimated to start in queue order (each no earlier than the one of theirs before it), so
    the releases are read once, in time order, over the whole walk: the estimate errs late, as
    the walk's bookings do."""

    __slots__ = ("at", "caps", "dims", "ends", "seq", "used")

    def __init__(
        self,
        caps: tuple[int | None, int | None, int | None],
        held: tuple[int, int, int],
        ends: list[tuple[float, int, int, int]],
        now: float,
    ) -> None:
        self.dims = tuple(i for i, cap in enumerate(caps) if cap is not None)
        self.caps = [caps[i] or 0 for i in self.dims]
        self.used = [held[i] for i in self.dims]  # held now plus the jobs booked since
        self.ends = [(end, k, [amounts[i] for i in self.dims]) for k, (end, *amounts) in enumerate(ends)]
        heapq.heapify(self.ends)
        self.at = now  # releases up to here are given back
        self.seq = len(ends)

    def asks(self, job: PendingJob) -> list[int]:
        amounts = _amounts(job)
        return [amounts[i] for i in self.dims]

    def start(self, asks: list[int], not_before: float) -> float | None:
        """When a job asking `asks` fits under the caps, from `not_before` on (None: never).
        Still over after every end it knows of (work held without one), the last end."""
        caps, used, ends = self.caps, self.used, self.ends
        dims = range(len(caps))
        for i in dims:
            if asks[i] > caps[i]:
                return None
        at = self.at if self.at >= not_before else not_before
        pop = heapq.heappop
        while ends and ends[0][0] <= at:
            amounts = pop(ends)[2]
            for i in dims:
                used[i] -= amounts[i]
        while ends:
            for i in dims:
                if used[i] + asks[i] > caps[i]:
                    break
            else:
                break  # it fits
            at, _, amounts = pop(ends)
            for i in dims:
                used[i] -= amounts[i]
        self.at = at
        return at

    def peek(self, asks: list[int], not_before: float) -> float | None:
        """`start` for a request that is only asked about (a what-if hint): nothing is given
        back for good, so the walk's own jobs read the releases as before."""
        used, caps = self.used, self.caps
        if all(used[i] + asks[i] <= caps[i] for i in range(len(caps))):
            # It fits in what is held now, so at once: releases only give room back.
            return self.at if self.at >= not_before else not_before
        saved_used, saved_ends, saved_at = list(used), list(self.ends), self.at
        try:
            return self.start(asks, not_before)
        finally:
            self.used, self.ends, self.at = saved_used, saved_ends, saved_at

    def book(self, asks: list[int], end: float) -> None:
        used = self.used
        for i in range(len(used)):
            used[i] += asks[i]
        self.seq += 1
        heapq.heappush(self.ends, (end, self.seq, asks))


class _UserGpuRoom(_Takes):
    """_UserRoom for the usual caps, on GPUs alone: the same walk over plain numbers instead of
    lists of one, since it runs for every job of a capped VC in every cycle."""

    __slots__ = ("at", "cap", "ends", "seq", "used")

    def __init__(self, cap: int, held: int, ends: list[tuple[float, int, int, int]], now: float) -> None:
        self.cap = cap
        self.used = held  # held now plus the jobs booked since
        self.ends = [(end, k, gpus) for k, (end, gpus, _, _) in enumerate(ends)]
        heapq.heapify(self.ends)
        self.at = now  # releases up to here are given back
        self.seq = len(ends)

    def asks(self, job: PendingJob) -> int:
        return 0 if job.gpu_share_milli else job.gpus  # _amounts(job)[0]

    def start(self, asks: int, not_before: float) -> float | None:
        cap, used, ends = self.cap, self.used, self.ends
        if asks > cap:
            return None
        at = self.at if self.at >= not_before else not_before
        pop = heapq.heappop
        while ends and ends[0][0] <= at:
            used -= pop(ends)[2]
        while ends and used + asks > cap:
            at, _, gpus = pop(ends)
            used -= gpus
        self.used = used
        self.at = at
        return at

    def peek(self, asks: int, not_before: float) -> float | None:
        if self.used + asks <= self.cap:
            return self.at if self.at >= not_before else not_before
        saved_used, saved_ends, saved_at = self.used, list(self.ends), self.at
        try:
            return self.start(asks, not_before)
        finally:
            self.used, self.ends, self.at = saved_used, saved_ends, saved_at

    def book(self, asks: int, end: float) -> None:
        self.used += asks
        self.seq += 1
        heapq.heappush(self.ends, (end, self.seq, asks))


def _user_room(
    caps: tuple[int | None, int | None, int | None],
    held: tuple[int, int, int],
    ends: list[tuple[float, int, int, int]],
    now: float,
) -> _UserRoom | _UserGpuRoom:
    """One user's room: on plain numbers where the VC caps GPUs alone (the usual case)."""
    gpu_cap, cpu_cap, memory_cap = caps
    if gpu_cap is not None and cpu_cap is None and memory_cap is None:
        return _UserGpuRoom(gpu_cap, held[0], ends, now)
    return _UserRoom(caps, held, ends, now)


def _horizon_keys(
    horizon: PreemptionHorizonPlugin, queue: Sequence[PendingJob], ctx: CycleContext
) -> list[tuple[float, ...]]:
    """Every job's horizon key: in one call where the plugin offers `horizon_keys`."""
    bulk = getattr(horizon, "horizon_keys", None)
    if bulk is not None:
        keys: list[tuple[float, ...]] = bulk(queue, ctx)
        return keys
    return [horizon.horizon_key(job, ctx) for job in queue]


def _by_vc(passing: Sequence[tuple[float, int, RunningJob]]) -> dict[str, list[tuple[float, int, int, str]]]:
    """The running jobs' releases per VC, in time order, for the quota checks: (time, place in
    `passing`, GPUs, job id), the place telling whether the walk has given them back yet."""
    by_vc: dict[str, list[tuple[float, int, int, str]]] = {}
    for k, (at, _, r) in enumerate(passing):
        by_vc.setdefault(r.vc, []).append((at, k, r.gpus, r.id))
    for entries in by_vc.values():
        entries.sort()
    return by_vc


def _yield_times(
    job: PendingJob,
    running: Sequence[tuple[RunningJob, float]],
    victims: Sequence[RunningJob],
    floors: Sequence[float | None],
    ctx: CycleContext,
    horizons: Sequence[PreemptionHorizonPlugin],
) -> list[float]:
    """When each running job's GPUs become available to `job` if the victim's VC rule lets
    it yield (same VC, or borrowed work; the walk applies that rule): its expected end, or
    earlier if the job may preempt it. The same for every job of one horizon key. Each
    horizon answers for all running jobs in one call where it offers `yields_at_all`.
    `victims` are the running jobs and `floors` the earliest each may be stopped (None: it
    may not be), the same lists for every kind, so a horizon may group them once."""
    best = [end for _, end in running]
    for horizon in horizons:
        bulk = getattr(horizon, "yields_at_all", None)
        if bulk is not None:
            times: list[float | None] = bulk(job, victims, ctx)
        else:
            times = [horizon.yields_at(job, victim, ctx) for victim in victims]
        best = [
            b if at is None or floor is None else min(b, max(at, floor))
            for b, at, floor in zip(best, times, floors, strict=True)
        ]
    return best


def _own_order_yields(
    job: PendingJob,
    ats: list[float],
    running: Sequence[tuple[RunningJob, float]],
    floors: Sequence[float | None],
    horizons: Sequence[PreemptionHorizonPlugin],
    ctx: CycleContext,
) -> list[float]:
    """`ats` with the running jobs of `job`'s VC and priority class yielding by their VC's own
    rules only (none: at their end)."""
    out = list(ats)
    for i, (r, end) in enumerate(running):
        if r.vc != job.vc or r.priority != job.priority:
            continue
        out[i] = end
        floor = floors[i]
        for horizon in horizons:
            at = horizon.yields_at(job, r, ctx)
            if at is not None and floor is not None:
                out[i] = min(out[i], max(at, floor))
    return out


def _has_nan(times: Sequence[float]) -> bool:
    """Whether a release time is NaN (then the walk sorts its releases as tuples)."""
    return any(map(math.isnan, times))


def _remaining(job: PendingJob, default_s: float) -> float:
    run_so_far = job.attained_gpu_s / max(job.gpus, 1)
    return max(expected_runtime(job, default_s) - run_so_far, 60.0)


def _quota_time(vc_releases: Iterable[tuple[float, int]], used: int, need: int, limit: int) -> float | None:
    """The time of the VC's release that brings its usage low enough for `need` more GPUs
    (the caller starts the job no earlier than its cursor), or None if they never do. The
    releases are those `used` still counts, in time order, at any time: one the walk has not
    given back lowers the usage even if it lies before the cursor. Never the cursor by
    default, which told a job held back by its quota that it starts now. Not the last
    release either when they never make room (usage the walk never gives back, as a VC over
    a lowered limit): which releases are left
    at that point depends on the order of the running jobs, and the plan must not."""
    if used + need <= limit:
        return -math.inf  # fits already: no later than any cursor
    for at, gpus in vc_releases:
        used -= gpus
        if used + need <= limit:
            return at
    return None


def _pick_model(job: PendingJob, capacity: Mapping[str, int]) -> str | None:
    if job.gpu_model != ANY_MODEL:
        return job.gpu_model
    fitting = sorted((-c, m) for m, c in capacity.items() if c >= job.gpus)
    return fitting[0][1] if fitting else None


def _probe_start(
    probe: PendingJob,
    cursor: float,
    free: Mapping[str, int],
    passing: Sequence[tuple[float, int, RunningJob]],
    parts: Mapping[str, list[tuple[str, int]]],
    booked: Sequence[tuple[float, int, str, int, str, str]],
    row_used: Callable[[str, str], int],
    own_releases: Callable[[str, str], Iterator[tuple[float, int]]],
    ctx: CycleContext,
) -> float | None:
    """The start the walk would give `probe` at the cursor, read ahead without consuming any
    release: the merged future releases of its model are scanned until enough GPUs are free."""
    state = ctx.state
    model = _pick_model(probe, state.capacity_total)
    need = probe.gpus
    if (
        model is None
        or state.capacity_total.get(model, 0) < need
        or state.max_node_gpus(model) < probe.gpus_per_replica
    ):
        return None
    start = cursor
    available = free.get(model, 0)
    if available < need:
        running_releases = ((at, sum(g for m, g in parts[r.id] if m == model)) for at, _, r in passing)
        later_bookings = ((at, gpus) for at, _, m, gpus, _, _ in sorted(booked) if m == model)
        for at, gpus in heapq.merge(running_releases, later_bookings):
            available += gpus
            if available >= need:
                start = max(cursor, at)
                break
        else:
            return None
    quota = state.quota_for(probe.vc, model)
    if quota is not None:
        limit = quota[0] + quota[1]
        if need > limit:
            return None
        row = quota[3]
        used = row_used(probe.vc, row)
        if used + need > limit:
            quota_start = _quota_time(own_releases(probe.vc, row), used, need, limit)
            if quota_start is None:
                return None
            start = max(start, quota_start)
    return start

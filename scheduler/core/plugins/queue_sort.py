"""Queue-sort plugins: which pending job gets the next chance at the GPUs.

Keys are tuples of floats, concatenated in profile order, so a profile such as
["priority", "las", "fifo"] means: priority class first, then LAS queue, then arrival.

Each plugin also gives the keys of a whole queue at once (`sort_keys`, and `horizon_keys`
for the preemption horizons): the same keys as one call per job, without a method call per
job and per plugin, which is much of the cost of ordering a queue of tens of thousands. Where
a key takes few values (a priority class, a LAS queue), jobs of one value share one tuple.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter, lt
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.service_history import gittins_table
from scheduler.core.types import PendingJob, RunningJob

DEFAULT_RUNTIME_S = 3600.0
_ARRIVAL = attrgetter("submitted_at", "id")  # (submitted_at, id), the order of submission


def sweep_of(job: PendingJob | RunningJob, window_s: float) -> tuple[int, tuple[str, str, int]]:
    """The submission window and the kind (VC, user, width) that mark jobs as runs of one sweep,
    for group ranking and for siblings alike."""
    return int(job.submitted_at // window_s), (job.vc, job.user, job.gpus)


def over_spans(
    spans: Sequence[tuple[float, float, int]], yields_in: Callable[[int], list[float | None]]
) -> list[float | None]:
    """The earliest yield times over the queues a waiting job passes through (`spans` of
    (from, until, queue), the first from now): each queue's answers count from when the job
    enters that queue until it leaves it."""
    (_, until, level), *later = spans
    times = yields_in(level)
    if not later:
        return times
    times = [at if at is not None and at < until else None for at in times]
    for start, until, level in later:
        for position, at in enumerate(yields_in(level)):
            if at is not None:
                at = max(at, start)
                if at < until and (times[position] is None or at < times[position]):
                    times[position] = at
    return times


def by_arrival(jobs: Sequence[PendingJob]) -> Sequence[PendingJob]:
    """`jobs` sorted by (submitted_at, id). A queue whose submission times already rise
    strictly (as a snapshot's usually do) is in that order and is returned as it is."""
    times = [job.submitted_at for job in jobs]
    if all(map(lt, times, times[1:])):
        return jobs
    return sorted(jobs, key=_ARRIVAL)


def expected_runtime(job: PendingJob | RunningJob, default_s: float = DEFAULT_RUNTIME_S) -> float:
    """Best runtime guess available at submission: the history-based estimate, else the time
    limit, else a default. Never the true duration, which nobody knows in advance."""
    if job.estimated_runtime_s is not None:
        return job.estimated_runtime_s
    if job.time_limit_s is not None:
        return job.time_limit_s
    return default_s


class Fifo:
    """First come, first served: by the time the job (last) entered the queue."""

    name = "fifo"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.by_requeue = bool(args.get("by_requeue_time", False))

    def prepare(self, ctx: CycleContext) -> None:
        pass

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        return (job.waiting_since if self.by_requeue else job.submitted_at,)

    def sort_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        if self.by_requeue:
            return [(job.waiting_since,) for job in jobs]
        return [(job.submitted_at,) for job in jobs]


class PriorityClass:
    """Higher priority value first (production 1000 before dev 100)."""

    name = "priority"

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def prepare(self, ctx: CycleContext) -> None:
        pass

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        return (-float(job.priority),)

    def sort_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        shared = {priority: (-float(priority),) for priority in {job.priority for job in jobs}}
        return [shared[job.priority] for job in jobs]

    def may_preempt(self, preemptor: PendingJob, victim: RunningJob, ctx: CycleContext) -> str | None:
        return "priority" if preemptor.priority > victim.priority else None

    def horizon_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        return (float(job.priority),)

    def horizon_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        shared = {priority: (float(priority),) for priority in {job.priority for job in jobs}}
        return [shared[job.priority] for job in jobs]

    def yields_at(self, job: PendingJob, victim: RunningJob, ctx: CycleContext) -> float | None:
        return ctx.now if job.priority > victim.priority else None

    def yields_at_all(
        self, job: PendingJob, victims: Sequence[RunningJob], ctx: CycleContext
    ) -> list[float | None]:
        now, priority = ctx.now, job.priority
        return [now if priority > victim.priority else None for victim in victims]


class DiscretizedLas:
    """Tiresias' discretized two-dimensional least-attained-service (2D-LAS).

    Service is attained GPU-time (GPUs x seconds, the "2D" of Tiresias) or plain run time.
    Jobs fall into queue k when their service passed k thresholds; lower queues go first, so
    short jobs finish quickly without anyone knowing durations in advance. Discretizing
    (instead of continuous LAS) keeps jobs of similar service from preempting each other
    back and forth. The starvation guard moves a job that has waited `starvation_factor`
    times its own run time back to queue 0.

    Jobs submitted together (`group_window_s` > 0: the same VC, user and width, submitted in
    the same window of that many seconds) are ranked by the most service any of them has
    attained while still unfinished. Such jobs are usually runs of one experiment with
    nearly the same duration (on the Philly log the variance of log duration inside such
    groups is 0.24 against 4.07 over all jobs), so once one of them has run for a day
    without ending, a sibling that has not started is most likely a day-long job as well.
    Ranked by their own service, the siblings can take turns on the GPUs (a fresh one
    outranks one that has run), each finishing later than if they ran one after another;
    ranked by the group's, the first started finish first. Finished siblings are not used:
    they say when the others will end, which favours them rather than holding them back,
    and learning that from so few jobs did not help on the traces (docs/benchmarks.md).
    A waiting job's rank thus rises while its group has a job running, and the estimator
    follows it queue by queue: under Gittins order a later queue may rank higher (in one
    cluster02 replay, on day 38, a 1-GPU job just past 900 GPU-s outranked one just past
    1,800 and a fresh one did not), so the job may preempt sooner than its queue at
    submission says.

    Siblings (`sibling_window_s` > 0: jobs of one VC, user and width submitted in the same
    window of that many seconds) never preempt each other, whatever their queues. A sweep's
    runs that did not all fit would otherwise take turns: each time the running ones cross a
    threshold, the waiting ones, fresh, outrank and stop them. Where the runs last about as
    long as each other, all of them then end later than if the first started had finished
    first; where they differ widely, taking turns may serve the short ones sooner (on one
    such sweep of cluster04 the rule gained nothing, docs/benchmarks.md). The estimator
    counts a running sibling as releasing its GPUs at its end only.

    It is also a preemption plugin (a job in a lower queue may preempt one in a higher queue;
    with `preempt_levels` n > 1, only one at least n queues higher, so that jobs one queue
    apart wait for each other instead of taking turns) and a post-cycle plugin (asks for a
    cycle when a running job crosses a threshold, since that is when a waiting job may start
    to outrank it).
    """

    name = "las"

    def __init__(self, args: Mapping[str, Any]) -> None:
        thresholds: Sequence[float] = args.get("thresholds", [3600.0 * 4])
        self.thresholds = sorted(float(t) for t in thresholds)
        self.service = str(args.get("service", "gpu_time"))
        if self.service not in ("gpu_time", "time"):
            raise ValueError(f"las: service must be gpu_time or time, not {self.service!r}")
        self.starvation_factor = float(args.get("starvation_factor", 0.0))
        self.starvation_min_wait_s = float(args.get("starvation_min_wait_s", 0.0))
        self.group_window_s = float(args.get("group_window_s", 0.0))
        if self.group_window_s < 0:
            raise ValueError("las: group_window_s must not be negative")
        self.sibling_window_s = float(args.get("sibling_window_s", 0.0))
        if self.sibling_window_s < 0:
            raise ValueError("las: sibling_window_s must not be negative")
        self.preempt_levels = int(args.get("preempt_levels", 1))
        if self.preempt_levels < 1:
            raise ValueError("las: preempt_levels must be at least 1")
        # Inside a queue: "arrival" keeps Tiresias' FIFO; "service" orders by attained service
        # (closer to continuous LAS, without its back-and-forth preemption).
        self.order_in_queue = str(args.get("order_in_queue", "arrival"))
        if self.order_in_queue not in ("arrival", "service"):
            raise ValueError("las: order_in_queue must be arrival or service")
        self._pending: Sequence[PendingJob] = ()
        self._running_levels: dict[str, int] = {}
        # Queue of each pending job by id, as of `_levels_now` (the first answer for an id wins).
        self._pending_levels: dict[str, int] = {}
        self._levels_now: float | None = None
        # The last tuple of jobs `_levels` and `_kinds` were asked about (the snapshot's queue:
        # prepare, sort_keys, horizon_keys and wake_at all ask) with their answers, until
        # `_levels_now` moves.
        self._levels_of: tuple[Sequence[PendingJob], list[int]] | None = None
        self._kinds_of: tuple[Sequence[PendingJob], list[int], list[tuple[int, int, int]]] | None = None
        # Most GPU-seconds attained by an unfinished job of each group, by submission window
        # and then (VC, user, GPUs); only groups with some. Most jobs' window has none, and
        # they are told apart by one lookup.
        self._group_attained: dict[int, dict[tuple[str, str, int], float]] = {}
        # The sibling groups and the ranking groups with a running job (`_running_sweeps`): a
        # horizon key tells a job with either by the number; a group's rank grows from the
        # most its running jobs have attained.
        self._running_siblings: dict[int, dict[tuple[str, str, int], tuple[int, float]]] = {}
        self._running_groups: dict[int, dict[tuple[str, str, int], tuple[int, float]]] = {}
        # The last victim list `_spare_siblings` saw (kept to tell it again by identity), and
        # the positions in it of each sibling sweep's running jobs.
        self._sibling_victims: Sequence[RunningJob] | None = None
        self._sibling_positions: dict[tuple[int, tuple[str, str, int]], list[int]] = {}

    def prepare(self, ctx: CycleContext) -> None:
        self._pending = ctx.snapshot.pending
        self._sibling_victims = None
        self._group_attained = self._groups_attained(ctx) if self.group_window_s > 0 else {}
        running = ctx.snapshot.running
        self._running_groups = self._running_sweeps(running, self.group_window_s)
        self._running_siblings = self._running_sweeps(running, self.sibling_window_s)
        self._running_levels = {
            job.id: self.level(self.service_of(self.ranked_attained(job), job.gpus))
            for job in ctx.snapshot.running
        }
        self._levels(ctx.snapshot.pending, ctx.now)

    @staticmethod
    def _running_sweeps(
        running: Sequence[RunningJob], window_s: float
    ) -> dict[int, dict[tuple[str, str, int], tuple[int, float]]]:
        """The sweeps (`sweep_of`) with a running job, by window and then kind: their number
        in running order and the most GPU-seconds a running one of them has attained."""
        sweeps: dict[int, dict[tuple[str, str, int], tuple[int, float]]] = {}
        if window_s <= 0:
            return sweeps
        numbered = 0
        for job in running:
            window, kind = sweep_of(job, window_s)
            kinds = sweeps.setdefault(window, {})
            entry = kinds.get(kind)
            if entry is None:
                kinds[kind] = (numbered, job.attained_gpu_s)
                numbered += 1
            elif job.attained_gpu_s > entry[1]:
                kinds[kind] = (entry[0], job.attained_gpu_s)
        return sweeps

    def _groups_attained(self, ctx: CycleContext) -> dict[int, dict[tuple[str, str, int], float]]:
        best: dict[int, dict[tuple[str, str, int], float]] = {}
        for jobs in (ctx.snapshot.running, ctx.snapshot.pending):
            for job in jobs:
                attained = job.attained_gpu_s
                if attained > 0:
                    window, kind = sweep_of(job, self.group_window_s)
                    groups = best.setdefault(window, {})
                    if attained > groups.get(kind, 0.0):
                        groups[kind] = attained
        return best

    def ranked_attained(self, job: PendingJob | RunningJob) -> float:
        """The GPU-seconds a job is ranked by: its own, or its group's when more (see the
        class docstring)."""
        attained = job.attained_gpu_s
        if self._group_attained:
            groups = self._group_attained.get(int(job.submitted_at // self.group_window_s))
            if groups:  # most windows have none: the kind is looked up only where one has
                group = groups.get((job.vc, job.user, job.gpus), 0.0)
                if group > attained:
                    return group
        return attained

    def spares(self, job: PendingJob, victim: RunningJob) -> bool:
        """Whether `job` leaves `victim` alone because they are siblings (`sweep_of` both,
        compared field by field: this is asked once per candidate victim)."""
        window = self.sibling_window_s
        return (
            window > 0
            and job.gpus == victim.gpus
            and job.user == victim.user
            and job.vc == victim.vc
            and int(job.submitted_at // window) == int(victim.submitted_at // window)
        )

    def with_sweeps(
        self, jobs: Sequence[PendingJob], keys: list[tuple[float, ...]]
    ) -> list[tuple[float, ...]]:
        """Horizon keys that tell apart jobs whose yield times differ from others of their
        kind: jobs with running siblings, which never preempt some running jobs that others
        may (tagged 0, 1, ...), and jobs whose group has a job running, whose rank rises while
        they wait (tagged -1, -2, ...)."""
        for sweeps, window_s, first, step in (
            (self._running_siblings, self.sibling_window_s, 0.0, 1.0),
            (self._running_groups, self.group_window_s, -1.0, -1.0),
        ):
            if not sweeps:
                continue
            for position, job in enumerate(jobs):
                kinds = sweeps.get(int(job.submitted_at // window_s))  # most windows have none
                if kinds:
                    entry = kinds.get((job.vc, job.user, job.gpus))
                    if entry is not None:
                        keys[position] = (*keys[position], first + step * entry[0])
        return keys

    def waiting_levels(self, job: PendingJob, now: float) -> list[tuple[float, float, int]]:
        """The queues `job` is in while it waits, each with when it enters and leaves it: its
        queue now, unless its group has a job running, whose service raises the group's rank
        (and so the job's) queue by queue."""
        level = self.pending_level(job, now)
        spans = [(now, math.inf, level)]
        if not self._running_groups:
            return spans
        window, kind = sweep_of(job, self.group_window_s)
        entry = self._running_groups.get(window, {}).get(kind)
        if entry is None or level != self.level(self.service_of(self.ranked_attained(job), job.gpus)):
            return spans  # no group running, or the starvation guard holds it in queue 0
        best = entry[1]  # GPU-seconds, growing by the job's width per second
        per_unit = 1.0 if self.service == "gpu_time" else float(job.gpus)  # GPU-s per unit
        spans, start, current = [], now, level
        for upper in range(level, len(self.thresholds)):
            at = now + max(self.thresholds[upper] * per_unit - best, 0.0) / max(job.gpus, 1)
            if at > start:
                spans.append((start, at, current))
                start = at
            current = upper + 1
        spans.append((start, math.inf, current))
        return spans

    def _spare_siblings(
        self, job: PendingJob, victims: Sequence[RunningJob], times: list[float | None]
    ) -> list[float | None]:
        """`times` with the job's running siblings never yielding to it. The estimator asks
        with the same victims for every kind of job, so they are grouped by sweep once: a
        victim that `spares` would name is one of the job's sweep."""
        if self._running_siblings:
            sweep = sweep_of(job, self.sibling_window_s)
            if sweep[1] in self._running_siblings.get(sweep[0], ()):
                if self._sibling_victims is not victims:
                    positions: dict[tuple[int, tuple[str, str, int]], list[int]] = {}
                    for position, victim in enumerate(victims):
                        positions.setdefault(sweep_of(victim, self.sibling_window_s), []).append(position)
                    self._sibling_victims, self._sibling_positions = victims, positions
                for position in self._sibling_positions.get(sweep, ()):
                    times[position] = None
        return times

    def service_of(self, attained_gpu_s: float, gpus: int) -> float:
        if self.service == "gpu_time":
            return attained_gpu_s
        return attained_gpu_s / max(gpus, 1)

    def level(self, service: float) -> int:
        return bisect.bisect_right(self.thresholds, service)

    def pending_level(self, job: PendingJob, now: float) -> int:
        if now != self._levels_now:
            self._pending_levels = {}
            self._levels_now = now
            self._levels_of = self._kinds_of = None
        level = self._pending_levels.get(job.id)
        if level is None:
            level = self._pending_levels[job.id] = self._pending_level(job, now)
        return level

    def _levels(self, jobs: Sequence[PendingJob], now: float) -> list[int]:
        """The levels of `jobs`, in their order, as pending_level has them (and recorded there).
        Kept for a tuple (the snapshot's queue, told by identity: its jobs cannot change)."""
        if now != self._levels_now:
            self._pending_levels = {}
            self._levels_now = now
            self._levels_of = self._kinds_of = None
        elif self._levels_of is not None and self._levels_of[0] is jobs:
            return self._levels_of[1]
        levels = self._pending_levels
        listed: list[int] | None = None
        if not levels:
            # Nothing recorded yet (prepare's call): every level is computed, then recorded in
            # one go. The first answer for an id must win, so where ids repeat (the recorded
            # ones are fewer) they are recorded job by job below instead.
            computed = self._computed_levels(jobs, now)
            recorded = {job.id: level for job, level in zip(jobs, computed, strict=True)}
            if len(recorded) == len(computed):
                self._pending_levels = recorded
                listed = computed
        if listed is None:
            missing = [job for job in jobs if job.id not in levels]
            for job, level in zip(missing, self._computed_levels(missing, now), strict=True):
                levels.setdefault(job.id, level)
            listed = [levels[job.id] for job in jobs]
        if isinstance(jobs, tuple):
            self._levels_of = (jobs, listed)
        return listed

    def _computed_levels(self, jobs: Sequence[PendingJob], now: float) -> list[int]:
        """_pending_level of each of `jobs`, in their order."""
        if self.starvation_factor > 0 or self.service != "gpu_time":
            return [self._pending_level(job, now) for job in jobs]
        # _pending_level without the starvation guard, written out for long queues.
        thresholds, bisect_right = self.thresholds, bisect.bisect_right
        if not self._group_attained:
            return [bisect_right(thresholds, job.attained_gpu_s) for job in jobs]
        ranked = self.ranked_attained
        return [bisect_right(thresholds, ranked(job)) for job in jobs]

    def _kinds(self, jobs: Sequence[PendingJob], now: float) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Each job's kind (priority, GPUs, queue), which decides its sort key, its horizon key
        but for sweeps, and what it waits for: the kinds seen, and each job's place in them.
        The keys are then made per kind and looked up per job by a list index, without a
        tuple per job and per pass. Kept for the snapshot's queue (a tuple, told by identity),
        which prepare, sort_keys, horizon_keys and wake_at all ask about."""
        cached = self._kinds_of
        if cached is not None and cached[0] is jobs and now == self._levels_now:
            return cached[1], cached[2]
        numbers: dict[tuple[int, int, int], int] = {}
        places = []
        for job, level in zip(jobs, self._levels(jobs, now), strict=True):
            kind = (job.priority, job.gpus, level)
            number = numbers.get(kind)
            if number is None:
                number = numbers[kind] = len(numbers)
            places.append(number)
        kinds = list(numbers)
        if isinstance(jobs, tuple):
            self._kinds_of = (jobs, places, kinds)
        return places, kinds

    def _pending_level(self, job: PendingJob, now: float) -> int:
        level = self.level(self.service_of(self.ranked_attained(job), job.gpus))
        if level and self.starvation_factor > 0:
            run_time = job.attained_gpu_s / max(job.gpus, 1)
            waited = now - job.waiting_since
            if waited >= max(self.starvation_factor * run_time, self.starvation_min_wait_s):
                return 0
        return level

    def running_level(self, job: RunningJob) -> int:
        level = self._running_levels.get(job.id)
        if level is None:
            level = self.level(self.service_of(self.ranked_attained(job), job.gpus))
        return level

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        level = float(self.pending_level(job, ctx.now))
        if self.order_in_queue == "service":
            return (level, self.service_of(self.ranked_attained(job), job.gpus))
        return (level,)

    def sort_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        levels = self._levels(jobs, ctx.now)
        if self.order_in_queue == "service":
            return [
                (float(level), self.service_of(self.ranked_attained(job), job.gpus))
                for job, level in zip(jobs, levels, strict=True)
            ]
        shared = [(float(level),) for level in range(len(self.thresholds) + 1)]
        return [shared[level] for level in levels]

    def may_preempt(self, preemptor: PendingJob, victim: RunningJob, ctx: CycleContext) -> str | None:
        if preemptor.priority < victim.priority or self.spares(preemptor, victim):
            return None
        if self.pending_level(preemptor, ctx.now) + self.preempt_levels <= self.running_level(victim):
            return "las"
        return None

    def horizon_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        return self.with_sweeps([job], [(float(job.priority), float(self.pending_level(job, ctx.now)))])[0]

    def horizon_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        places, kinds = self._kinds(jobs, ctx.now)
        shared = [(float(priority), float(level)) for priority, _, level in kinds]
        return self.with_sweeps(jobs, [shared[place] for place in places])

    def yields_at(self, job: PendingJob, victim: RunningJob, ctx: CycleContext) -> float | None:
        """When the victim's service crosses into a queue behind the job's: now if it already
        has, else when it reaches the job's queue threshold at its current rate."""
        if job.priority < victim.priority or self.spares(job, victim):
            return None
        now = ctx.now
        spans = self.waiting_levels(job, now)
        return over_spans(spans, lambda level: [self._yield_in_queue(level, victim, now)])[0]

    def _yield_in_queue(self, level: int, victim: RunningJob, now: float) -> float | None:
        # The victim yields once it is in queue `level + preempt_levels` or beyond.
        level += self.preempt_levels - 1
        if level < self.running_level(victim):
            return now
        if level >= len(self.thresholds):
            return None
        rate = float(victim.gpus) if self.service == "gpu_time" else 1.0
        service = self.service_of(self.ranked_attained(victim), victim.gpus)
        return now + max(self.thresholds[level] - service, 0.0) / max(rate, 1e-9)

    def yields_at_all(
        self, job: PendingJob, victims: Sequence[RunningJob], ctx: CycleContext
    ) -> list[float | None]:
        """yields_at for every victim, with what depends only on `job` worked out once."""
        spans = self.waiting_levels(job, ctx.now)
        times = over_spans(spans, lambda level: self._yields_in_queue(job, level, victims, ctx.now))
        return self._spare_siblings(job, victims, times)

    def _yields_in_queue(
        self, job: PendingJob, level: int, victims: Sequence[RunningJob], now: float
    ) -> list[float | None]:
        """yields_at for every victim while `job` is in queue `level`."""
        priority = job.priority
        level += self.preempt_levels - 1
        threshold = self.thresholds[level] if level < len(self.thresholds) else None
        by_gpu_time = self.service == "gpu_time"
        running_levels = self._running_levels
        times: list[float | None] = []
        for victim in victims:
            if priority < victim.priority:
                times.append(None)
                continue
            victim_level = running_levels.get(victim.id)
            if victim_level is None:
                victim_level = self.running_level(victim)
            if level < victim_level:
                times.append(now)
            elif threshold is None:
                times.append(None)
            else:
                rate = float(victim.gpus) if by_gpu_time else 1.0
                service = self.service_of(self.ranked_attained(victim), victim.gpus)
                times.append(now + max(threshold - service, 0.0) / max(rate, 1e-9))
        return times

    def wake_at(self, ctx: CycleContext) -> float | None:
        """The next time a running job's demotion lets a waiting job preempt it. Only
        crossings out of a queue that holds a waiting job of at least the same priority
        count: any other crossing changes no decision, and each needless wake is a cycle."""
        if not self._pending:
            return None
        waiting_levels: dict[int, set[int]] = {}
        for priority, _, level in self._kinds(self._pending, ctx.now)[1]:
            waiting_levels.setdefault(priority, set()).add(level)
        earliest: float | None = None
        gap = self.preempt_levels - 1
        for job in ctx.snapshot.running:
            if job.stopping or not job.preemptible:
                continue
            service = self.service_of(self.ranked_attained(job), job.gpus)
            i = bisect.bisect_right(self.thresholds, service)
            if i >= len(self.thresholds):
                continue
            if gap:
                # Crossing into queue w + preempt_levels lets a waiting job of queue w in: the
                # first such crossing still ahead of the running job.
                targets = [
                    w + gap
                    for p, levels in waiting_levels.items()
                    if p >= job.priority
                    for w in levels
                    if i <= w + gap < len(self.thresholds)
                ]
                if not targets:
                    continue
                crossing = min(targets)
            elif any(i in levels for p, levels in waiting_levels.items() if p >= job.priority):
                crossing = i  # into queue i + 1, where a waiting job of queue i outranks it
            else:
                continue
            rate = float(job.gpus) if self.service == "gpu_time" else 1.0
            if rate <= 0:
                continue
            at = ctx.now + (self.thresholds[crossing] - service) / rate
            if earliest is None or at < earliest:
                earliest = at
        if self.starvation_factor > 0:
            for pending in self._pending:
                if pending.attained_gpu_s <= 0:
                    continue
                run_time = pending.attained_gpu_s / max(pending.gpus, 1)
                wait = max(self.starvation_factor * run_time, self.starvation_min_wait_s)
                at = pending.waiting_since + wait
                if at > ctx.now and (earliest is None or at < earliest):
                    earliest = at
        return earliest


class GittinsIndex(DiscretizedLas):
    """Discretized 2D Gittins index (Tiresias' alternative to LAS when the service
    distribution is known), with the distribution learned from the snapshot's finished jobs.

    The queues are LAS's; only their order differs: each (width, queue) is ranked by its
    Gittins index, so a job whose kind usually ends soon after the service it has attained
    goes before a fresh job whose kind usually runs long. Where LAS always puts new work
    first, this may keep a 1-GPU job that is near its usual end ahead of a new 8-GPU gang. A
    running job is preempted for a waiting one whose index exceeds its own `preempt_ratio`
    times. With too few finished jobs it is plain LAS.
    """

    name = "gittins"

    def __init__(self, args: Mapping[str, Any]) -> None:
        super().__init__(args)
        self.by_width = bool(args.get("by_width", True))
        self.min_samples = int(args.get("min_samples", 50))
        self.preempt_ratio = float(args.get("preempt_ratio", 1.0))
        if self.preempt_ratio < 1.0:
            raise ValueError("gittins: preempt_ratio must be at least 1")
        self._tables: dict[int, tuple[float, ...]] = {}
        self._pooled: tuple[float, ...] | None = None
        self._yield_levels: dict[tuple[int, int, float], int | None] = {}
        # The last victim list grouped by _victim_groups (kept to tell it again by identity).
        self._grouped_victims: Sequence[RunningJob] | None = None
        self._victim_group_list: list[tuple[tuple[int, int, int], list[int], list[float]]] = []
        # Until there is history: falling indices by queue, which is LAS's order.
        self._las_order = tuple(1.0 / (level + 1) for level in range(len(self.thresholds) + 1))

    def prepare(self, ctx: CycleContext) -> None:
        super().prepare(ctx)
        self._tables, self._pooled = gittins_table(
            ctx.snapshot.finished,
            tuple(self.thresholds),
            self.by_width,
            self.min_samples,
            per_gpu=self.service == "time",
        )
        self._yield_levels = {}
        self._grouped_victims = None

    def index(self, gpus: int, level: int) -> float:
        return self._table(gpus)[level]

    def _table(self, gpus: int) -> tuple[float, ...]:
        table = self._tables.get(gpus, self._pooled)
        return self._las_order if table is None else table

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        level = self.pending_level(job, ctx.now)
        return (-self.index(job.gpus, level), float(level))

    def sort_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        places, kinds = self._kinds(jobs, ctx.now)
        shared = [(-self.index(gpus, level), float(level)) for _, gpus, level in kinds]
        return [shared[place] for place in places]

    def may_preempt(self, preemptor: PendingJob, victim: RunningJob, ctx: CycleContext) -> str | None:
        if preemptor.priority < victim.priority or self.spares(preemptor, victim):
            return None
        mine = self.index(preemptor.gpus, self.pending_level(preemptor, ctx.now))
        theirs = self.index(victim.gpus, self.running_level(victim))
        return "gittins" if mine > self.preempt_ratio * theirs else None

    def horizon_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        key = (float(job.priority), self.index(job.gpus, self.pending_level(job, ctx.now)))
        return self.with_sweeps([job], [key])[0]

    def horizon_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        places, kinds = self._kinds(jobs, ctx.now)
        shared = [(float(priority), self.index(gpus, level)) for priority, gpus, level in kinds]
        return self.with_sweeps(jobs, [shared[place] for place in places])

    def _yield_level(self, gpus: int, current: int, index: float) -> int | None:
        """The first queue from `current` on in which a running job of `gpus` GPUs has an
        index below `index` / preempt_ratio (None: never). Asked for every running job by
        every kind of waiting job, so answers are kept for the cycle."""
        key = (gpus, current, index)
        if key in self._yield_levels:
            return self._yield_levels[key]
        table = self._table(gpus)
        ratio = self.preempt_ratio
        level = next((lv for lv in range(current, len(table)) if ratio * table[lv] < index), None)
        self._yield_levels[key] = level
        return level

    def _yields_after(self, index: float, victim: RunningJob, now: float) -> float | None:
        """When the victim's index first falls below `index` / preempt_ratio: now, at its
        crossing into a later queue, or never."""
        current = self._running_levels.get(victim.id)
        if current is None:
            current = self.running_level(victim)
        level = self._yield_level(victim.gpus, current, index)
        if level is None:
            return None
        if level == current:
            return now
        rate = float(victim.gpus) if self.service == "gpu_time" else 1.0
        service = self.service_of(self.ranked_attained(victim), victim.gpus)
        return now + max(self.thresholds[level - 1] - service, 0.0) / max(rate, 1e-9)

    def yields_at(self, job: PendingJob, victim: RunningJob, ctx: CycleContext) -> float | None:
        if job.priority < victim.priority or self.spares(job, victim):
            return None
        now = ctx.now
        spans = self.waiting_levels(job, now)
        gpus = job.gpus
        return over_spans(spans, lambda level: [self._yields_after(self.index(gpus, level), victim, now)])[0]

    def _yields_in_queue(
        self, job: PendingJob, level: int, victims: Sequence[RunningJob], now: float
    ) -> list[float | None]:
        """The estimator asks this per kind of waiting job about every running job (16 kinds
        x 6,000 jobs in a 50,000-job cycle), so the victims are grouped once by what the
        answer depends on besides their service (priority, width, queue), and each kind works
        out one yield queue per group."""
        priority, mine = job.priority, self.index(job.gpus, level)
        thresholds, by_gpu_time = self.thresholds, self.service == "gpu_time"
        times: list[float | None] = [None] * len(victims)
        for (victim_priority, gpus, current), positions, services in self._victim_groups(victims):
            if priority < victim_priority:
                continue
            level = self._yield_level(gpus, current, mine)
            if level is None:
                continue
            if level == current:
                for position in positions:
                    times[position] = now
                continue
            threshold = thresholds[level - 1]
            rate = float(gpus) if by_gpu_time else 1.0
            for position, service in zip(positions, services, strict=True):
                times[position] = now + max(threshold - service, 0.0) / rate
        return times

    def _victim_groups(
        self, victims: Sequence[RunningJob]
    ) -> list[tuple[tuple[int, int, int], list[int], list[float]]]:
        """The victims by (priority, GPUs, queue), with their positions and services, for the
        list the estimator passes (it passes the same list for every kind)."""
        if self._grouped_victims is victims:
            return self._victim_group_list
        groups: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}
        running_levels = self._running_levels
        for position, victim in enumerate(victims):
            current = running_levels.get(victim.id)
            if current is None:
                current = self.running_level(victim)
            group = groups.get((victim.priority, victim.gpus, current))
            if group is None:
                group = groups[(victim.priority, victim.gpus, current)] = ([], [])
            group[0].append(position)
            group[1].append(self.service_of(self.ranked_attained(victim), victim.gpus))
        self._grouped_victims = victims
        self._victim_group_list = [(key, *lists) for key, lists in groups.items()]
        return self._victim_group_list

    def wake_at(self, ctx: CycleContext) -> float | None:
        """The next time a running job's crossing into a later queue lets a waiting job of at
        least its priority preempt it."""
        if not self._pending:
            return None
        best_of: dict[int, float] = {}  # priority -> best index waiting at that priority
        for priority, gpus, level in self._kinds(self._pending, ctx.now)[1]:
            value = self.index(gpus, level)
            if value > best_of.get(priority, -1.0):
                best_of[priority] = value
        # Best index waiting at a priority of at least p, for each p that has waiting jobs.
        at_least: list[tuple[int, float]] = []
        best = -1.0
        for priority in sorted(best_of, reverse=True):
            best = max(best, best_of[priority])
            at_least.append((priority, best))
        at_least.reverse()  # ascending priority
        earliest: float | None = None
        for job in ctx.snapshot.running:
            if job.stopping or not job.preemptible:
                continue
            waiting = next((value for p, value in at_least if p >= job.priority), None)
            if waiting is None:
                continue
            at = self._yields_after(waiting, job, ctx.now)
            if at is not None and at > ctx.now and (earliest is None or at < earliest):
                earliest = at
        if self.starvation_factor > 0:
            guard = super().wake_at(ctx)
            if guard is not None and (earliest is None or guard < earliest):
                earliest = guard
        return earliest


class ShortestExpectedFirst:
    """Shortest expected remaining work first, from history-based estimates (the portal or the
    simulator fills `estimated_runtime_s` from the user's and VC's recent jobs)."""

    name = "sef"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.default_runtime_s = float(args.get("default_runtime_s", DEFAULT_RUNTIME_S))
        self.by_gpu_time = str(args.get("by", "time")) == "gpu_time"

    def prepare(self, ctx: CycleContext) -> None:
        pass

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        run_so_far = job.attained_gpu_s / max(job.gpus, 1)
        remaining = max(expected_runtime(job, self.default_runtime_s) - run_so_far, 0.0)
        return (remaining * job.gpus if self.by_gpu_time else remaining,)

    def sort_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        return [self.sort_key(job, ctx) for job in jobs]


class DominantResourceFairness:
    """Dominant-resource fair share among the users of a VC (DRF, progressive filling).

    A job's key is the dominant share its user would hold after this job and the user's
    earlier queued jobs start, measured against the VC's share of the cluster. Users who
    hold little go first; a user with many queued jobs interleaves with the others instead
    of taking the VC's whole turn.
    """

    name = "drf"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self._keys: dict[str, float] = {}

    def prepare(self, ctx: CycleContext) -> None:
        state = ctx.state
        cluster_gpus = max(sum(state.capacity_total.values()), 1)
        cluster_cpu = sum(n.cpu_milli for n in ctx.snapshot.nodes) or 0
        cluster_mem = sum(n.memory_mib for n in ctx.snapshot.nodes) or 0
        vc_fraction: dict[str, float] = {}
        for name, rows in state.quotas.items():
            guaranteed = sum(q.guaranteed for q in rows.values())
            vc_fraction[name] = max(guaranteed / cluster_gpus, 1e-9) if guaranteed else 1.0
        held: dict[tuple[str, str], list[float]] = {}
        for job in ctx.snapshot.running:
            usage = held.setdefault((job.vc, job.user), [0.0, 0.0, 0.0])
            usage[0] += job.gpus
            usage[1] += job.cpu_milli_per_replica * len(job.placement)
            usage[2] += job.memory_mib_per_replica * len(job.placement)

        def share(vc: str, usage: list[float]) -> float:
            f = vc_fraction.get(vc, 1.0)
            parts = [usage[0] / (f * cluster_gpus)]
            if cluster_cpu:
                parts.append(usage[1] / (f * cluster_cpu))
            if cluster_mem:
                parts.append(usage[2] / (f * cluster_mem))
            return max(parts)

        self._keys = {}
        for job in by_arrival(ctx.snapshot.pending):
            usage = held.setdefault((job.vc, job.user), [0.0, 0.0, 0.0])
            usage[0] += job.gpus
            usage[1] += job.cpu_milli_per_replica * job.replicas
            usage[2] += job.memory_mib_per_replica * job.replicas
            self._keys[job.id] = share(job.vc, usage)

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        return (self._keys.get(job.id, 0.0),)

    def sort_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        keys = self._keys
        return [(keys.get(job.id, 0.0),) for job in jobs]


class GuaranteeFirst:
    """Jobs that fit in their VC's guarantee go before jobs that would borrow (as Kueue admits
    workloads within nominal quota before borrowing ones). Each VC's queued jobs are counted
    against its guarantee in arrival order, on top of what it already runs; VCs that may not
    borrow are left in place. Without this, a
    borrowing job could take the last free GPUs and the owner would have to reclaim them a
    cycle later, paying a preemption and a grace period for what was its own."""

    name = "guarantee_first"

    # The two keys, shared by every job: within the guarantee, and borrowing (or unknown).
    WITHIN: tuple[float] = (0.0,)
    BORROWING: tuple[float] = (1.0,)

    def __init__(self, args: Mapping[str, Any]) -> None:
        self._keys: dict[str, tuple[float]] = {}

    def prepare(self, ctx: CycleContext) -> None:
        state = ctx.state
        planned: dict[str, int] = {}
        keys: dict[str, tuple[float]] = {}
        self._keys = keys
        within, borrowing = self.WITHIN, self.BORROWING
        # Per (VC, model), from its quota (the state stays as it is): the key all its jobs get
        # (no quota: borrowing; a VC that cannot borrow has no borrowing work to put last),
        # else None with the guarantee and the GPUs in use its queue is counted against.
        # One lookup per job, where the quota itself would take two.
        rules: dict[tuple[str, str], tuple[tuple[float] | None, int, int]] = {}
        for job in by_arrival(ctx.snapshot.pending):
            rule = rules.get((job.vc, job.gpu_model))
            if rule is None:
                quota = state.quota_for(job.vc, job.gpu_model)
                if quota is None:
                    rule = (borrowing, 0, 0)
                else:
                    guaranteed, borrow_limit, used, _ = quota
                    rule = (within, 0, 0) if borrow_limit <= 0 else (None, guaranteed, used)
                rules[(job.vc, job.gpu_model)] = rule
            fixed, guaranteed, used = rule
            if fixed is not None:
                keys[job.id] = fixed
                continue
            total = used + planned.get(job.vc, 0) + job.gpus
            if total <= guaranteed:
                planned[job.vc] = planned.get(job.vc, 0) + job.gpus
                keys[job.id] = within
            else:
                keys[job.id] = borrowing

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]:
        return self._keys.get(job.id, self.BORROWING)

    def sort_keys(self, jobs: Sequence[PendingJob], ctx: CycleContext) -> list[tuple[float, ...]]:
        keys, borrowing = self._keys, self.BORROWING
        return [keys.get(job.id, borrowing) for job in jobs]

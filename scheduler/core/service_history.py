"""What finished jobs say about the service of running and waiting ones.

The snapshot carries the width and attained GPU-seconds of recently finished jobs
(`FinishedService`). Two users: the Gittins-index queue order, and the estimated end of a
running job. Both condition on what a job has attained so far and on its width, which are
known; never on its own duration, which is not. Derived tables are cached per
`FinishedService` object, which producers reuse until a job finishes.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections import deque
from operator import itemgetter

from scheduler.core.types import FinishedService

# How many finished jobs of each width a producer (the portal's store, the simulator) should
# hand the core: enough for a distribution per width, and cheap to sort again whenever one
# finishes. Per width, not in all: in one window of the most recent jobs the common width
# crowds out a rare one (Philly's 8-GPU jobs are 3 % of its jobs, and a window of 5,000 held
# fewer than 50 of them on three of four days looked at), and the rare width then falls back
# to the pooled table, ranked as if it were the common one.
FINISHED_PER_WIDTH = 5000
# How far back a producer looks for them: the last this many finished jobs of all widths, so
# that finding a rare width's jobs costs a bounded search, however long the portal has run.
FINISHED_LOOKBACK = 100_000


class FinishedHistory:
    """A producer's record of finished jobs: the last `per_width` of each width among the last
    `lookback` of all, handed to the core as one FinishedService, oldest first. The object
    stays the same until a job finishes, so what the core derives from it (cached on it) is
    worked out once per finish."""

    def __init__(self, per_width: int = FINISHED_PER_WIDTH, lookback: int = FINISHED_LOOKBACK) -> None:
        self.per_width = per_width
        self.lookback = lookback
        self._by_width: dict[int, deque[tuple[int, tuple[int, float], tuple[str, str]]]] = {}
        self._count = 0
        self._service: FinishedService | None = None

    def record(self, gpus: int, gpu_s: float, vc: str, user: str) -> None:
        kept = self._by_width.get(gpus)
        if kept is None:
            kept = self._by_width[gpus] = deque(maxlen=self.per_width)
        self._count += 1
        kept.append((self._count, (gpus, gpu_s), (vc, user)))
        self._service = None

    @property
    def service(self) -> FinishedService:
        if self._service is None:
            # The widths' runs are each in finish order, so sorting them together is a merge,
            # done in C (a simulator asks for it after every finish).
            entries = sorted(itertools.chain.from_iterable(self._by_width.values()))
            entries = entries[bisect.bisect_right(entries, self._count - self.lookback, key=itemgetter(0)) :]
            _, jobs, owners = zip(*entries, strict=True) if entries else ((), (), ())
            self._service = FinishedService(tuple(jobs), tuple(owners))
        return self._service


@functools.lru_cache(maxsize=8)
def samples_by_width(finished: FinishedService) -> tuple[dict[int, list[float]], list[float]]:
    """Sorted GPU-seconds per width, and of all widths pooled."""
    by_width: dict[int, list[float]] = {}
    for gpus, service in finished.jobs:
        by_width.setdefault(gpus, []).append(service)
    for values in by_width.values():
        values.sort()
    return by_width, sorted(service for _, service in finished.jobs)


@functools.lru_cache(maxsize=8)
def samples_by_owner_and_width(
    finished: FinishedService,
) -> tuple[dict[tuple[str, str, int], list[float]], dict[tuple[str, int], list[float]]]:
    """Sorted GPU-seconds per (VC, user, width) and per (VC, width); empty when the producer
    gave no owners."""
    by_user: dict[tuple[str, str, int], list[float]] = {}
    by_vc: dict[tuple[str, int], list[float]] = {}
    for (vc, user), (gpus, service) in zip(finished.owners, finished.jobs, strict=False):
        by_user.setdefault((vc, user, gpus), []).append(service)
        by_vc.setdefault((vc, gpus), []).append(service)
    for values in (*by_user.values(), *by_vc.values()):
        values.sort()
    return by_user, by_vc


def remaining_gpu_s(
    finished: FinishedService,
    gpus: int,
    attained_gpu_s: float,
    vc: str = "",
    user: str = "",
    min_samples: int = 20,
    quantile: float = 0.5,
) -> float | None:
    """The `quantile` (0 to 1; the median by default) of the service still to come for a job
    of `gpus` GPUs that has attained `attained_gpu_s`, among finished jobs that ran this long:
    of the same VC, user and width, else VC and width, else width, else all; the first with
    at least `min_samples` (as runtime estimates go from the user's own jobs to everyone's).
    None when none has."""
    by_width, pooled = samples_by_width(finished)
    by_user, by_vc = samples_by_owner_and_width(finished) if finished.owners else ({}, {})
    own = by_user.get((vc, user, gpus), ())
    for samples in (own, by_vc.get((vc, gpus), ()), by_width.get(gpus, ()), pooled):
        first = bisect.bisect_right(samples, attained_gpu_s)
        alive = len(samples) - first
        if alive >= min_samples:
            return samples[first + min(int(alive * quantile), alive - 1)] - attained_gpu_s
    return None


@functools.lru_cache(maxsize=8)
def gittins_table(
    finished: FinishedService,
    thresholds: tuple[float, ...],
    by_width: bool,
    min_samples: int,
    per_gpu: bool = False,
) -> tuple[dict[int, tuple[float, ...]], tuple[float, ...] | None]:
    """Gittins index of each LAS queue, per job width and pooled, from `finished`.

    A job in queue k has attained at least a = thresholds[k-1] GPU-seconds. Its index is the
    best, over the next thresholds t (and running to the end), of the chance to finish by t
    over the expected service spent until then, given that it ran past a: the return per
    GPU-second of serving it a while longer. Serving the highest index first minimizes mean
    completion time for a known service distribution (Gittins; Tiresias applies it to GPU
    jobs); here the distribution is learned from finished jobs, never from the job itself.
    Widths with fewer than `min_samples` finished jobs use the pooled table; the pooled table
    is None until it has `min_samples` (the caller falls back to plain LAS). With `per_gpu`,
    service is run time (GPU-seconds over width) and so are the thresholds.

    A queue past every finished job's service has no sample to go by. Its index is taken as
    that job is expected to run as long again as it has (durations are heavy-tailed): the
    last queue with samples scaled down by the ratio of the two queues' thresholds, so it
    keeps falling queue by queue (0 where only queue 0 has samples: its threshold is 0, there
    is no service to scale by). An index of 0 would put such jobs behind every other job
    however near their end they are: on the Philly log the 54 jobs submitted in its first 19
    days, which run 19 days on average, had outlived the finished jobs they were ranked by
    when the load came and carried 183 s of the 626 s average queueing (docs/benchmarks.md)."""
    samples, pooled = samples_by_width(finished)
    if per_gpu:
        samples = {width: [s / max(width, 1) for s in values] for width, values in samples.items()}
        pooled = sorted(s / max(gpus, 1) for gpus, s in finished.jobs)
    if len(pooled) < min_samples:
        return {}, None
    tables = (
        {
            width: _gittins_levels(values, thresholds)
            for width, values in sorted(samples.items())
            if len(values) >= min_samples
        }
        if by_width
        else {}
    )
    return tables, _gittins_levels(pooled, thresholds)


def _gittins_levels(sorted_samples: list[float], thresholds: tuple[float, ...]) -> tuple[float, ...]:
    n = len(sorted_samples)
    prefix = [0.0]
    for value in sorted_samples:
        prefix.append(prefix[-1] + value)
    indices: list[float] = []
    known = (0.0, 0.0)  # (attained, index) of the last queue with samples
    for level in range(len(thresholds) + 1):
        attained = thresholds[level - 1] if level else 0.0
        first = bisect.bisect_right(sorted_samples, attained)
        if first == n:  # outlived every finished job: expected to run as long again
            indices.append(known[1] * known[0] / attained if known[0] > 0 else 0.0)
            continue
        best = 0.0
        for horizon in (*thresholds[level:], math.inf):
            last = n if horizon == math.inf else bisect.bisect_right(sorted_samples, horizon)
            done = last - first
            cost = prefix[last] - prefix[first] - done * attained
            if horizon != math.inf:
                cost += (n - last) * (horizon - attained)
            if done and cost > 0:
                best = max(best, done / cost)
        indices.append(best)
        known = (attained, best)
    return tuple(indices)

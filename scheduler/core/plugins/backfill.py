"""Backfill behind a reservation (EASY backfill).

The first job that is blocked for lack of free GPUs gets a reservation: the earliest time the
running jobs' expected ends free enough GPUs of its model. A later job may start now only if
it will be done before then (by its time limit, else its history-based estimate) or if it
fits in the GPUs that will be spare at that time. Without this, a stream of small jobs can
keep a large gang waiting forever.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.plugins.queue_sort import expected_runtime
from scheduler.core.service_history import remaining_gpu_s
from scheduler.core.state import GpuHold
from scheduler.core.types import PendingJob, RunningJob

# A running job is expected to run on for at least this share of its history-based estimate
# (see running_end). Without it a job that started seconds ago counts as ending in a minute,
# and jobs queued behind a burst of fresh starts were told "in a minute" when the GPUs came
# free only as the burst crossed its first LAS threshold (cluster02: 20 of the 22 estimates
# off by more than 2x).
YOUNG_JOB_SHARE = 0.1


@dataclass(slots=True)
class Reservation:
    job_id: str
    model: str
    gpus: int
    start_at: float
    spare_gpus: int  # GPUs free at start_at beyond what the reserved job needs


def running_end(job: RunningJob, now: float, default_runtime_s: float, min_share: float = 0.0) -> float:
    """When a running job is expected to release its GPUs: at its time limit if it has one.
    Otherwise runtimes are heavy-tailed, so the best guess for the rest of a run is about as
    long as it has run so far (a job that ran a minute likely ends soon, one that ran a day
    likely runs on), capped by what its history-based estimate leaves; a job already past its
    estimate is expected to run half its age again. Never less than a minute, and with
    `min_share` never less than that share of its estimate while the estimate lasts (a job
    that has just started is not about to end just because it is young)."""
    if job.time_limit_s is not None:
        return max(job.started_at + job.time_limit_s, now)
    run_so_far = job.attained_gpu_s / max(job.gpus, 1)
    total = expected_runtime(job, default_runtime_s)
    remaining = max(min(total - run_so_far, max(run_so_far, min_share * total)), 0.5 * run_so_far, 60.0)
    return now + remaining


# Running jobs without a time limit are expected to end at quantiles of their remaining
# service spread evenly over this middle share of its distribution (see expected_ends).
# Philly pooled: 1-GPU jobs queued behind a few hundred short 1-GPU jobs of their VC were told
# about 700 s (every running job's median) while a GPU came free every few seconds; of the
# jobs that waited, 0.38 were estimated within 2x at 0 (all at the median), 0.54 at 0.5, 0.65
# at 0.75, 0.79 at 1 (baseline 0.75). ITP cluster02: 0.81 at 0, 0.82 at 0.5, 0.69 at 0.75,
# 0.48 at 1: there jobs that look alike to the history (the trace names no users) ended close
# together, and the wide spreads told the jobs behind them too early. No share suits both.
END_SPREAD = 0.5


def end_quantiles(ctx: CycleContext) -> dict[str, float]:
    """The quantile of its remaining service at which each running job of the snapshot is
    expected to end (see expected_ends), computed once per cycle."""
    if ctx.end_quantiles is None:
        order = sorted(ctx.snapshot.running, key=lambda job: (zlib.crc32(job.id.encode()), job.id))
        low, step = 0.5 - END_SPREAD / 2, END_SPREAD / max(len(order), 1)
        ctx.end_quantiles = {job.id: low + step * (rank + 0.5) for rank, job in enumerate(order)}
    return ctx.end_quantiles


def expected_ends(jobs: Sequence[RunningJob], ctx: CycleContext, default_runtime_s: float) -> list[float]:
    """When each of `jobs` is expected to release its GPUs, as the estimated starts, the
    backfill reservation and the migration plugin all count it: at its time limit if it has
    one; otherwise at a quantile of what finished jobs of its VC, user and width (else coarser
    groups) still ran after attaining as much service; without enough history, as
    `running_end` guesses.

    The quantiles are spread evenly over the middle `END_SPREAD` of the distribution, in an
    order that says nothing about a job's service (a checksum of its id) among all running
    jobs of the snapshot, so a job ends at the same time whichever part of them a caller
    asks about. What a waiting job needs is the time of the k-th release, not each job's most
    likely end: with every job at its median, n jobs alike would release all their GPUs at
    one time. Spread over all quantiles the releases by any time would number their expected
    count if jobs ended independently, but jobs alike often end together (a sweep's jobs), so
    the spread is narrowed around the median."""
    now, finished = ctx.now, ctx.snapshot.finished
    quantile_of: dict[str, float] | None = None  # only jobs without a time limit need it
    ends = []
    for job in jobs:
        rest = None
        if job.time_limit_s is None:
            if quantile_of is None:
                quantile_of = end_quantiles(ctx)
            quantile = quantile_of.get(job.id, 0.5)
            rest = remaining_gpu_s(
                finished, job.gpus, job.attained_gpu_s, job.vc, job.user, quantile=quantile
            )
        if rest is not None:
            ends.append(now + max(rest / max(job.gpus, 1), 60.0))
        else:
            ends.append(running_end(job, now, default_runtime_s, YOUNG_JOB_SHARE))
    return ends


class BackfillReservation:
    name = "backfill"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.default_runtime_s = float(args.get("default_runtime_s", 3600.0))
        self.use_estimates = bool(args.get("use_estimates", True))

    def reserve(
        self, job: PendingJob, model: str, ctx: CycleContext, holds: Mapping[str, list[GpuHold]]
    ) -> Reservation | None:
        free = ctx.state.free_total.get(model, 0)
        need = job.gpus
        holding: list[tuple[RunningJob, int]] = []
        for running in ctx.snapshot.running:
            gpus = sum(len(h.gpu_indices) for h in holds.get(running.id, ()) if h.model == model)
            if gpus:
                holding.append((running, gpus))
        jobs = [running for running, _ in holding]
        ends = expected_ends(jobs, ctx, self.default_runtime_s)
        releases = [(end, gpus) for end, (_, gpus) in zip(ends, holding, strict=True)]
        releases.sort()
        at = ctx.now
        for end, gpus in releases:
            if free >= need:
                break
            free += gpus
            at = end
        if free < need:
            return None
        return Reservation(job.id, model, need, at, free - need)

    def allows(self, job: PendingJob, model: str, reservation: Reservation, ctx: CycleContext) -> bool:
        """Whether starting `job` now keeps the reservation's start; consumes spare GPUs."""
        if model != reservation.model:
            return True
        bound = job.time_limit_s
        if bound is None and self.use_estimates:
            bound = expected_runtime(job, self.default_runtime_s)
        if bound is not None and ctx.now + bound <= reservation.start_at:
            return True
        if job.gpus <= reservation.spare_gpus:
            reservation.spare_gpus -= job.gpus
            return True
        return False

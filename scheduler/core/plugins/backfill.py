"""Backfill behind a reservation (EASY backfill).

The first job that is blocked for lack of free GPUs gets a reservation: the earliest time the
running jobs' expected ends free enough GPUs of its model. A later job may start now only if
it will be done before then (by its time limit, else its history-based estimate) or if it
fits in the GPUs that will be spare at that time. Without this, a stream of small jobs can
keep a large gang waiting forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.plugins.queue_sort import expected_runtime
from scheduler.core.service_history import median_remaining_gpu_s
from scheduler.core.state import GpuHold
from scheduler.core.types import FinishedService, PendingJob, RunningJob

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


def expected_end(job: RunningJob, now: float, default_runtime_s: float, finished: FinishedService) -> float:
    """When a running job is expected to release its GPUs, as the estimated starts, the
    backfill reservation and the migration plugin all count it. Without a time limit: the
    median of what finished jobs of its VC, user and width (else coarser groups) still ran
    after attaining as much service; without enough history, as `running_end` guesses."""
    if job.time_limit_s is None:
        rest = median_remaining_gpu_s(finished, job.gpus, job.attained_gpu_s, job.vc, job.user)
        if rest is not None:
            return now + max(rest / max(job.gpus, 1), 60.0)
    return running_end(job, now, default_runtime_s, YOUNG_JOB_SHARE)


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
        releases: list[tuple[float, int]] = []
        for running in ctx.snapshot.running:
            gpus = sum(len(h.gpu_indices) for h in holds.get(running.id, ()) if h.model == model)
            if gpus:
                end = expected_end(running, ctx.now, self.default_runtime_s, ctx.snapshot.finished)
                releases.append((end, gpus))
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

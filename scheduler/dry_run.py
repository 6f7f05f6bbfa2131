"""A dry run of a submission, as Slurm's `sbatch --test-only`: whether the portal would accept a
job spec and what the next scheduling cycle would say about the job, with nothing stored.

It takes the cycle's own path, not a model of it: the rules of submission (pending_job), the
snapshot the cycle would load, the job added to it as pending and submitted now, and the core's
`decide`. So the verdict is the reason, message, estimate and hints the job itself would get,
computed by the same code, and cannot drift from them. Nothing the core says to others leaves
this module: the plan's starts, preemptions and other jobs' reasons are dropped, and the job's
own reason is one the core already words for its owner (a job of another tenant is never named).
The verdict is the cycle's; when an admin has paused the scheduling loop, it says so as well,
since no cycle runs until the loop resumes.

Everything runs in a read-only transaction that is rolled back, so a write reached through the
shared code is refused by PostgreSQL rather than made; the job's id is not taken either.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from portal.jobs.choices import PENDING_DEPENDENCY
from portal.jobs.models import Job
from portal.jobs.services import (
    dependency_message,
    dependency_verdict,
    held_by_dependencies,
    pending_job,
)
from portal.lib.db import read_only_transaction
from scheduler import core
from scheduler.store import from_epoch, hint_data, load_snapshot, placement_text, queue_numbers, queued_job
from scheduler.tasks import load_profile, loop_paused

# The id the job has in the snapshot: no stored job's (those are numbers), and never shown.
DRY_RUN_ID = core.JobId("dry-run")


@dataclass(frozen=True)
class Verdict:
    """What the next cycle would do with the job. `reason` is None when it would start; then
    `placement` says where, as a start's event does ("a100-node-1:0,1")."""

    would_start_now: bool
    reason: str | None
    message: str
    estimated_start: datetime | None
    queue_position: int | None = None
    placement: str | None = None
    borrowed_gpus: int = 0
    hints: list[dict[str, Any]] = field(default_factory=list)
    scheduling_paused: bool = False


def dry_run_submission(user: Any, spec: dict[str, Any]) -> Verdict:
    """The verdict on a spec validated by JobSpecSerializer. Raises what submit_job raises
    (PermissionDenied, JobRejected) for what it would refuse, and stores nothing."""
    verdict = _verdict(user, spec)
    return dataclasses.replace(verdict, scheduling_paused=loop_paused())


def _verdict(user: Any, spec: dict[str, Any]) -> Verdict:
    with read_only_transaction():
        job = pending_job(user, spec, reserve_id=False)
        now = time.time()
        job.submitted_at = from_epoch(now)
        waiting = waiting_for_dependencies(job)
        if waiting is not None:
            return waiting
        loaded = load_snapshot(now, held=held_by_dependencies())
        hypothetical = dataclasses.replace(queued_job(job), id=DRY_RUN_ID)
        snapshot = dataclasses.replace(loaded.snapshot, pending=(*loaded.snapshot.pending, hypothetical))
        plan = core.decide(snapshot, load_profile(), now)
    return verdict_of(plan, snapshot, now)


def waiting_for_dependencies(job: Job) -> Verdict | None:
    """The verdict of a job that would wait for the jobs of its `after` (the cycle does not offer
    it to the scheduler until then), or None when they already let it start. The rules of
    submission have refused a job they would never let start."""
    if not job.after:
        return None
    states = dict(Job.objects.filter(pk__in=job.after).values_list("pk", "state"))
    open_deps = dependency_verdict(job.after_type, job.after, states).open_deps
    if not open_deps:
        return None
    message = dependency_message(job.after_type, job.after, open_deps, states)
    return Verdict(would_start_now=False, reason=PENDING_DEPENDENCY, message=message, estimated_start=None)


def verdict_of(plan: core.Plan, snapshot: core.Snapshot, now: float) -> Verdict:
    """The job's part of the plan: a start, or its pending status and place in the queue."""
    start = next((s for s in plan.starts if s.job_id == DRY_RUN_ID), None)
    if start is not None:
        where = placement_text(start)
        message = f"Would start now on {where}."
        if start.borrowed_gpus:
            message += (
                f" {start.borrowed_gpus} of its GPUs would be borrowed beyond its VC's guarantee, so it "
                "may be preempted when their owners want them back."
            )
        return Verdict(
            would_start_now=True,
            reason=None,
            message=message,
            estimated_start=from_epoch(now),
            placement=where,
            borrowed_gpus=start.borrowed_gpus,
        )
    positions = queue_numbers(plan.pending, snapshot)
    for status, position in zip(plan.pending, positions, strict=True):
        if status.job_id == DRY_RUN_ID:
            return Verdict(
                would_start_now=False,
                reason=status.reason.value,
                message=status.message,
                estimated_start=from_epoch(status.estimated_start),
                queue_position=position,
                hints=[hint_data(hint) for hint in status.hints],
            )
    raise AssertionError("the plan says nothing of the dry run's job")  # decide covers every job

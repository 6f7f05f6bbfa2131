"""Time-slicing (Gandiva's oversubscription): jobs of one VC take turns on the same GPUs.

When a VC has more runnable time-sliceable jobs than its GPUs can hold, a job that waits
(for capacity or for its VC's quota) takes the GPUs of a running time-sliceable job of the same
VC and shape, on GPUs of a model it accepts, whose quantum is up: the running job is
suspended (its state saved) and waits to resume on the same GPUs; the waiting one starts
there, or resumes if it was suspended there.
A swap keeps the VC's usage and the GPUs' owner the same, so the same-tenant rule holds by
construction; the cycle still puts the waiting job through admission with the running job's
GPUs released, since a quota cut can leave a VC above its limit. Jobs that did not opt in are
never suspended.

Args: `quantum_s` (default 600), `suspend_cost_s` (default 10: saving and later restoring the
job's state; the simulator charges it as time without progress).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.types import ANY_MODEL, PendingJob, RunningJob


class TimeSlice:
    name = "timeslice"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.quantum_s = float(args.get("quantum_s", 600.0))
        self.suspend_cost_s = float(args.get("suspend_cost_s", 10.0))

    def rotate(
        self, waiting: Sequence[PendingJob], released: set[str], ctx: CycleContext
    ) -> Iterator[tuple[RunningJob, PendingJob]]:
        """Pairs (running job to suspend, waiting job to get its GPUs), in the waiting jobs'
        queue order; a waiting job is offered the next running job when the cycle turned the
        last pair down (left it out of `released`). A suspended job goes back to exactly the
        GPUs it left when they are free or held by a job whose quantum is up."""
        due: list[RunningJob] = sorted(
            (
                job
                for job in ctx.snapshot.running
                if job.time_sliceable
                and not job.stopping
                and not job.gpu_share_milli
                and job.id not in released
                and ctx.now - _slice_start(job) >= self.quantum_s
            ),
            key=lambda job: (_slice_start(job), job.id),
        )
        for job in waiting:
            if not job.time_sliceable or job.gpu_share_milli:
                continue
            for running in due:
                if running.id in released or running.vc != job.vc:
                    continue
                if job.suspended_on:
                    fits = gpus_of(running.placement) == gpus_of(job.suspended_on)
                else:
                    fits = (len(running.placement), running.gpus) == (job.replicas, job.gpus)
                    fits = fits and all(len(r.gpu_indices) == job.gpus_per_replica for r in running.placement)
                    fits = fits and (
                        job.gpu_model == ANY_MODEL or _models_of(running, ctx) == {job.gpu_model}
                    )
                if fits:
                    yield running, job
                    if running.id in released:  # the swap was made
                        break

    def wake_at(self, ctx: CycleContext) -> float | None:
        """The next quantum end of a time-sliceable job while a job of its VC waits for a turn."""
        waiting_vcs = {job.vc for job in ctx.snapshot.pending if job.time_sliceable}
        ends = [
            _slice_start(job) + self.quantum_s
            for job in ctx.snapshot.running
            if job.time_sliceable and not job.stopping and job.vc in waiting_vcs
        ]
        later = [t for t in ends if t > ctx.now]
        return min(later) if later else None


def _slice_start(job: RunningJob) -> float:
    return job.started_at if job.slice_started_at is None else job.slice_started_at


def _models_of(job: RunningJob, ctx: CycleContext) -> set[str]:
    """The models of every GPU the job holds (its own `gpu_model` may be any). One model for a
    job the core placed, but a snapshot can show one on GPUs of two: a waiting job that asks
    for a model takes its turn only if all of them are that model."""
    models: set[str] = set()
    for replica in job.placement:
        node_idx = ctx.state.node_idx_by_name.get(replica.node)
        if node_idx is None:
            continue
        gpus = ctx.state.nodes[node_idx].gpus
        models.update(gpus[i].model for i in replica.gpu_indices if i in gpus)
    return models


def gpus_of(placement: Sequence[Any]) -> set[tuple[str, int]]:
    """The (node, GPU index) pairs of a placement."""
    return {(r.node, i) for r in placement for i in r.gpu_indices}

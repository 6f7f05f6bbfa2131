"""Preemption by quota: a VC takes back its guarantee from jobs that borrowed it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.state import ClusterState
from scheduler.core.types import ANY_MODEL, PendingJob, RunningJob


class Reclaim:
    """A job that fits inside its own VC's guarantee may preempt borrowed work of other VCs.
    This is what makes a guarantee a guarantee: lending idle GPUs is safe only because the
    owner gets them back within one grace period."""

    name = "reclaim"

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def may_preempt(self, preemptor: PendingJob, victim: RunningJob, ctx: CycleContext) -> str | None:
        if victim.vc == preemptor.vc or ctx.borrowed_gpus.get(victim.id, 0) <= 0:
            return None
        if preemptor.gpu_model != ANY_MODEL:
            models: tuple[str, ...] = (preemptor.gpu_model,)
        else:
            # The guarantee on the model the victim holds, never the VC's total over all models
            # (quota_for with ANY_MODEL): a VC guaranteed 8 A100 has no claim on V100 another
            # tenant borrowed.
            models = held_models(victim, ctx.state)
            if not models:
                return None
        for model in models:
            quota = ctx.state.quota_for(preemptor.vc, model)
            if quota is None:
                return None
            guaranteed, _, used, _ = quota
            if used + preemptor.gpus > guaranteed:
                return None
        return "reclaim"


def held_models(job: RunningJob, state: ClusterState) -> tuple[str, ...]:
    """The GPU models a running job holds, from its placement's GPUs in the working state
    (the model it asked for, when its nodes are gone and that is a model). A job runs on one
    model, so this is one model but for a job whose GPUs the snapshot no longer agrees on."""
    models: list[str] = []
    for replica in job.placement:
        node_idx = state.node_idx_by_name.get(replica.node)
        if node_idx is None or not replica.gpu_indices:
            continue
        gpu = state.nodes[node_idx].gpus.get(replica.gpu_indices[0])
        if gpu is not None and gpu.model not in models:
            models.append(gpu.model)
    if not models and job.gpu_model != ANY_MODEL:
        models.append(job.gpu_model)
    return tuple(models)

"""Preemption by quota: a VC takes back its guarantee from jobs that borrowed it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.framework import CycleContext
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
        model = preemptor.gpu_model if preemptor.gpu_model != ANY_MODEL else victim.gpu_model
        quota = ctx.state.quota_for(preemptor.vc, model)
        if quota is None:
            return None
        guaranteed, _, used = quota
        return "reclaim" if used + preemptor.gpus <= guaranteed else None

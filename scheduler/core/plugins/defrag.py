"""Defragmentation by migration: move small checkpointable jobs out of the way of a gang."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.types import ANY_MODEL, PendingJob, RunningJob


class Defragment:
    """A job blocked only by fragmentation (enough GPUs free in total, but not on few enough
    nodes) may move smaller checkpointable jobs: they are preempted and, because enough GPUs
    stay free elsewhere for them (the cycle checks the whole victim set), they restart at once
    on other nodes. This is Gandiva's migration used for packing; it costs each moved job one
    checkpoint and restore, so it only picks jobs narrower than one replica of the blocked job."""

    name = "defrag"

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def may_preempt(self, preemptor: PendingJob, victim: RunningJob, ctx: CycleContext) -> str | None:
        if not victim.checkpointable or len(victim.placement) != 1:
            return None
        if victim.gpus >= preemptor.gpus_per_replica or victim.priority > preemptor.priority:
            return None
        model = preemptor.gpu_model
        if model == ANY_MODEL:
            free = sum(ctx.state.free_total.values())
        else:
            free = ctx.state.free_total.get(model, 0)
        return "defrag" if free >= preemptor.gpus + victim.gpus else None

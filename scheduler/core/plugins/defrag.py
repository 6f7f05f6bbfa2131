"""Defragmentation by migration: move small checkpointable jobs out of the way of a gang."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.plugins.backfill import running_end
from scheduler.core.types import ANY_MODEL, PendingJob, RunningJob


class Defragment:
    """A job blocked only by fragmentation (enough GPUs free in total, but not on few enough
    nodes) may move smaller checkpointable jobs: they are preempted and, because enough GPUs
    stay free elsewhere for them (the cycle checks the whole victim set), they restart at once
    on other nodes. This is Gandiva's migration used for packing; the cycle picks the victims
    that lose the least work and drops every one the fit does not need.

    A move is never free, so it must pay for itself: it costs the moved job its work since the
    last checkpoint plus a restart (`restart_cost_s`), in GPU-seconds, and is made only when
    that is less than what the blocked job gains, its GPUs times how long it would wait for a
    layout to free up by itself (from the running jobs' expected ends). A job is not moved
    again within `min_interval_s` of its last (re)start, so no job is shuffled back and forth.

    Args: `restart_cost_s` (default 60), `min_interval_s` (default 1800), `default_runtime_s`
    (default 3600, for running jobs without limit or estimate)."""

    name = "defrag"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.restart_cost_s = float(args.get("restart_cost_s", 60.0))
        self.min_interval_s = float(args.get("min_interval_s", 1800.0))
        self.default_runtime_s = float(args.get("default_runtime_s", 3600.0))
        self._gains: dict[tuple[float, str], float] = {}

    def may_preempt(self, preemptor: PendingJob, victim: RunningJob, ctx: CycleContext) -> str | None:
        if not victim.checkpointable or len(victim.placement) != 1:
            return None
        if victim.gpus >= preemptor.gpus_per_replica or victim.priority > preemptor.priority:
            return None
        if ctx.now - victim.started_at < self.min_interval_s:
            return None
        model = preemptor.gpu_model
        if model == ANY_MODEL:
            free = sum(ctx.state.free_total.values())
        else:
            free = ctx.state.free_total.get(model, 0)
        if free < preemptor.gpus + victim.gpus:
            return None
        if self.cost(victim, ctx.now) > self.gain(preemptor, ctx):
            return None
        return "defrag"

    def cost(self, victim: RunningJob, now: float) -> float:
        """GPU-seconds a move costs: the work since the last checkpoint, and the restart."""
        since = victim.started_at
        if victim.last_checkpoint_at is not None:
            since = max(since, victim.last_checkpoint_at)
        return victim.gpus * (max(now - since, 0.0) + self.restart_cost_s)

    def gain(self, preemptor: PendingJob, ctx: CycleContext) -> float:
        """GPU-seconds the blocked job would otherwise wait: until, by the running jobs'
        expected ends, enough nodes have room for one replica each (infinite if never)."""
        key = (ctx.now, preemptor.id)
        if key not in self._gains:
            if len(self._gains) > 1024:
                self._gains.clear()
            self._gains[key] = preemptor.gpus * max(self._wait(preemptor, ctx), 0.0)
        return self._gains[key]

    def _wait(self, preemptor: PendingJob, ctx: CycleContext) -> float:
        model = preemptor.gpu_model
        need = preemptor.gpus_per_replica
        slots = {slot.node.name: slot for slot in ctx.state.nodes}
        # When each held GPU is expected back, per (node, model).
        ends: dict[tuple[str, str], list[float]] = {}
        for job in ctx.snapshot.running:
            end = ctx.now if job.stopping else running_end(job, ctx.now, self.default_runtime_s)
            for replica in job.placement:
                slot = slots.get(replica.node)
                if slot is None:
                    continue
                for index in replica.gpu_indices:
                    gpu = slot.gpus.get(index)
                    if gpu is not None:
                        ends.setdefault((replica.node, gpu.model), []).append(end)
        ready_at: list[float] = []
        for slot in ctx.state.nodes:
            if not slot.usable:
                continue
            soonest = math.inf
            for m in [model] if model != ANY_MODEL else list(slot.free):
                free = slot.free_count(m)
                coming = sorted(ends.get((slot.node.name, m), []))
                if free >= need:
                    soonest = ctx.now
                elif free + len(coming) >= need:
                    soonest = min(soonest, coming[need - free - 1])
            ready_at.append(soonest)
        ready_at.sort()
        if len(ready_at) < preemptor.replicas:
            return math.inf
        return ready_at[preemptor.replicas - 1] - ctx.now

"""Defragmentation by migration: move small checkpointable jobs out of the way of a gang."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.plugins.backfill import expected_ends
from scheduler.core.state import NodeSlot
from scheduler.core.types import ANY_MODEL, PendingJob, RunningJob, Snapshot


class Defragment:
    """A job blocked only by fragmentation (enough GPUs free in total, but not on few enough
    nodes) may move smaller checkpointable jobs: they are preempted and restart at once on
    other nodes, from their checkpoint. This is Gandiva's migration used for packing. A move
    needs no GPUs beyond the blocked job's own: the moved job gives up as many as it takes.

    For such a job the cycle asks this plugin first, alone, and it picks the moves
    (`plan_moves`): on the nodes that need the fewest moves to give each missing replica a
    block the GPU chooser would take (then the cheapest), and only when every moved job has
    room to restart on another node, tightest fit first (a partly used node, so whole nodes
    stay whole). Only when that finds nothing do the other preemption plugins get a turn: a
    job they evict waits in the queue, where a moved job does not.

    A move is never free, so it must pay for itself: it costs the moved job its work since the
    last checkpoint plus a restart (`restart_cost_s`), in GPU-seconds, and the moves are made
    only when together they cost at most what the blocked job gains, its GPUs times how long
    it would wait for a layout to free up by itself (from the running jobs' expected ends).
    A job is not moved within `min_interval_s` of its last (re)start, so no job is shuffled
    back and forth.

    Args: `restart_cost_s` (default 60), `min_interval_s` (default 1800), `default_runtime_s`
    (default 3600, for running jobs without limit or estimate)."""

    name = "defrag"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.restart_cost_s = float(args.get("restart_cost_s", 60.0))
        self.min_interval_s = float(args.get("min_interval_s", 1800.0))
        self.default_runtime_s = float(args.get("default_runtime_s", 3600.0))
        self._gains: dict[tuple[float, str], float] = {}
        self._ends_of: Snapshot | None = None
        self._job_end_by_id: dict[str, float] = {}

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
        # Blocked by layout only: its GPUs are free in total. A move needs no more than that,
        # since the moved job gives up as many GPUs as it takes elsewhere (the cycle checks
        # that what is left free holds the moved jobs, plan_moves that it has room for them).
        if free < preemptor.gpus:
            return None
        if self.cost(victim, ctx.now) > self.gain(preemptor, ctx):
            return None
        return "defrag"

    def plan_moves(
        self,
        preemptor: PendingJob,
        model: str,
        candidates: Sequence[tuple[RunningJob, str | None]],
        ctx: CycleContext,
        choose: Callable[[set[int], NodeSlot, int], tuple[int, ...] | None],
    ) -> list[tuple[RunningJob, str | None]]:
        """The fewest moves that give `preemptor` room for all its replicas, in the order to
        release them, or [] if there are none worth making. `candidates` are the running jobs
        this plugin accepted (reason "defrag") and jobs already stopping (reason None: their
        GPUs come back anyway, at no cost); `choose` is the cycle's GPU chooser, so a node
        counts as having room only for a block the placement would take (topology)."""
        state = ctx.state
        per, replicas = preemptor.gpus_per_replica, preemptor.replicas
        # Each candidate's GPUs of the model, per node.
        on_node: dict[int, list[tuple[RunningJob, str | None, frozenset[int]]]] = {}
        for victim, reason in candidates:
            for replica in victim.placement:
                idx = state.node_idx_by_name.get(replica.node)
                if idx is None:
                    continue
                gpus = state.nodes[idx].gpus
                held = frozenset(
                    i for i in replica.gpu_indices if i in gpus and gpus[i].model == model and gpus[i].healthy
                )
                if held:
                    on_node.setdefault(idx, []).append((victim, reason, held))

        def fits(room: set[int], slot: NodeSlot) -> bool:
            return len(room) >= per and choose(room, slot, per) is not None

        def move_cost(mover: tuple[RunningJob, str | None, frozenset[int]]) -> float:
            return self.cost(mover[0], ctx.now) if mover[1] is not None else 0.0

        roomy: list[NodeSlot] = []
        options: list[tuple[int, float, int, list[tuple[RunningJob, str | None, frozenset[int]]]]] = []
        for slot in state.nodes:
            if not slot.usable:
                continue
            free = set(slot.free.get(model, ()))
            if fits(free, slot):
                roomy.append(slot)
                continue
            movers = on_node.get(slot.idx)
            if not movers or len(free) + sum(len(g) for _, _, g in movers) < per:
                continue
            # Jobs already stopping first (free), then the widest moves (fewest to free a
            # block), cheapest first among equals; then drop, dearest first, any not needed.
            movers = sorted(movers, key=lambda m: (m[1] is not None, -len(m[2]), move_cost(m), m[0].id))
            room, picked = set(free), []
            for mover in movers:
                picked.append(mover)
                room |= mover[2]
                if fits(room, slot):
                    break
            else:
                continue
            for mover in sorted(picked, key=lambda m: -move_cost(m)):
                if mover[1] is not None and fits(room - mover[2], slot):
                    picked.remove(mover)
                    room -= mover[2]
            moves = [m for m in picked if m[1] is not None]
            options.append((len(moves), sum(move_cost(m) for m in moves), slot.idx, picked))
        missing = replicas - min(len(roomy), replicas)
        if missing <= 0 or len(options) < missing:
            return []
        options.sort(key=lambda o: (o[0], o[1], o[2]))
        chosen = options[:missing]
        if sum(o[1] for o in chosen) > self.gain(preemptor, ctx):
            return []
        # Every moved job needs room to restart on a node the blocked job does not take: the
        # nodes picked are out, and so is a block on each roomy node its other replicas take.
        taken = {o[2] for o in chosen}
        rooms = {slot.idx: set(slot.free.get(model, ())) for slot in state.nodes if slot.usable}
        for slot in sorted(roomy, key=lambda s: (s.free_count(model), s.idx))[: replicas - missing]:
            block = choose(rooms[slot.idx], slot, per)
            if block is not None:
                rooms[slot.idx] -= set(block)
        plan: list[tuple[RunningJob, str | None]] = []
        seen: set[str] = set()
        moved: list[RunningJob] = []
        for option in chosen:
            for victim, reason, _ in option[3]:
                if victim.id not in seen:
                    seen.add(victim.id)
                    plan.append((victim, reason))
                    if reason is not None:
                        moved.append(victim)
        for victim in sorted(moved, key=lambda v: (-v.gpus, v.id)):
            best: tuple[tuple[int, int], tuple[int, ...]] | None = None
            for idx, room in rooms.items():
                if idx in taken or len(room) < victim.gpus:
                    continue
                block = choose(room, state.nodes[idx], victim.gpus)
                if block is not None and (best is None or (len(room), idx) < best[0]):
                    best = ((len(room), idx), block)
            if best is None:
                return []
            rooms[best[0][1]] -= set(best[1])
        return plan

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

    def _job_ends(self, ctx: CycleContext) -> dict[str, float]:
        """Each running job's expected end (stopping ones left out), once per snapshot: every
        blocked job's gain asks for them."""
        if self._ends_of is not ctx.snapshot:
            going_on = [job for job in ctx.snapshot.running if not job.stopping]
            ends = expected_ends(going_on, ctx, self.default_runtime_s)
            self._job_end_by_id = {job.id: end for job, end in zip(going_on, ends, strict=True)}
            self._ends_of = ctx.snapshot
        return self._job_end_by_id

    def _wait(self, preemptor: PendingJob, ctx: CycleContext) -> float:
        model = preemptor.gpu_model
        need = preemptor.gpus_per_replica
        slots = {slot.node.name: slot for slot in ctx.state.nodes}
        # When each held GPU is expected back, per (node, model).
        ends: dict[tuple[str, str], list[float]] = {}
        job_ends = self._job_ends(ctx)
        for job in ctx.snapshot.running:
            end = job_ends.get(job.id, ctx.now)  # a stopping job's GPUs are back at once
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

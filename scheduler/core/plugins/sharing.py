"""Fractional GPUs: which shared or free GPU a job that asks for part of one GPU gets.

The cycle lists the candidates (GPUs the job's tenant already shares with room for the share
and GPU memory, and one free GPU per node with free GPUs) and a share chooser picks one:

- `best_fit_share`: the GPU with the least room left after the share (classic best fit).
- `fgd`: fragmentation gradient descent (Weng et al., ATC'23). A node's fragmentation for a
  task shape is the free GPU capacity that task could not use there (all of it if the task
  does not fit the node at all; else the partly free GPUs for whole-GPU tasks, or the GPUs
  with less room than the share for fractional tasks). Weighted by how common each shape is in
  the workload (the pending and running jobs of the snapshot), it says how much of the node's
  free capacity is likely stranded. A task that the node's free CPU or memory cannot hold
  strands all of the node's free GPUs, which is why packing GPUs without looking at CPU leaves
  GPUs idle on CPU-bound nodes. `fgd` places a share where that expected fragmentation
  grows least, and as a score plugin steers whole-GPU placements the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.state import GpuHold, NodeSlot
from scheduler.core.types import PendingJob

WHOLE = 1000  # a GPU in thousandths
SCORE_SCALE_GPUS = 8


@dataclass(frozen=True, slots=True)
class ShareCandidate:
    node_idx: int
    gpu_index: int
    room_milli: int  # share of the GPU still free (WHOLE for a free GPU)


class BestFitShare:
    name = "best_fit_share"

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def choose_share(
        self, job: PendingJob, candidates: Sequence[ShareCandidate], ctx: CycleContext
    ) -> ShareCandidate | None:
        if not candidates:
            return None
        return min(candidates, key=lambda c: (c.room_milli, c.node_idx, c.gpu_index))


class FragmentationGradient:
    """`fgd` as share chooser and as score plugin. Args: `max_shapes` (default 32), the most
    common task shapes (GPUs, share, CPU, memory per replica) kept for the workload."""

    name = "fgd"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.max_shapes = int(args.get("max_shapes", 32))
        self.shapes: list[Shape] = []

    def prepare(self, ctx: CycleContext) -> None:
        counts: Counter[tuple[int, int, int, int]] = Counter()
        for job in ctx.snapshot.pending:
            key = _shape(
                job.gpu_share_milli,
                job.gpus_per_replica,
                job.cpu_milli_per_replica,
                job.memory_mib_per_replica,
            )
            counts[key] += job.replicas
        for running in ctx.snapshot.running:
            per_replica = running.gpus // max(len(running.placement), 1)
            key = _shape(
                running.gpu_share_milli,
                per_replica,
                running.cpu_milli_per_replica,
                running.memory_mib_per_replica,
            )
            counts[key] += len(running.placement)
        common = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: self.max_shapes]
        total = sum(n for _, n in common) or 1
        self.shapes = [Shape(*key, weight=n / total) for key, n in common]

    # -- share chooser -------------------------------------------------------------------

    def choose_share(
        self, job: PendingJob, candidates: Sequence[ShareCandidate], ctx: CycleContext
    ) -> ShareCandidate | None:
        best: tuple[float, int, int, int] | None = None
        chosen: ShareCandidate | None = None
        vectors: dict[int, list[int]] = {}
        for candidate in candidates:
            free = vectors.get(candidate.node_idx)
            if free is None:
                free = vectors[candidate.node_idx] = node_free_vector(ctx.state.nodes[candidate.node_idx])
            slot = ctx.state.nodes[candidate.node_idx]
            after = list(free)
            after[_position(slot, candidate.gpu_index)] -= job.gpu_share_milli
            cpu, memory = _headroom(slot)
            delta = self.fragmentation(
                after, cpu - job.cpu_milli_per_replica, memory - job.memory_mib_per_replica
            )
            delta -= self.fragmentation(free, cpu, memory)
            key = (delta, candidate.room_milli, candidate.node_idx, candidate.gpu_index)
            if best is None or key < best:
                best, chosen = key, candidate
        return chosen

    # -- score -----------------------------------------------------------------------------

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float:
        free = node_free_vector(node)
        if not free:
            return 50.0
        after = list(free)
        for index in gpus:
            after[_position(node, index)] = 0
        cpu, memory = _headroom(node)
        job_cpu, job_memory = _replica_needs(ctx, node, placed)
        delta = self.fragmentation(after, cpu - job_cpu, memory - job_memory)
        delta -= self.fragmentation(free, cpu, memory)
        # Nodes are compared by the change itself, so the scale is one constant for all of
        # them (a DGX's worth of GPUs): less fragmentation added scores higher.
        return max(0.0, min(100.0, 50.0 - 50.0 * delta / (SCORE_SCALE_GPUS * WHOLE)))

    def fragmentation(self, free: Sequence[int], cpu_free: float, memory_free: float) -> float:
        """Expected free capacity (thousandths of GPUs) that the workload's tasks could not
        use on a node with these free amounts per GPU and this much free CPU and memory."""
        total = sum(free)
        if total == 0:
            return 0.0
        whole_free = sum(1 for f in free if f >= WHOLE)
        partly = total - whole_free * WHOLE
        largest = max(free)
        expected = 0.0
        for shape in self.shapes:
            if shape.cpu_milli > cpu_free or shape.memory_mib > memory_free:
                stranded = total
            elif shape.share_milli:  # GPUs with less room than the share are lost to it
                share = shape.share_milli
                stranded = total if largest < share else sum(f for f in free if f < share)
            else:
                stranded = total if whole_free < shape.gpus else partly
            expected += shape.weight * stranded
        return expected


@dataclass(frozen=True, slots=True)
class Shape:
    """A task shape of the workload and how common it is."""

    gpus: int  # whole GPUs per replica (0 for a fractional task)
    share_milli: int
    cpu_milli: int
    memory_mib: int
    weight: float = 0.0


def _shape(
    share_milli: int, gpus_per_replica: int, cpu_milli: int, memory_mib: int
) -> tuple[int, int, int, int]:
    if share_milli:
        return (0, share_milli, cpu_milli, memory_mib)
    return (gpus_per_replica, 0, cpu_milli, memory_mib)


def _headroom(node: NodeSlot) -> tuple[float, float]:
    """Free CPU and memory of a node; untracked ones are unlimited."""
    cpu = float("inf") if node.cpu_free is None else float(node.cpu_free)
    memory = float("inf") if node.memory_free is None else float(node.memory_free)
    return cpu, memory


def _replica_needs(ctx: CycleContext, node: NodeSlot, placed: list[GpuHold]) -> tuple[int, int]:
    """CPU and memory of the replica being scored. The score protocol passes no job, but the
    cycle scores one job at a time: its needs are those of the replicas it placed already, or
    (for the first replica) of the job the cycle is placing, which it records on the context."""
    if placed:
        return placed[0].cpu_milli, placed[0].memory_mib
    job = ctx.placing
    if job is None:
        return 0, 0
    return job.cpu_milli_per_replica, job.memory_mib_per_replica


def node_free_vector(node: NodeSlot) -> list[int]:
    """Free thousandths per healthy GPU of the node, in GPU index order (0 for busy ones)."""
    free_sets = node.free
    vector = []
    for index in sorted(node.gpus):
        gpu = node.gpus[index]
        if not gpu.healthy:
            continue
        if index in free_sets.get(gpu.model, ()):
            vector.append(WHOLE)
        elif index in node.shared:
            vector.append(WHOLE - node.shared[index].used_milli)
        else:
            vector.append(0)
    return vector


def _position(node: NodeSlot, gpu_index: int) -> int:
    """Where a GPU sits in `node_free_vector` (healthy GPUs in index order)."""
    return sum(1 for i in node.gpus if i < gpu_index and node.gpus[i].healthy)

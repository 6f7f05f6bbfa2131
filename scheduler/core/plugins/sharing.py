"""Fractional GPUs: which shared or free GPU a job that asks for part of one GPU gets.

The cycle lists the candidates (GPUs the job's tenant already shares with room for the share
and GPU memory, and one free GPU per node with free GPUs) and a share chooser picks one:

- `best_fit_share`: the GPU with the least room left after the share (classic best fit).
- `fgd`: fragmentation gradient descent (Weng et al., ATC'23). A node's fragmentation for a
  task shape is the free GPU capacity that task could not use there (all of it if the task
  does not fit the node at all; else the partly free GPUs for whole-GPU tasks, or the GPUs
  with less room than the share for fractional tasks). Weighted by how common each shape is in
  the workload (the pending and running jobs of the snapshot), it says how much of the node's
  free capacity is likely stranded. `fgd` places a share where that expected fragmentation
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
    """`fgd` as share chooser and as score plugin. Args: `max_shapes` (default 16), the most
    common task shapes kept for the workload distribution."""

    name = "fgd"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.max_shapes = int(args.get("max_shapes", 16))
        self.shapes: list[tuple[int, int, float]] = []  # (whole GPUs, share milli, weight)

    def prepare(self, ctx: CycleContext) -> None:
        counts: Counter[tuple[int, int]] = Counter()
        for job in ctx.snapshot.pending:
            counts[_shape(job.gpu_share_milli, job.gpus_per_replica)] += job.replicas
        for running in ctx.snapshot.running:
            per_replica = running.gpus // max(len(running.placement), 1)
            counts[_shape(running.gpu_share_milli, per_replica)] += len(running.placement)
        common = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: self.max_shapes]
        total = sum(n for _, n in common) or 1
        self.shapes = [(gpus, share, n / total) for (gpus, share), n in common]

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
            position = _position(ctx.state.nodes[candidate.node_idx], candidate.gpu_index)
            after = list(free)
            after[position] -= job.gpu_share_milli
            delta = self.fragmentation(after) - self.fragmentation(free)
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
        delta = self.fragmentation(after) - self.fragmentation(free)
        # Taking GPUs lowers free capacity by len(gpus) * WHOLE at most; a placement that
        # strands nothing scores 50 + 50 * (taken / node), one that strands more scores less.
        return max(0.0, min(100.0, 50.0 - 50.0 * delta / (WHOLE * len(free))))

    def fragmentation(self, free: Sequence[int]) -> float:
        """Expected free capacity (thousandths of GPUs) that the workload's tasks could not
        use on a node with these free amounts per GPU."""
        total = sum(free)
        if total == 0:
            return 0.0
        whole_free = sum(1 for f in free if f >= WHOLE)
        partly = total - whole_free * WHOLE
        largest = max(free)
        expected = 0.0
        for gpus, share, weight in self.shapes:
            if share:  # a fractional task: GPUs with less room than its share are lost to it
                stranded = total if largest < share else sum(f for f in free if f < share)
            else:
                stranded = total if whole_free < gpus else partly
            expected += weight * stranded
        return expected


def _shape(share_milli: int, gpus_per_replica: int) -> tuple[int, int]:
    return (0, share_milli) if share_milli else (gpus_per_replica, 0)


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

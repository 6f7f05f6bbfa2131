"""Placement plugins: node filters, GPU choosers and scores.

Gandiva's affinity order ranks where a job's GPUs may sit, best first: one NVLink group, one
PCIe switch, one node, one rack, across racks. HiveD's buddy cells keep aligned 2/4/8-GPU
blocks whole so that large jobs still find a block after many small ones came and went.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduler.core.framework import SUCCESS, Code, CycleContext, Status
from scheduler.core.state import GpuHold, NodeLayout, NodeSlot
from scheduler.core.types import PendingJob, ReasonCode

# Affinity levels of one replica's GPUs, best first (Gandiva's order inside a node).
SAME_NVLINK, SAME_PCIE_SWITCH, SAME_NUMA, SAME_NODE = 0, 1, 2, 3


def node_resources_fit(job: PendingJob, node: NodeSlot, replicas: int = 1) -> bool:
    """CPU and memory of `replicas` replicas fit the node (untracked resources always fit)."""
    if node.cpu_free is not None and replicas * job.cpu_milli_per_replica > node.cpu_free:
        return False
    return not (node.memory_free is not None and replicas * job.memory_mib_per_replica > node.memory_free)


class NodeResources:
    name = "node_resources"
    node_local = True  # see FilterPlugin / ScorePlugin

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def filter(self, job: PendingJob, node: NodeSlot, model: str, ctx: CycleContext) -> Status:
        if node_resources_fit(job, node):
            return SUCCESS
        return Status(
            Code.UNSCHEDULABLE,
            ReasonCode.NODE_RESOURCES,
            f"GPUs free but CPU or memory short: replica needs {job.cpu_milli_per_replica} mCPU and "
            f"{job.memory_mib_per_replica} MiB",
        )


def affinity_level(node: NodeSlot, gpus: Iterable[int]) -> int:
    chosen = [node.gpus[i] for i in gpus]
    if len({g.nvlink_group for g in chosen}) <= 1:
        return SAME_NVLINK
    if len({g.pcie_switch for g in chosen}) <= 1:
        return SAME_PCIE_SWITCH
    if len({g.numa_node for g in chosen}) <= 1:
        return SAME_NUMA
    return SAME_NODE


def choose_by_topology(free: set[int], node: NodeSlot, count: int) -> tuple[int, ...] | None:
    """Gandiva-style choice: the tightest domain that holds `count` free GPUs (NVLink group,
    then PCIe switch, then NUMA node), refined inside it the same way; among domains of one
    kind the one with the fewest free GPUs wins (best fit), so larger free domains stay whole
    for larger jobs."""
    if count > len(free) or count <= 0:
        return None
    return _tightest(sorted(free), node, count, ("nvlink_group", "pcie_switch", "numa_node"))


def _tightest(members: list[int], node: NodeSlot, count: int, attrs: tuple[str, ...]) -> tuple[int, ...]:
    if count == len(members):
        return tuple(members)
    for depth, attr in enumerate(attrs):
        domains: dict[int, list[int]] = {}
        for i in members:
            domains.setdefault(getattr(node.gpus[i], attr), []).append(i)
        if len(domains) == 1:
            continue  # every member shares this domain: look at a finer one
        fitting = [(len(m), key) for key, m in domains.items() if len(m) >= count]
        if fitting:
            _, key = min(fitting)
            return _tightest(domains[key], node, count, attrs[depth + 1 :])
        if depth == 0:
            # Spans NVLink groups: fill from the fullest groups so the fewest are split.
            chosen: list[int] = []
            for _, k in sorted((-len(m), k) for k, m in domains.items()):
                chosen.extend(domains[k][: count - len(chosen)])
                if len(chosen) == count:
                    break
            return tuple(sorted(chosen))
    return tuple(members[:count])


# A choice or score depends only on the node's layout (its fixed topology), its free GPUs and
# the request, so the plugins below remember answers per (layout, free GPUs, request): nodes
# of one kind in the same state are computed once per cycle (the plugins are built anew for
# every cycle). The free GPUs are part of the key, so a remembered answer cannot go stale.
ChoiceKey = tuple[NodeLayout, frozenset[int], int]


class TopologyChooser:
    name = "topology"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self._memo: dict[ChoiceKey, tuple[int, ...] | None] = {}

    def choose(self, free: set[int], node: NodeSlot, count: int) -> tuple[int, ...] | None:
        key = (node.layout, frozenset(free), count)
        if key in self._memo:
            return self._memo[key]
        chosen = self._memo[key] = choose_by_topology(free, node, count)
        return chosen


def _model_indices(node: NodeSlot, model: str) -> tuple[int, ...]:
    return node.layout.indices(model)


def largest_free_block(indices: Sequence[int], free: set[int] | frozenset[int]) -> int:
    """Size of the largest fully free aligned power-of-two block (buddy cell) of a node."""
    n = len(indices)
    is_free = [i in free for i in indices]
    size = 1
    while size * 2 <= n:
        size *= 2
    while size >= 1:
        for start in range(0, n - size + 1, size):
            if all(is_free[start : start + size]):
                return size
        size //= 2
    return 0


def choose_buddy(free: set[int], node: NodeSlot, count: int, strict: bool) -> tuple[int, ...] | None:
    """HiveD-style buddy allocation inside a node: take an aligned block of the next power of
    two, preferring a block whose enclosing blocks are already split, so whole larger blocks
    survive. Falls back to topology order when no aligned block is free (unless strict)."""
    if count > len(free) or count <= 0:
        return None
    some = next(iter(free))
    model = node.gpus[some].model
    indices = _model_indices(node, model)
    n = len(indices)
    is_free = [i in free for i in indices]
    block = 1
    while block < count:
        block *= 2
    if block <= n:
        best: tuple[int, int] | None = None  # (largest free enclosing block, start)
        for start in range(0, n - block + 1, block):
            if not all(is_free[start : start + block]):
                continue
            enclosing = block
            size = block * 2
            while size <= n:
                parent = (start // size) * size
                if parent + size <= n and all(is_free[parent : parent + size]):
                    enclosing = size
                    size *= 2
                else:
                    break
            if best is None or (enclosing, start) < best:
                best = (enclosing, start)
        if best is not None:
            start = best[1]
            return tuple(indices[p] for p in range(start, start + count))
    if strict:
        return None
    return choose_by_topology(free, node, count)


class BuddyChooser:
    name = "buddy"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.strict = bool(args.get("strict", False))
        self._memo: dict[ChoiceKey, tuple[int, ...] | None] = {}

    def choose(self, free: set[int], node: NodeSlot, count: int) -> tuple[int, ...] | None:
        key = (node.layout, frozenset(free), count)
        if key in self._memo:
            return self._memo[key]
        chosen = self._memo[key] = choose_buddy(free, node, count, self.strict)
        return chosen


class BinPack:
    """Prefer the node that is fullest after placement: keeps whole nodes free for gangs."""

    name = "binpack"
    node_local = True  # see FilterPlugin / ScorePlugin

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float:
        total = len(node.layout.indices(model)) or 1
        free_after = node.free_count(model) - len(gpus)
        return 100.0 * (1.0 - free_after / total)


class Spread:
    """Prefer the emptiest node: fewer co-located jobs, less interference."""

    name = "spread"
    node_local = True  # see FilterPlugin / ScorePlugin

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float:
        total = len(node.layout.indices(model)) or 1
        free_after = node.free_count(model) - len(gpus)
        return 100.0 * free_after / total


class TopologyAffinity:
    """Scores Gandiva's affinity order: inside the replica (NVLink > PCIe switch > NUMA >
    node) and, for gangs, relative to the replicas already placed (same node > same rack >
    across racks)."""

    name = "topology"
    node_local = True  # for a first replica; gangs' later replicas are never reused
    _INTRA = {SAME_NVLINK: 100.0, SAME_PCIE_SWITCH: 75.0, SAME_NUMA: 60.0, SAME_NODE: 50.0}

    def __init__(self, args: Mapping[str, Any]) -> None:
        self._intra: dict[tuple[NodeLayout, tuple[int, ...]], float] = {}

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float:
        key = (node.layout, gpus)
        intra = self._intra.get(key)
        if intra is None:
            intra = self._intra[key] = self._INTRA[affinity_level(node, gpus)]
        if not placed:
            return intra
        nodes = ctx.state.nodes
        if all(h.node_idx == node.idx for h in placed):
            inter = 100.0
        elif all(nodes[h.node_idx].node.rack == node.node.rack for h in placed):
            inter = 60.0
        else:
            inter = 0.0
        return (intra + inter) / 2.0


class BuddyCells:
    """Scores the share of the node's largest free aligned block (HiveD cell) that survives
    the placement: 100 when the replica goes into an already split block."""

    name = "buddy_cells"
    node_local = True  # see FilterPlugin / ScorePlugin

    def __init__(self, args: Mapping[str, Any]) -> None:
        self._memo: dict[tuple[NodeLayout, str, frozenset[int], tuple[int, ...]], float] = {}

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float:
        free = frozenset(node.free.get(model, ()))
        key = (node.layout, model, free, gpus)
        score = self._memo.get(key)
        if score is None:
            score = self._memo[key] = self._score(_model_indices(node, model), free, gpus)
        return score

    @staticmethod
    def _score(indices: Sequence[int], free: frozenset[int], gpus: tuple[int, ...]) -> float:
        if not indices:
            return 0.0
        before = largest_free_block(indices, free)
        if before == 0:
            return 0.0
        return 100.0 * largest_free_block(indices, free - set(gpus)) / before

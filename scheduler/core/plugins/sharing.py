"""Fractional GPUs: which shared or free GPU a job that asks for part of one GPU gets.

The cycle lists the candidates (GPUs the job's tenant already shares with room for the share
and GPU memory, and one free GPU per node with free GPUs) and a share chooser picks one:

- `best_fit_share`: best fit as the FGD paper's baseline: the node with the least CPU and GPU
  left after the share, there the GPU with the least room left.
- `fgd`: fragmentation gradient descent (Weng et al., ATC'23). A node's fragmentation for a
  task type is the free GPU capacity that task could not use there (all of it if the task
  cannot run there at all: no GPU of its model, too few GPUs with room, too little CPU, or no
  GPU asked for; else the GPUs with less room than it needs from each, for whole-GPU tasks the
  partly used GPUs). Weighted by each type's popularity in the target workload (given by the
  caller, or learned from the snapshot's pending and running jobs), it says how much of the
  node's free capacity is likely stranded. A task the node's free CPU cannot hold strands all
  of its free GPUs, which is why packing GPUs without looking at CPU leaves GPUs idle on
  CPU-bound nodes. With `feed` a node's fragmentation is also at least the free GPU capacity
  its free CPU and memory cannot feed at the workload's mean ratio. `fgd` places a share where
  that expected fragmentation grows least, and as a score plugin steers whole-GPU placements
  the same way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.framework import CycleContext
from scheduler.core.state import GpuHold, NodeSlot
from scheduler.core.types import ANY_MODEL, Gpu, PendingJob

WHOLE = 1000  # a GPU in thousandths


@dataclass(frozen=True, slots=True)
class ShareCandidate:
    node_idx: int
    gpu_index: int
    room_milli: int  # share of the GPU still free (WHOLE for a free GPU)


class BestFitShare:
    """`best_fit_share` as share chooser and as score plugin: best fit as the FGD paper's
    baseline defines it. A node scores by what it has left after the placement, CPU and GPU
    weighted half and half, each over the most any node of the cluster has (less left scores
    higher); a share goes to the node with the least left and there to the GPU with the least
    room left after it. Args: `cpu_weight` (default 0.5; 0 = GPUs only)."""

    name = "best_fit_share"
    node_local = True  # see ScorePlugin

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.cpu_weight = float(args.get("cpu_weight", 0.5))
        self.max_cpu = 1.0
        self.max_gpus = 1.0

    def prepare(self, ctx: CycleContext) -> None:
        cpus = [n.cpu_milli for n in ctx.snapshot.nodes if n.cpu_milli]
        self.max_cpu = float(max(cpus, default=1))
        self.max_gpus = float(max((len(n.gpus) for n in ctx.snapshot.nodes), default=1) or 1)

    def left(self, node: NodeSlot, gpu_milli_taken: int, cpu_taken: int) -> float:
        """Weighted share of the most a node has that this node keeps after a placement (0-1)."""
        gpu_left = (sum(node_free_vector(node)) - gpu_milli_taken) / (WHOLE * self.max_gpus)
        if node.cpu_free is None or self.cpu_weight <= 0:
            return gpu_left
        cpu_left = (node.cpu_free - cpu_taken) / self.max_cpu
        return self.cpu_weight * cpu_left + (1.0 - self.cpu_weight) * gpu_left

    def choose_share(
        self, job: PendingJob, candidates: Sequence[ShareCandidate], ctx: CycleContext
    ) -> ShareCandidate | None:
        if not candidates:
            return None
        lefts: dict[int, float] = {}
        for c in candidates:
            if c.node_idx not in lefts:
                node = ctx.state.nodes[c.node_idx]
                lefts[c.node_idx] = self.left(node, job.gpu_share_milli, job.cpu_milli_per_replica)
        return min(candidates, key=lambda c: (lefts[c.node_idx], c.room_milli, c.node_idx, c.gpu_index))

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float:
        job_cpu, _ = _replica_needs(ctx, node, placed)
        return 100.0 * (1.0 - max(0.0, min(1.0, self.left(node, len(gpus) * WHOLE, job_cpu))))

    def choose_node(self, job: PendingJob, nodes: Sequence[NodeSlot], ctx: CycleContext) -> NodeSlot | None:
        """Where a replica that takes no GPU (CPU and memory only) goes, among nodes with room
        for it: best fit, the node that keeps least CPU and GPU after it (ties: node order)."""
        return min(nodes, key=lambda n: (self.left(n, 0, job.cpu_milli_per_replica), n.idx), default=None)


class FragmentationGradient:
    """`fgd` as share chooser and as score plugin.

    Args:
    - `workload`: the target workload as task types, each `{"gpus", "share_milli",
      "cpu_milli", "memory_mib", "model", "weight"}` (gpus 0 with share_milli 0 is a task
      without GPUs; weights need not add up to 1). A caller that knows the workload to expect
      passes it (the openb experiment passes the trace's); without it the workload is learned
      every cycle from the snapshot's pending and running jobs.
    - `popularity` (default 0.95): the most common task types that make up this share of the
      workload are kept (the FGD paper's typical pods), the rare rest is left out.
    - `memory` (default false): whether task types are told apart, and checked against the
      node, by host memory as well (the paper looks at GPUs and CPU only).
    - `feed` (default false): a node's fragmentation is at least the free GPU capacity its
      free CPU and memory cannot feed at the workload's mean CPU and memory per GPU asked for
      (its GPU task types as a mix, by popularity; memory only with `memory`). The paper's
      measure looks at one task at a time: a node with 8 free GPUs and CPU for 3 typical
      tasks strands nothing by it, yet 5 of its GPUs will find no CPU when tasks keep coming
      (in the openb fill pods never leave). With it, CPU- or memory-heavy work goes where
      CPU and memory are to spare, and light work to nodes short of them.
    - `scale_milli` (default 1000): the score is 100 * sigmoid(-gradient / scale_milli), the
      paper's normalisation (50 = fragmentation unchanged)."""

    name = "fgd"
    node_local = True  # see ScorePlugin

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.popularity = float(args.get("popularity", 0.95))
        self.use_memory = bool(args.get("memory", False))
        self.scale = float(args.get("scale_milli", WHOLE))
        self.feed = bool(args.get("feed", False))
        self.given: list[Shape] | None = None
        if args.get("workload") is not None:
            counts: Counter[tuple[int, int, int, int, str]] = Counter()
            for entry in args["workload"]:
                key = self._key(
                    int(entry.get("share_milli", 0)),
                    int(entry.get("gpus", 0)),
                    int(entry.get("cpu_milli", 0)),
                    int(entry.get("memory_mib", 0)),
                    str(entry.get("model", ANY_MODEL)),
                )
                counts[key] += float(entry.get("weight", 1.0))
            self.given = self._typical(counts)
        self.shapes: list[Shape] = list(self.given or [])
        self.mix = _mix(self.shapes)
        self._memo: dict[tuple[Any, ...], float] = {}
        # Scores of this cycle by everything they are computed from (see score).
        self._scores: dict[tuple[Any, ...], float] = {}
        # Per node of this cycle: its healthy GPUs (index, model) and where each sits in the
        # free vector (see _free_vector).
        self._healthy: dict[int, tuple[dict[int, Gpu], tuple[tuple[int, str], ...], dict[int, int]]] = {}
        self._names_models = any(s.model for s in self.shapes)

    def _key(
        self, share_milli: int, gpus: int, cpu_milli: int, memory_mib: int, model: str
    ) -> tuple[int, int, int, int, str]:
        if share_milli:
            gpus = 0
        return (gpus, share_milli, cpu_milli, memory_mib if self.use_memory else 0, model)

    def _typical(self, counts: Mapping[tuple[int, int, int, int, str], float]) -> list[Shape]:
        """The most common task types up to `popularity` of the workload, weights summing to 1."""
        total = sum(counts.values())
        if total <= 0:
            return []
        kept: list[tuple[tuple[int, int, int, int, str], float]] = []
        covered = 0.0
        for key, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            if covered >= self.popularity * total:
                break
            kept.append((key, n))
            covered += n
        return [Shape(*key, weight=n / covered) for key, n in kept]

    def prepare(self, ctx: CycleContext) -> None:
        self._scores = {}
        self._healthy = {}
        if self.given is not None:
            self._memo = _shared_memo(self.given, self.use_memory, self.feed)
            return
        # Replicas per request as the jobs state it, then per task type: a long queue repeats a
        # few requests, so each is turned into its task type once.
        requests: dict[tuple[int, int, int, int, str], int] = {}
        for job in ctx.snapshot.pending:
            request = (
                job.gpu_share_milli,
                job.gpus_per_replica,
                job.cpu_milli_per_replica,
                job.memory_mib_per_replica,
                job.gpu_model,
            )
            requests[request] = requests.get(request, 0) + job.replicas
        counts: Counter[tuple[int, int, int, int, str]] = Counter()
        for request, replicas in requests.items():
            counts[self._key(*request)] += replicas
        for running in ctx.snapshot.running:
            per_replica = running.gpus // max(len(running.placement), 1)
            key = self._key(
                running.gpu_share_milli,
                per_replica,
                running.cpu_milli_per_replica,
                running.memory_mib_per_replica,
                running.gpu_model,
            )
            counts[key] += len(running.placement)
        self.shapes = self._typical(counts)
        self.mix = _mix(self.shapes)
        self._names_models = any(s.model for s in self.shapes)
        self._memo = {}

    # -- share chooser -------------------------------------------------------------------

    def choose_share(
        self, job: PendingJob, candidates: Sequence[ShareCandidate], ctx: CycleContext
    ) -> ShareCandidate | None:
        """The candidate GPU, over all nodes listed, where the expected fragmentation grows
        least (ties: least room left, then node and GPU order)."""
        best: tuple[float, int, int, int] | None = None
        chosen: ShareCandidate | None = None
        before: dict[int, tuple[list[int], float]] = {}
        for candidate in candidates:
            slot = ctx.state.nodes[candidate.node_idx]
            known = before.get(candidate.node_idx)
            if known is None:
                free = node_free_vector(slot)
                known = before[candidate.node_idx] = (free, self.node_fragmentation(slot, free))
            free, frag = known
            after = list(free)
            after[_position(slot, candidate.gpu_index)] -= job.gpu_share_milli
            delta = (
                self.node_fragmentation(slot, after, job.cpu_milli_per_replica, job.memory_mib_per_replica)
                - frag
            )
            key = (delta, candidate.room_milli, candidate.node_idx, candidate.gpu_index)
            if best is None or key < best:
                best, chosen = key, candidate
        return chosen

    def choose_node(self, job: PendingJob, nodes: Sequence[NodeSlot], ctx: CycleContext) -> NodeSlot | None:
        """Where a replica that takes no GPU (CPU and memory only) goes, among nodes with room
        for it: where the expected fragmentation grows least, as the paper scores such a pod
        (its CPU may leave the node's free GPUs without the CPU the workload's tasks need).
        Many nodes lose nothing (no free GPU, or CPU to spare): among those it goes to the
        one with the least free GPU capacity, then the least CPU left, then node order, so
        that CPU-only work fills nodes whose GPUs are taken before it eats into the CPU
        beside free GPUs (the paper breaks such ties at random)."""
        cpu, memory = job.cpu_milli_per_replica, job.memory_mib_per_replica
        best: tuple[float, int, float, int] | None = None
        chosen: NodeSlot | None = None
        for slot in nodes:
            free = node_free_vector(slot)
            delta = self.node_fragmentation(slot, free, cpu, memory) - self.node_fragmentation(slot, free)
            key = (delta, sum(free), _headroom(slot)[0] - cpu, slot.idx)
            if best is None or key < best:
                best, chosen = key, slot
        return chosen

    # -- score -----------------------------------------------------------------------------

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float:
        free, positions = self._free_vector(node)
        if not free:
            return 50.0
        taken = tuple(positions[i] for i in gpus)  # chosen from the free set: healthy GPUs
        job_cpu, job_memory = _replica_needs(ctx, node, placed)
        # A score depends on the node only through its free vector, headroom and models:
        # nodes in the same state, asked for the same GPUs, share one computation.
        key = (tuple(free), taken, _headroom(node), self._models_of(node), job_cpu, job_memory)
        score = self._scores.get(key)
        if score is None:
            after = list(free)
            for position in taken:
                after[position] = 0
            delta = self.node_fragmentation(node, after, job_cpu, job_memory) - self.node_fragmentation(
                node, free
            )
            score = self._scores[key] = self.score_of(delta)
        return score

    def _free_vector(self, node: NodeSlot) -> tuple[list[int], dict[int, int]]:
        """`_free_vector_and_positions`, for the many nodes a cycle scores: a node's GPUs and
        their health do not change during a cycle, so its healthy GPUs and their positions are
        worked out once (for its GPU table, told by identity), and a node without shares then
        needs only a look at its free sets."""
        if node.shared:
            return _free_vector_and_positions(node)
        known = self._healthy.get(node.idx)
        if known is None or known[0] is not node.gpus:
            _, positions = _free_vector_and_positions(node)
            healthy = tuple((i, node.gpus[i].model) for i in positions)
            known = self._healthy[node.idx] = (node.gpus, healthy, positions)
        _, healthy, positions = known
        free_sets = node.free
        return [WHOLE if i in free_sets.get(model, ()) else 0 for i, model in healthy], positions

    def _models_of(self, node: NodeSlot) -> frozenset[str]:
        """The node's models as node_fragmentation reads them (only if a task type names one)."""
        return _node_models(node) if self._names_models else frozenset()

    def score_of(self, delta: float) -> float:
        """Less fragmentation added scores higher: 100 * sigmoid(-delta / scale), 50 for none.
        Nodes are compared by the change itself, so the scale is one constant for all."""
        x = max(-60.0, min(60.0, delta / self.scale))
        return 100.0 / (1.0 + math.exp(x))

    def node_fragmentation(
        self, node: NodeSlot, free: Sequence[int], cpu_taken: int = 0, memory_taken: int = 0
    ) -> float:
        """`fragmentation` of a node with these free amounts per GPU, less the CPU and memory
        of a replica being placed there. Nodes in the same state share one computation."""
        cpu, memory = _headroom(node)
        cpu -= cpu_taken
        memory = memory - memory_taken if self.use_memory else float("inf")
        models = self._models_of(node)
        key = (tuple(sorted(free)), cpu, memory, models)
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self.fragmentation(free, cpu, memory, models)
        return value

    def fragmentation(
        self,
        free: Sequence[int],
        cpu_free: float,
        memory_free: float = float("inf"),
        models: frozenset[str] = frozenset(),
    ) -> float:
        """Expected free GPU capacity (thousandths) that the workload's tasks could not use on a
        node with these free amounts per GPU and this much free CPU and memory (FGD's F_n(M)):
        for each task type, weighted by its popularity, all of the node's free GPU capacity if
        the task cannot run there (no GPU of its model, too few GPUs with room for it, too
        little CPU or memory, or it asks for no GPU at all), else the capacity of the GPUs
        with less room than it needs from each GPU (partly used GPUs for whole-GPU tasks)."""
        total = sum(free)
        if total <= 0:
            return 0.0
        expected = 0.0
        for shape in self.shapes:
            need = shape.share_milli or WHOLE
            count = 1 if shape.share_milli else shape.gpus
            if (
                count <= 0
                or shape.cpu_milli > cpu_free
                or shape.memory_mib > memory_free
                or (shape.model and shape.model not in models)
                or sum(1 for f in free if f >= need) < count
            ):
                stranded = total
            else:
                stranded = sum(f for f in free if f < need)
            expected += shape.weight * stranded
        if self.feed:
            expected = max(expected, total - self._fed(total, cpu_free, memory_free))
        return expected

    def _fed(self, total: float, cpu_free: float, memory_free: float) -> float:
        """How much of the node's free GPU capacity its free CPU and memory can feed at the
        workload's mean CPU and memory per thousandth of a GPU asked for."""
        cpu_per_milli, memory_per_milli = self.mix
        fed = total
        if cpu_per_milli > 0 and math.isfinite(cpu_free):
            fed = min(fed, max(cpu_free, 0.0) / cpu_per_milli)
        if memory_per_milli > 0 and math.isfinite(memory_free):
            fed = min(fed, max(memory_free, 0.0) / memory_per_milli)
        return fed


@dataclass(frozen=True, slots=True)
class Shape:
    """A task type of the workload and how common it is."""

    gpus: int  # whole GPUs per replica (0 for a fractional task or a task without GPUs)
    share_milli: int
    cpu_milli: int
    memory_mib: int
    model: str = ANY_MODEL  # the GPU model it asks for ("" = any)
    weight: float = 0.0


# Fragmentation by node state for a workload given in the arguments: the plugin is built
# anew every cycle, the workload stays; the last one's results are kept for the next cycle.
_SHARED_MEMO: dict[tuple[Any, ...], dict[tuple[Any, ...], float]] = {}


def _shared_memo(shapes: Sequence[Shape], use_memory: bool, feed: bool) -> dict[tuple[Any, ...], float]:
    key = (tuple(shapes), use_memory, feed)
    memo = _SHARED_MEMO.get(key)
    if memo is None:
        _SHARED_MEMO.clear()
        memo = _SHARED_MEMO[key] = {}
    elif len(memo) > 1_000_000:
        memo.clear()
    return memo


def _mix(shapes: Sequence[Shape]) -> tuple[float, float]:
    """CPU and memory the workload's GPU task types ask for per thousandth of a GPU, as a mix
    weighted by popularity (0 when there are none)."""
    gpu_shapes = [s for s in shapes if s.gpus or s.share_milli]
    demand = sum(s.weight * (s.share_milli or s.gpus * WHOLE) for s in gpu_shapes)
    if demand <= 0:
        return 0.0, 0.0
    cpu = sum(s.weight * s.cpu_milli for s in gpu_shapes)
    memory = sum(s.weight * s.memory_mib for s in gpu_shapes)
    return cpu / demand, memory / demand


def _node_models(node: NodeSlot) -> frozenset[str]:
    return frozenset(g.model for g in node.gpus.values() if g.healthy)


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
    return _free_vector_and_positions(node)[0]


def _free_vector_and_positions(node: NodeSlot) -> tuple[list[int], dict[int, int]]:
    """The node's free vector (see `node_free_vector`) and where each healthy GPU sits in it."""
    free_sets = node.free
    vector: list[int] = []
    positions: dict[int, int] = {}
    for index in sorted(node.gpus):
        gpu = node.gpus[index]
        if not gpu.healthy:
            continue
        positions[index] = len(vector)
        if index in free_sets.get(gpu.model, ()):
            vector.append(WHOLE)
        elif index in node.shared:
            vector.append(WHOLE - node.shared[index].used_milli)
        else:
            vector.append(0)
    return vector, positions


def _position(node: NodeSlot, gpu_index: int) -> int:
    """Where a GPU sits in `node_free_vector` (healthy GPUs in index order)."""
    return sum(1 for i in node.gpus if i < gpu_index and node.gpus[i].healthy)

"""The per-cycle working copy of the cluster: free GPUs, indexes for fast fit, and quota usage.

It is built from the immutable snapshot at the start of every cycle and thrown away at the
end, so the snapshot itself is never touched. All changes go through `take` and `give`, which
a `Statement` records so a gang's tentative placement can be undone exactly.

Node eligibility is a fixed rule, not a plugin: only READY nodes receive new work and only
healthy GPUs count as free. Letting a profile switch that off would let the core hand a job a
broken GPU, which no policy wants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.types import (
    ALL_MODELS,
    ANY_MODEL,
    Gpu,
    Node,
    NodeState,
    Quota,
    RunningJob,
    Snapshot,
    VirtualCluster,
)


@dataclass(slots=True)
class SharedGpu:
    """A GPU that fractional jobs share: what they hold of it, and whose it is. A shared GPU
    is out of the node's free set, so whole-GPU work never lands on it."""

    used_milli: int
    memory_mib: int
    tenant: str
    holders: int = 0


# What governs a VC on a model (ClusterState.quota_for): (guaranteed, borrow_limit, used, row),
# `row` the quota row's model: a model, ALL_MODELS for the row of all models, or ANY_MODEL for
# the sum of every row (a job that takes any model). A plain tuple: it is made on every cache
# miss of the admission check.
QuotaUse = tuple[int, int, int, str]


def whole_gpus(milli: int) -> int:
    """Shares in thousandths as whole GPUs for quotas: any started GPU counts."""
    return -(-milli // 1000)


@dataclass(frozen=True, slots=True, eq=False)
class NodeLayout:
    """What never changes about a node's GPUs during a cycle: which GPU of which model sits
    where in the topology. Nodes built alike share one layout object, so a placement plugin
    can remember a choice or a score per (layout, free GPUs) and reuse it on every node of
    that kind: in a homogeneous cluster one computation serves all nodes. Compared by
    identity (cheap to hash); two equal layouts that are distinct objects are merely not
    shared."""

    signature: tuple[tuple[int, str, int, int, int], ...]  # (index, model, nvlink, pcie, numa)
    indices_by_model: dict[str, tuple[int, ...]]  # every GPU of the model, healthy or not, sorted

    @staticmethod
    def signature_of(gpus: dict[int, Gpu]) -> tuple[tuple[int, str, int, int, int], ...]:
        return tuple(
            (i, g.model, g.nvlink_group, g.pcie_switch, g.numa_node) for i, g in sorted(gpus.items())
        )

    @classmethod
    def of(cls, gpus: dict[int, Gpu]) -> NodeLayout:
        signature = cls.signature_of(gpus)
        by_model: dict[str, list[int]] = {}
        for index, model, _, _, _ in signature:
            by_model.setdefault(model, []).append(index)
        return cls(signature, {m: tuple(indices) for m, indices in by_model.items()})

    def indices(self, model: str) -> tuple[int, ...]:
        return self.indices_by_model.get(model, ())


@dataclass(slots=True)
class NodeSlot:
    """Mutable per-cycle view of one node. `idx` is its position in the snapshot, used as
    the identity everywhere because ints iterate deterministically in sets."""

    idx: int
    node: Node
    usable: bool
    free: dict[str, set[int]]  # model -> free healthy GPU indices
    gpus: dict[int, Gpu]
    cpu_free: int | None  # None = not tracked
    memory_free: int | None
    shared: dict[int, SharedGpu] = field(default_factory=dict)  # GPU index -> its shares
    layout: NodeLayout = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    # Bumped by every take and give on this node: the cycle reuses what it worked out about
    # a node (its placement answer for a request) until the node changes.
    changes: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.layout is None:
            self.layout = NodeLayout.of(self.gpus)

    def free_count(self, model: str) -> int:
        free = self.free.get(model)
        return len(free) if free else 0


@dataclass(frozen=True, slots=True)
class GpuHold:
    """One replica's claim on one node: the unit a Statement takes and gives back."""

    node_idx: int
    model: str
    gpu_indices: tuple[int, ...]
    cpu_milli: int
    memory_mib: int
    vc: str
    user: str
    share_milli: int = 0  # a fractional job's share of its one GPU; 0 = whole GPUs
    gpu_memory_mib: int = 0


@dataclass(slots=True)
class ClusterState:
    nodes: list[NodeSlot]
    node_idx_by_name: dict[str, int]
    # model -> buckets[k] = indexes of usable nodes with exactly k free GPUs of that model
    buckets: dict[str, list[set[int]]]
    free_total: dict[str, int]
    capacity_total: dict[str, int]  # usable healthy GPUs per model, busy or not
    quotas: dict[str, dict[str, Quota]]  # vc -> gpu model (or ALL_MODELS) -> quota
    vcs: dict[str, VirtualCluster]
    used: dict[str, dict[str, int]] = field(default_factory=dict)  # vc -> model -> GPUs held
    user_used: dict[tuple[str, str], int] = field(default_factory=dict)  # (vc, user) -> GPUs
    # Fractional jobs' shares in thousandths, counted for quotas as whole GPUs (rounded up).
    share_used: dict[str, dict[str, int]] = field(default_factory=dict)  # vc -> model -> milli
    user_share_used: dict[tuple[str, str], int] = field(default_factory=dict)
    # CPU (milli-cores) and memory (MiB) per (vc, user), kept only for the VCs in
    # `resource_capped` (those with a per-user CPU or memory cap): every take and give would
    # pay for them, and nothing else reads them.
    resource_capped: frozenset[str] = frozenset()
    user_cpu_used: dict[tuple[str, str], int] = field(default_factory=dict)
    user_memory_used: dict[tuple[str, str], int] = field(default_factory=dict)
    shared_nodes: set[int] = field(default_factory=set)  # nodes with a shared GPU
    # Bumped by every take and give: lets the cycle reuse fit answers until something changes.
    version: int = field(default=0, compare=False)
    models: list[str] = field(default_factory=list)  # GPU models present, sorted
    _quota_cache: dict[tuple[str, str], tuple[int, QuotaUse | None]] = field(
        default_factory=dict, compare=False, repr=False
    )

    # -- quota usage -------------------------------------------------------------------

    def vc_used(self, vc: str, model: str) -> int:
        """GPUs the VC holds of `model`; ALL_MODELS or ANY_MODEL means all models."""
        by_model = self.used.get(vc) or {}
        shares = self.share_used.get(vc) or {}
        if model in (ALL_MODELS, ANY_MODEL):
            return sum(by_model.values()) + sum(whole_gpus(m) for m in shares.values())
        return by_model.get(model, 0) + whole_gpus(shares.get(model, 0))

    def user_gpus(self, vc: str, user: str) -> int:
        """GPUs a user holds in a VC, shares rounded up to whole GPUs."""
        return self.user_used.get((vc, user), 0) + whole_gpus(self.user_share_used.get((vc, user), 0))

    def user_cpu_milli(self, vc: str, user: str) -> int:
        """CPU a user's jobs hold in a VC (counted only where the VC caps it)."""
        return self.user_cpu_used.get((vc, user), 0)

    def user_memory_mib(self, vc: str, user: str) -> int:
        """Memory a user's jobs hold in a VC (counted only where the VC caps it)."""
        return self.user_memory_used.get((vc, user), 0)

    def share_increment(self, vc: str, user: str, model: str, share_milli: int) -> tuple[int, int]:
        """Whole GPUs one more share adds to the VC's usage of `model` and to the user's."""
        vc_milli = (self.share_used.get(vc) or {}).get(model, 0)
        user_milli = self.user_share_used.get((vc, user), 0)
        return (
            whole_gpus(vc_milli + share_milli) - whole_gpus(vc_milli),
            whole_gpus(user_milli + share_milli) - whole_gpus(user_milli),
        )

    def tenant_of(self, vc: str) -> str:
        found = self.vcs.get(vc)
        return found.tenant if found is not None and found.tenant else vc

    def quota_for(self, vc: str, model: str) -> QuotaUse | None:
        """(guaranteed, borrow_limit, used, row) governing `vc` on `model`, or None if the VC
        has no quota that covers it. A model-specific row wins over the ALL_MODELS row; a job
        without a model is checked against the VC's totals (row ANY_MODEL). `row` says which
        row governs, so that a message counts "GPUs" where usage of all models binds, not the
        job's model. Answers are reused until the next take or give (most of a long queue is
        checked while nothing changes)."""
        key = (vc, model)
        cached = self._quota_cache.get(key)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        result = self._quota_for(vc, model)
        self._quota_cache[key] = (self.version, result)
        return result

    def _quota_for(self, vc: str, model: str) -> QuotaUse | None:
        rows = self.quotas.get(vc)
        if rows is None:
            return None
        if model == ANY_MODEL:
            if not rows:
                return None
            return (
                sum(q.guaranteed for q in rows.values()),
                sum(q.borrow_limit for q in rows.values()),
                self.vc_used(vc, ALL_MODELS),
                ANY_MODEL,
            )
        row = rows.get(model)
        if row is not None:
            return row.guaranteed, row.borrow_limit, self.vc_used(vc, model), model
        row = rows.get(ALL_MODELS)
        if row is not None:
            return row.guaranteed, row.borrow_limit, self.vc_used(vc, ALL_MODELS), ALL_MODELS
        return None

    # -- GPU holds -----------------------------------------------------------------------

    def take(self, hold: GpuHold) -> None:
        """Claim the hold's GPUs and charge its VC and user. GPUs that are not free (an
        unhealthy GPU a running job still holds) are charged but not removed twice."""
        if hold.share_milli:
            self._take_share(hold)
            return
        self._remove_free(hold)
        self._add_usage(hold, 1)

    def _take_share(self, hold: GpuHold) -> None:
        """A share of one GPU: the GPU leaves the free set with its first share."""
        slot = self.nodes[hold.node_idx]
        index = hold.gpu_indices[0]
        self.version += 1
        slot.changes += 1
        entry = slot.shared.get(index)
        if entry is None:
            free = slot.free.setdefault(hold.model, set())
            if index in free:
                if slot.usable:
                    self._move_bucket(hold.model, hold.node_idx, len(free), len(free) - 1)
                    self.free_total[hold.model] -= 1
                free.discard(index)
            entry = slot.shared[index] = SharedGpu(0, 0, self.tenant_of(hold.vc))
            self.shared_nodes.add(hold.node_idx)
        entry.used_milli += hold.share_milli
        entry.memory_mib += hold.gpu_memory_mib
        entry.holders += 1
        if slot.cpu_free is not None:
            slot.cpu_free -= hold.cpu_milli
        if slot.memory_free is not None:
            slot.memory_free -= hold.memory_mib
        self._add_share_usage(hold, hold.share_milli)

    def _give_share(self, hold: GpuHold) -> None:
        """Inverse of _take_share: with its last share gone a healthy GPU is free again."""
        slot = self.nodes[hold.node_idx]
        index = hold.gpu_indices[0]
        self.version += 1
        slot.changes += 1
        entry = slot.shared[index]
        entry.used_milli -= hold.share_milli
        entry.memory_mib -= hold.gpu_memory_mib
        entry.holders -= 1
        if entry.holders == 0:
            del slot.shared[index]
            if not slot.shared:
                self.shared_nodes.discard(hold.node_idx)
            gpu = slot.gpus.get(index)
            if gpu is not None and gpu.healthy:
                free = slot.free.setdefault(hold.model, set())
                if slot.usable:
                    self._move_bucket(hold.model, hold.node_idx, len(free), len(free) + 1)
                    self.free_total[hold.model] = self.free_total.get(hold.model, 0) + 1
                free.add(index)
        if slot.cpu_free is not None:
            slot.cpu_free += hold.cpu_milli
        if slot.memory_free is not None:
            slot.memory_free += hold.memory_mib
        self._add_share_usage(hold, -hold.share_milli)

    def _add_share_usage(self, hold: GpuHold, delta: int) -> None:
        if self.resource_capped and hold.vc in self.resource_capped:
            self._add_user_resources(hold, 1 if delta > 0 else -1)
        by_model = self.share_used.setdefault(hold.vc, {})
        milli = by_model.get(hold.model, 0) + delta
        if milli:
            by_model[hold.model] = milli
        else:
            by_model.pop(hold.model, None)
            if not by_model:
                del self.share_used[hold.vc]
        key = (hold.vc, hold.user)
        milli = self.user_share_used.get(key, 0) + delta
        if milli:
            self.user_share_used[key] = milli
        else:
            self.user_share_used.pop(key, None)

    def block(self, hold: GpuHold) -> None:
        """Mark GPUs busy again and charge them back to their holder: the GPUs of a preempted
        job that its preemptor does not use stay the job's, and its VC's, until it is gone, so
        no later job of the cycle starts on them or on the quota they still take."""
        self._remove_free(hold)
        self._add_usage(hold, 1)

    def occupy(self, hold: GpuHold) -> None:
        """Mark GPUs busy without charging anyone: a parked job told to leave holds them
        while it checkpoints, but not its VC's quota (RunningJob.parked)."""
        self._remove_free(hold)

    def charge(self, hold: GpuHold) -> None:
        """Charge GPUs to a VC and user without taking them: a preempted job holds the GPUs its
        preemptor will have until it is gone, so in the cycle that preempts it its VC and user
        gain no quota from them (the preemptor's VC is charged for them as well)."""
        self.version += 1
        self._add_usage(hold, 1)

    def _remove_free(self, hold: GpuHold) -> None:
        slot = self.nodes[hold.node_idx]
        free = slot.free.setdefault(hold.model, set())
        self.version += 1
        slot.changes += 1
        present = [i for i in hold.gpu_indices if i in free]
        if slot.usable:
            self._move_bucket(hold.model, hold.node_idx, len(free), len(free) - len(present))
            self.free_total[hold.model] -= len(present)
        free.difference_update(present)
        if slot.cpu_free is not None:
            slot.cpu_free -= hold.cpu_milli
        if slot.memory_free is not None:
            slot.memory_free -= hold.memory_mib

    def give(self, hold: GpuHold) -> None:
        """Inverse of take. GPUs that are unhealthy stay out of the free set."""
        if hold.share_milli:
            self._give_share(hold)
            return
        slot = self.nodes[hold.node_idx]
        free = slot.free.setdefault(hold.model, set())
        self.version += 1
        slot.changes += 1
        returned = [i for i in hold.gpu_indices if i in slot.gpus and slot.gpus[i].healthy]
        if slot.usable:
            self._move_bucket(hold.model, hold.node_idx, len(free), len(free) + len(returned))
            self.free_total[hold.model] = self.free_total.get(hold.model, 0) + len(returned)
        free.update(returned)
        if slot.cpu_free is not None:
            slot.cpu_free += hold.cpu_milli
        if slot.memory_free is not None:
            slot.memory_free += hold.memory_mib
        self._add_usage(hold, -1)

    def _add_usage(self, hold: GpuHold, sign: int) -> None:
        """Charge (sign 1) or credit (-1) the hold's GPUs to its VC and user."""
        # Zero counts are removed so that an undone statement leaves the state equal to the
        # one before, entry for entry.
        delta = sign * len(hold.gpu_indices)
        if self.resource_capped and hold.vc in self.resource_capped:
            self._add_user_resources(hold, sign)
        by_model = self.used.setdefault(hold.vc, {})
        count = by_model.get(hold.model, 0) + delta
        if count:
            by_model[hold.model] = count
        else:
            by_model.pop(hold.model, None)
            if not by_model:
                del self.used[hold.vc]
        key = (hold.vc, hold.user)
        count = self.user_used.get(key, 0) + delta
        if count:
            self.user_used[key] = count
        else:
            self.user_used.pop(key, None)

    def _add_user_resources(self, hold: GpuHold, sign: int) -> None:
        key = (hold.vc, hold.user)
        for used, amount in ((self.user_cpu_used, hold.cpu_milli), (self.user_memory_used, hold.memory_mib)):
            total = used.get(key, 0) + sign * amount
            if total:
                used[key] = total
            else:
                used.pop(key, None)

    def _move_bucket(self, model: str, node_idx: int, before: int, after: int) -> None:
        buckets = self.buckets[model]
        buckets[before].discard(node_idx)
        buckets[after].add(node_idx)

    # -- fit queries ---------------------------------------------------------------------

    def replica_slots(self, model: str, gpus_per_replica: int) -> int:
        """How many replicas of this size the free GPUs could hold, ignoring CPU/memory."""
        buckets = self.buckets.get(model)
        if not buckets or gpus_per_replica <= 0:
            return 0
        return sum(len(buckets[k]) * (k // gpus_per_replica) for k in range(gpus_per_replica, len(buckets)))

    def nodes_with_free(self, model: str, gpus: int) -> int:
        buckets = self.buckets.get(model)
        if not buckets:
            return 0
        return sum(len(buckets[k]) for k in range(gpus, len(buckets)))

    def max_node_gpus(self, model: str) -> int:
        buckets = self.buckets.get(model)
        return len(buckets) - 1 if buckets else 0


def build_state(snapshot: Snapshot) -> tuple[ClusterState, dict[str, list[GpuHold]]]:
    """Working state with every running job's GPUs taken. Returns the holds per running job
    so preemption can give them back tentatively.

    Busy GPUs are collected per node first and the free sets, buckets and usage built once:
    the same result as taking every hold in turn, at a fraction of the cost, which matters
    because this runs at the start of every cycle."""
    node_idx_by_name = {n.name: i for i, n in enumerate(snapshot.nodes)}
    gpu_maps = [{g.index: g for g in node.gpus} for node in snapshot.nodes]
    busy: list[set[int]] = [set() for _ in snapshot.nodes]
    cpu_used = [0] * len(snapshot.nodes)
    memory_used = [0] * len(snapshot.nodes)
    used: dict[str, dict[str, int]] = {}
    user_used: dict[tuple[str, str], int] = {}
    capped = frozenset(vc.name for vc in snapshot.vcs if vc.caps_user_resources)
    user_cpu: dict[tuple[str, str], int] = {}
    user_memory: dict[tuple[str, str], int] = {}
    holds: dict[str, list[GpuHold]] = {}
    shared_holds: list[GpuHold] = []
    for job in snapshot.running:
        if job.gpu_share_milli:
            holds[job.id] = _share_holds(job, node_idx_by_name, gpu_maps)
            shared_holds.extend(holds[job.id])
            continue
        job_holds: list[GpuHold] = []
        by_model = used.setdefault(job.vc, {})
        charged = 0
        for replica in job.placement:
            node_idx = node_idx_by_name.get(replica.node)
            if node_idx is None:
                continue
            gpu_map = gpu_maps[node_idx]
            indices = replica.gpu_indices
            if not all(map(gpu_map.__contains__, indices)):
                indices = tuple(i for i in indices if i in gpu_map)
            first = gpu_map.get(indices[0]) if indices else None
            model = first.model if first is not None else job.gpu_model
            job_holds.append(
                GpuHold(
                    node_idx,
                    model,
                    indices,
                    job.cpu_milli_per_replica,
                    job.memory_mib_per_replica,
                    job.vc,
                    job.user,
                )
            )
            busy[node_idx].update(indices)
            cpu_used[node_idx] += job.cpu_milli_per_replica
            memory_used[node_idx] += job.memory_mib_per_replica
            if not job.parked:
                by_model[model] = by_model.get(model, 0) + len(indices)
                charged += len(indices)
        if job.placement and not job_holds and not job.parked:
            # Node gone from the snapshot: still charge the VC so quotas stay conservative.
            by_model[job.gpu_model] = by_model.get(job.gpu_model, 0) + job.gpus
            charged = job.gpus
        if charged:
            key = (job.vc, job.user)
            user_used[key] = user_used.get(key, 0) + charged
        if capped and job.vc in capped and not job.parked:
            # Per replica held, as give() credits them back; every replica when its node is gone.
            replicas = len(job_holds) or len(job.placement)
            key = (job.vc, job.user)
            user_cpu[key] = user_cpu.get(key, 0) + replicas * job.cpu_milli_per_replica
            user_memory[key] = user_memory.get(key, 0) + replicas * job.memory_mib_per_replica
        holds[job.id] = job_holds
    for vc in [vc for vc, by_model in used.items() if not any(by_model.values())]:
        del used[vc]
    for by_model in used.values():
        for model in [m for m, n in by_model.items() if not n]:
            del by_model[model]

    max_gpus: dict[str, int] = {}
    slots: list[NodeSlot] = []
    layouts: dict[tuple[tuple[int, str, int, int, int], ...], NodeLayout] = {}
    for idx, node in enumerate(snapshot.nodes):
        free: dict[str, set[int]] = {}
        per_model: dict[str, int] = {}
        taken = busy[idx]
        for gpu in node.gpus:
            per_model[gpu.model] = per_model.get(gpu.model, 0) + 1
            free_of_model = free.get(gpu.model)
            if free_of_model is None:
                free_of_model = free[gpu.model] = set()
            if gpu.healthy and gpu.index not in taken:
                free_of_model.add(gpu.index)
        for model, count in per_model.items():
            if count > max_gpus.get(model, 0):
                max_gpus[model] = count
        slots.append(
            NodeSlot(
                idx=idx,
                node=node,
                usable=node.state == NodeState.READY,
                free=free,
                gpus=gpu_maps[idx],
                cpu_free=node.cpu_milli - cpu_used[idx] if node.cpu_milli else None,
                memory_free=node.memory_mib - memory_used[idx] if node.memory_mib else None,
                layout=_shared_layout(layouts, gpu_maps[idx]),
            )
        )
    buckets: dict[str, list[set[int]]] = {m: [set() for _ in range(n + 1)] for m, n in max_gpus.items()}
    free_total: dict[str, int] = dict.fromkeys(max_gpus, 0)
    capacity: dict[str, int] = dict.fromkeys(max_gpus, 0)
    for slot in slots:
        if not slot.usable:
            continue
        for model, free in slot.free.items():
            buckets[model][len(free)].add(slot.idx)
            free_total[model] += len(free)
        for gpu in slot.node.gpus:
            if gpu.healthy:
                capacity[gpu.model] += 1
    state = ClusterState(
        nodes=slots,
        node_idx_by_name=node_idx_by_name,
        buckets=buckets,
        free_total=free_total,
        capacity_total=capacity,
        quotas={vc.name: {q.gpu_model: q for q in vc.quotas} for vc in snapshot.vcs},
        vcs={vc.name: vc for vc in snapshot.vcs},
        used=used,
        user_used={k: v for k, v in user_used.items() if v},
        resource_capped=capped,
        user_cpu_used={k: v for k, v in user_cpu.items() if v},
        user_memory_used={k: v for k, v in user_memory.items() if v},
        models=sorted(capacity),
    )
    for hold in shared_holds:
        state.take(hold)
    return state, holds


def _shared_layout(
    layouts: dict[tuple[tuple[int, str, int, int, int], ...], NodeLayout], gpus: dict[int, Gpu]
) -> NodeLayout:
    signature = NodeLayout.signature_of(gpus)
    layout = layouts.get(signature)
    if layout is None:
        layout = layouts[signature] = NodeLayout.of(gpus)
    return layout


def _share_holds(
    job: RunningJob, node_idx_by_name: dict[str, int], gpu_maps: list[dict[int, Gpu]]
) -> list[GpuHold]:
    """The one share a running fractional job holds (none if its node or GPU is gone)."""
    for replica in job.placement:
        node_idx = node_idx_by_name.get(replica.node)
        if node_idx is None or not replica.gpu_indices or replica.gpu_indices[0] not in gpu_maps[node_idx]:
            continue
        index = replica.gpu_indices[0]
        return [
            GpuHold(
                node_idx,
                gpu_maps[node_idx][index].model,
                (index,),
                job.cpu_milli_per_replica,
                job.memory_mib_per_replica,
                job.vc,
                job.user,
                share_milli=job.gpu_share_milli,
                gpu_memory_mib=job.gpu_memory_mib,
            )
        ]
    return []

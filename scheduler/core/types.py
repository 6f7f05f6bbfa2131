"""Snapshot and plan types: the whole contract between the scheduling core and its callers.

The portal builds a `Snapshot` from database rows and applies the `Plan`; the simulator builds
it from trace state. Every value here is a frozen dataclass so the core can share them freely
and never has to defend against a caller (or a plugin) changing them mid-cycle.

Conventions:
- All times are float seconds on one clock chosen by the caller (the portal uses Unix epoch
  seconds, the simulator seconds since the start of the trace). Durations are float seconds.
- Memory is in MiB, CPU in milli-cores. A value of 0 for a node's CPU or memory means
  "not tracked", so traces without CPU data still schedule.
- A GPU model of "" on a job means "any model".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

JobId = NewType("JobId", str)
NodeName = NewType("NodeName", str)
VcName = NewType("VcName", str)
UserName = NewType("UserName", str)

ANY_MODEL = ""  # a job's gpu_model when it accepts any GPU model
ALL_MODELS = "*"  # a quota row's gpu_model when it covers every model


class NodeState(StrEnum):
    """Why a node may or may not receive new work. Only READY nodes get new placements;
    running work on CORDONED nodes keeps running, work on DRAINING nodes is told to checkpoint
    and move (cycle.leave_draining_nodes), work on NOT_READY nodes is the portal's business
    (it marks the job lost), the core only stops placing there."""

    READY = "ready"
    NOT_READY = "not-ready"
    CORDONED = "cordoned"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU and where it sits in the node's topology (used for affinity scoring)."""

    index: int
    model: str
    uuid: str = ""
    memory_mib: int = 0
    nvlink_group: int = 0  # GPUs with the same value share an NVLink/NVSwitch domain
    pcie_switch: int = 0
    numa_node: int = 0
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Node:
    name: NodeName
    gpus: tuple[Gpu, ...]
    rack: str = ""
    state: NodeState = NodeState.READY
    cpu_milli: int = 0  # 0 = not tracked
    memory_mib: int = 0  # 0 = not tracked


@dataclass(frozen=True, slots=True)
class Quota:
    """A VC's share of one GPU model. `guaranteed` GPUs are always reclaimable for the VC;
    up to `borrow_limit` more may be borrowed from idle capacity, preemptibly.

    `lending_limit` (Kueue's lendingLimit) is how many of its idle guaranteed GPUs other VCs
    may borrow; the rest stays free for the VC, so its jobs start at once instead of after a
    reclaim's grace period. None lends all of them."""

    gpu_model: str  # a model name, or ALL_MODELS
    guaranteed: int
    borrow_limit: int = 0
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class VirtualCluster:
    name: VcName
    quotas: tuple[Quota, ...]
    tenant: str = ""
    # Name of a queue-sort plugin that orders this VC's jobs among themselves ("" = the
    # profile's order). The VC keeps the queue positions the profile gave its jobs.
    queueing_policy: str = ""
    max_gpus_per_user: int | None = None  # per-user limit inside the VC; None = no limit
    # The same for the CPU (milli-cores) and memory (MiB) of a user's jobs, all replicas counted:
    # jobs that ask for few GPUs and much CPU or memory would otherwise let one user starve the
    # VC's other users on the nodes' CPU or memory while within the GPU limit.
    max_cpu_milli_per_user: int | None = None
    max_memory_mib_per_user: int | None = None
    # An admin's stop (Kueue's stopPolicy): "hold" starts none of its jobs, "hold-and-drain" also
    # tells its running jobs to checkpoint and stop. "" = open.
    stop_policy: str = ""
    # Why none of its jobs may start while it is otherwise open: its GPU-hour budget is spent
    # (the producer counts the hours and words the message; "" = within budget or none).
    budget_message: str = ""

    @property
    def caps_users(self) -> bool:
        """Whether the VC sets any per-user cap: then one user's wait says nothing of another's."""
        return self.max_gpus_per_user is not None or self.caps_user_resources

    @property
    def caps_user_resources(self) -> bool:
        """Whether the VC caps its users' CPU or memory, which every placement must then count."""
        return self.max_cpu_milli_per_user is not None or self.max_memory_mib_per_user is not None


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """The GPUs one replica (one container / one process group) holds on one node."""

    node: NodeName
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs now (running, starting, or checkpointing before preemption)."""

    id: JobId
    vc: VcName
    user: UserName
    placement: tuple[ReplicaPlacement, ...]
    started_at: float  # start of the current attempt
    gpu_model: str = ANY_MODEL
    priority: int = 0
    preemptible: bool = True
    attained_gpu_s: float = 0.0  # GPU-seconds of service over all attempts, as of `now`
    last_checkpoint_at: float | None = None
    time_limit_s: float | None = None  # wall time per attempt; None = no limit
    checkpointable: bool = True
    estimated_runtime_s: float | None = None  # history-based estimate of the whole run
    cpu_milli_per_replica: int = 0
    memory_mib_per_replica: int = 0
    submitted_at: float = 0.0
    # Already told to stop (preempted or cancelled) and releasing its GPUs within the grace
    # period. The core counts those GPUs as soon free and never preempts the job again.
    stopping: bool = False
    # A fractional job holds this share of its one GPU (thousandths; 0 = whole GPUs) and this
    # much of its memory; other fractional jobs of the same tenant may share the GPU.
    gpu_share_milli: int = 0
    gpu_memory_mib: int = 0
    # Time-slicing: the job may be suspended for another job of its VC when its quantum is up;
    # `slice_started_at` is when its current quantum began (None = started_at).
    time_sliceable: bool = False
    slice_started_at: float | None = None
    # A suspended job told to leave the GPUs it is parked on, checkpointing there (always
    # `stopping` too): it holds them until it is gone, but not its VC's quota, which it gave
    # up when it was suspended (see `left_parked`).
    parked: bool = False
    gpus: int = field(init=False, compare=False, repr=False)  # derived from placement

    def __post_init__(self) -> None:
        # Computed once: the cycle asks for it many times per job.
        object.__setattr__(self, "gpus", sum(len(r.gpu_indices) for r in self.placement))


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting for GPUs: new, or requeued after preemption (then `attained_gpu_s` > 0)."""

    id: JobId
    vc: VcName
    user: UserName
    replicas: int
    gpus_per_replica: int
    submitted_at: float
    gpu_model: str = ANY_MODEL
    cpu_milli_per_replica: int = 0
    memory_mib_per_replica: int = 0
    time_limit_s: float | None = None
    priority: int = 0
    preemptible: bool = True
    estimated_runtime_s: float | None = None  # from history (same user / VC); never the truth
    attained_gpu_s: float = 0.0
    queued_at: float | None = None  # when it last became pending; None = submitted_at
    # A fractional job (one replica of one GPU) asks for this share of a GPU in thousandths,
    # 1-999, and this much GPU memory; 0 = whole GPUs. Fractional jobs share a GPU only with
    # fractional jobs of the same tenant, never with whole-GPU work.
    gpu_share_milli: int = 0
    gpu_memory_mib: int = 0
    # Time-slicing: the job may share GPUs by time with jobs of its VC; a suspended one waits
    # to resume on the GPUs it was suspended on (`suspended_on`).
    time_sliceable: bool = False
    suspended_on: tuple[ReplicaPlacement, ...] = ()
    # Once it has waited this long since it last queued, the job may start as `gpus` replicas
    # of one GPU each, CPU and memory divided among them (see `spread_waited_jobs`). For
    # programs that run one process per GPU anyway (torchrun, MPI), which would rather start
    # spread over nodes than wait on for whole ones. None = never.
    spread_after_s: float | None = None
    # GPUs were freed for this job: other jobs were preempted for it (the last cycle said
    # `waiting-for-preemption`). It is placed before the rest of the queue, so that the GPUs
    # freed for it are not taken by jobs that gave nothing up, which would leave it to preempt
    # again.
    first_in_line: bool = False
    # A migration moved it out of another job's way, which the core does only where it has room
    # to restart: it is placed right after the jobs first in line (the job it made room for
    # among them), so that it neither waits as well as moves nor lands in the freed block.
    moved: bool = False
    # Its owner moved it to the front of their own jobs of its VC and priority class at this
    # time (Slurm's `scontrol top`): it goes before those, the latest moved first, in the
    # places they held, so no one else's job stands further back. None = not moved.
    topped_at: float | None = None
    gpus: int = field(init=False, compare=False, repr=False)  # replicas x GPUs per replica

    def __post_init__(self) -> None:
        # Computed once, as RunningJob.gpus: a cycle asks for it several times per queued job.
        object.__setattr__(self, "gpus", self.replicas * self.gpus_per_replica)

    @property
    def waiting_since(self) -> float:
        return self.submitted_at if self.queued_at is None else self.queued_at


def left_parked(
    parked_on: tuple[ReplicaPlacement, ...], held: Iterable[tuple[str, int]]
) -> tuple[ReplicaPlacement, ...]:
    """The part of a suspended job's parked GPUs that no running job holds (`held` is their
    (node, GPU index) pairs). A suspended job told to leave checkpoints there, so until it is
    gone those GPUs are its own, as a stopping job's (other jobs of its tenant may share the
    rest by time, as they did while it was parked)."""
    taken = set(held)
    left = []
    for replica in parked_on:
        indices = tuple(i for i in replica.gpu_indices if (replica.node, i) not in taken)
        if indices:
            left.append(ReplicaPlacement(replica.node, indices))
    return tuple(left)


@dataclass(frozen=True, slots=True)
class Flavor:
    """A named per-replica resource bundle users may ask for. Only what-if hints use them: a
    hint that changes the GPU model or count proposes the flavor of that shape, with its CPU
    and memory, rather than an arbitrary request."""

    name: str
    gpu_model: str
    gpus: int
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class FinishedService:
    """Width and attained GPU-seconds of recently finished jobs, oldest first: the service
    distribution that history-based policies (the Gittins index, estimated ends) learn from.
    Its hash is computed once, so that the core can key what it derives from it on the
    object cheaply in every cycle that is handed the same history."""

    jobs: tuple[tuple[int, float], ...] = ()  # (GPUs, GPU-seconds)
    owners: tuple[tuple[str, str], ...] = ()  # (VC, user) of each of `jobs`, or empty if unknown
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.owners and len(self.owners) != len(self.jobs):
            raise ValueError("FinishedService: one owner per job, or none")
        object.__setattr__(self, "_hash", hash((self.jobs, self.owners)))

    def __hash__(self) -> int:
        return self._hash


NO_FINISHED_SERVICE = FinishedService()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle may look at. The core never mutates it."""

    nodes: tuple[Node, ...]
    vcs: tuple[VirtualCluster, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[PendingJob, ...]
    flavors: tuple[Flavor, ...] = ()
    finished: FinishedService = NO_FINISHED_SERVICE


class ReasonCode(StrEnum):
    """Why a pending job did not start this cycle. Stable strings: the portal stores them."""

    STARTED = "started"
    WAITING_FOR_PREEMPTION = "waiting-for-preemption"  # victims are releasing GPUs for it
    VC_QUOTA = "vc-quota"
    USER_LIMIT = "user-limit"
    UNKNOWN_VC = "unknown-vc"
    INSUFFICIENT_GPUS = "insufficient-gpus"
    FRAGMENTATION = "fragmentation"
    GANG_NODES = "gang-nodes"
    NODE_RESOURCES = "node-resources"  # GPUs free but CPU or memory short
    NO_MATCHING_GPU = "no-matching-gpu"  # no usable node has this model / this many GPUs
    HELD_FOR_RESERVATION = "held-for-reservation"
    QUEUED_BEHIND = "queued-behind"  # placement possible only by passing higher-ranked work
    VC_STOPPED = "vc-stopped"  # an admin stopped the VC: none of its jobs starts
    BUDGET_SPENT = "budget-spent"  # the VC's GPU-hour budget is spent: none of its jobs starts
    NOT_LENT = "not-lent"  # would borrow GPUs that VCs keep free for themselves (lending_limit)


@dataclass(frozen=True, slots=True)
class Start:
    """Start this job now on exactly these GPUs. `borrowed_gpus` of them exceed the VC's
    guarantee, so the job may be reclaimed by the owning VCs."""

    job_id: JobId
    placement: tuple[ReplicaPlacement, ...]
    borrowed_gpus: int = 0
    # For a fractional job: its share of the one GPU in thousandths and its GPU memory, for
    # the agent to enforce (MPS active-thread percentage, memory limit). 0 = whole GPUs.
    gpu_share_milli: int = 0
    gpu_memory_mib: int = 0
    resume: bool = False  # a suspended job resumes on the GPUs it was suspended on


@dataclass(frozen=True, slots=True)
class Suspend:
    """Time-slicing: suspend this running job (its GPUs go to `for_job`, of the same VC, at
    once); it waits as pending to resume on the same GPUs. `cost_s` is what the suspension and
    the later resume cost it (saving and restoring its state)."""

    job_id: JobId
    for_job: JobId
    message: str
    cost_s: float


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop this running job: signal it to checkpoint, stop it after `grace_period_s`, requeue."""

    job_id: JobId
    reason: str  # e.g. "priority", "reclaim", "las"
    message: str
    grace_period_s: float
    for_job: JobId  # the pending job the GPUs are freed for ("" when a node is drained)


class HintKind(StrEnum):
    """Which change to the request a what-if hint proposes. Stable strings: the portal stores them."""

    FEWER_GPUS = "fewer-gpus"  # the same shape with fewer GPUs per replica or fewer replicas
    SPREAD = "spread"  # the same GPUs as more, smaller replicas (drops the single-node need)
    GPU_MODEL = "gpu-model"  # another GPU model
    TIME_LIMIT = "time-limit"  # a time limit short enough to backfill before a reservation


@dataclass(frozen=True, slots=True)
class WhatIfHint:
    """A cheap change to a pending job's request and what it would buy: the changed shape in
    full (so a client can resubmit it as is) and when the job would start with it.
    `time_limit_s` is set only by a time-limit hint; other hints leave the limit as it was."""

    kind: HintKind
    message: str
    replicas: int
    gpus_per_replica: int
    gpu_model: str
    time_limit_s: float | None
    starts_now: bool
    estimated_start: float | None
    flavor: str = ""  # the snapshot's flavor of this shape, "" if none


@dataclass(frozen=True, slots=True)
class PendingStatus:
    job_id: JobId
    reason: ReasonCode
    message: str
    estimated_start: float | None  # None = cannot be estimated (e.g. wider than the cluster)
    hints: tuple[WhatIfHint, ...] = ()  # cheapest first; only changes that start it sooner


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision of one cycle. `pending` has one entry for every pending job that was not
    started; `wake_at` is the earliest time the policy wants another cycle even if nothing
    else happens (e.g. a running job crosses a LAS threshold)."""

    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    pending: tuple[PendingStatus, ...] = ()
    reservation: JobId | None = None
    wake_at: float | None = None
    suspends: tuple[Suspend, ...] = ()

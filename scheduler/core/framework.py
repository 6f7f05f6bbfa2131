"""Extension points of the scheduling cycle, one typing.Protocol each.

A plugin is any object that implements one or more of these protocols; the registry maps its
name to a factory and a profile decides at which points it runs. Contracts every plugin keeps:

1. Plugins never mutate the snapshot, the job, or the working state they are given. Only the
   cycle changes the working state, through a Statement.
2. Plugins are deterministic: the same inputs give the same answer (no clock, no randomness,
   no iteration over sets of strings).
3. Per-cycle scratch data lives in `CycleContext`, never in module globals, so two cycles (or
   two tests) cannot leak into each other. A plugin may keep per-cycle data on itself only
   inside `prepare`, which the cycle calls once before any other method.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from scheduler.core.state import ClusterState, GpuHold, NodeSlot
from scheduler.core.types import PendingJob, ReasonCode, RunningJob, Snapshot


class Code(Enum):
    SUCCESS = "success"
    UNSCHEDULABLE = "unschedulable"  # may fit later, or after preemption
    UNRESOLVABLE = "unresolvable"  # preemption cannot help (e.g. a quota or user limit)


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reason: ReasonCode | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS


SUCCESS = Status(Code.SUCCESS)


@dataclass(slots=True)
class CycleContext:
    """Read-mostly data shared by the plugins of one cycle."""

    snapshot: Snapshot
    now: float
    state: ClusterState
    running_by_id: dict[str, RunningJob]
    borrowed_gpus: dict[str, int]  # running job id -> GPUs above its VC's guarantee
    placing: PendingJob | None = None  # the job being placed while score plugins run
    # Each running job's quantile for its expected end (backfill.end_quantiles), made once per
    # cycle on first use: the estimator, the reservation and migration all ask for it.
    end_quantiles: dict[str, float] | None = None


@runtime_checkable
class QueueSortPlugin(Protocol):
    """Orders pending jobs. Keys of all queue-sort plugins in the profile are concatenated in
    profile order; the cycle appends (submitted_at, id) so the order is total. A plugin may
    also offer `sort_keys(jobs, ctx)`, the same keys for a whole list in one call, which the
    cycle then uses."""

    def prepare(self, ctx: CycleContext) -> None: ...

    def sort_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]: ...


@runtime_checkable
class AdmissionPlugin(Protocol):
    """May this job take its GPUs of `model` now, quota-wise? Returns UNSCHEDULABLE with a
    reason when not; never looks at where the GPUs are. Decides from the job's VC, user,
    width and priority (and, in a VC that caps its users' CPU or memory, the job's total CPU
    and memory) and the working state only: the cycle reuses an answer for jobs that agree on
    those until the state changes."""

    def admit(self, job: PendingJob, model: str, ctx: CycleContext) -> Status: ...


@runtime_checkable
class FilterPlugin(Protocol):
    """Can one replica of the job go on this node? Called only for nodes that already have
    enough free GPUs of the model, so it checks everything else (CPU, memory, topology).

    A filter or score plugin may declare `node_local = True`: its answer for a job's first
    replica depends only on the node's state (free GPUs, shares, CPU and memory), the model,
    the GPUs chosen and the replica's GPUs, CPU and memory, never on anything else about the
    job or the cluster. When every filter and score plugin of the profile says so, the cycle
    reuses a node's answer for a request of the same shape until that node changes (most of
    a long queue looks at the same few nodes)."""

    def filter(self, job: PendingJob, node: NodeSlot, model: str, ctx: CycleContext) -> Status: ...


@runtime_checkable
class GpuChooserPlugin(Protocol):
    """Picks which free GPUs of a node one replica gets. Returns None if it will not place the
    replica there (e.g. no aligned block when alignment is strict)."""

    def choose(self, free: set[int], node: NodeSlot, count: int) -> tuple[int, ...] | None: ...


@runtime_checkable
class ShareChooserPlugin(Protocol):
    """Picks the GPU for a fractional job among the candidates the cycle found (GPUs its
    tenant shares with room, and free GPUs). Returns None to leave the job waiting."""

    def choose_share(self, job: PendingJob, candidates: Sequence[Any], ctx: CycleContext) -> Any | None: ...


@runtime_checkable
class ScorePlugin(Protocol):
    """Scores a candidate replica placement in [0, 100]; higher is better. `placed` are the
    replicas of the same gang already reserved in this cycle."""

    def score(
        self, node: NodeSlot, model: str, gpus: tuple[int, ...], placed: list[GpuHold], ctx: CycleContext
    ) -> float: ...


@runtime_checkable
class PreemptionPlugin(Protocol):
    """May `preemptor` take the GPUs of `victim`? Returns a short reason name when yes. The
    cycle adds the rules that hold for every plugin: the victim is preemptible, has run its
    minimum runtime, and belongs to the same VC or is borrowing."""

    def may_preempt(self, preemptor: PendingJob, victim: RunningJob, ctx: CycleContext) -> str | None: ...


@runtime_checkable
class PostCyclePlugin(Protocol):
    """Runs after placement. Returns the earliest time it wants another cycle, or None."""

    def wake_at(self, ctx: CycleContext) -> float | None: ...


@runtime_checkable
class RotationPlugin(Protocol):
    """Optional companion of a post-cycle plugin: time-slicing. Proposes pairs (running job
    to suspend, waiting job that gets its GPUs at once), one at a time; the cycle applies a
    swap it can make (quota, CPU and memory allow it) and adds the running job to `released`,
    so a proposal the cycle turned down lets the plugin offer the waiting job another one."""

    suspend_cost_s: float

    def rotate(
        self, waiting: Sequence[PendingJob], released: set[str], ctx: CycleContext
    ) -> Iterator[tuple[RunningJob, PendingJob]]: ...


@runtime_checkable
class BackfillPlugin(Protocol):
    """Reserves capacity for the first blocked job and lets later jobs start only if they do
    not delay it. `reserve` returns an opaque reservation the cycle hands back to `allows`."""

    def reserve(
        self, job: PendingJob, model: str, ctx: CycleContext, holds: Mapping[str, list[GpuHold]]
    ) -> Any: ...

    def allows(self, job: PendingJob, model: str, reservation: Any, ctx: CycleContext) -> bool: ...


@runtime_checkable
class PreemptionHorizonPlugin(Protocol):
    """Optional companion of a preemption plugin, used only for estimated starts: from when on
    would `job` be allowed to preempt `victim` (None = never)? Jobs with the same
    `horizon_key` get the same answers, which lets the estimator share one forward pass.
    A plugin may also offer `horizon_keys(jobs, ctx)`, the keys of a whole list in one call,
    and `yields_at_all(job, victims, ctx)`, the answers for a whole list of victims."""

    def horizon_key(self, job: PendingJob, ctx: CycleContext) -> tuple[float, ...]: ...

    def yields_at(self, job: PendingJob, victim: RunningJob, ctx: CycleContext) -> float | None: ...

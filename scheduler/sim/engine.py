"""Discrete-event trace replay around the pure core.

The simulator plays the portal's part: it keeps the cluster state, builds a Snapshot whenever
something changes, calls `decide`, and applies the Plan the way the portal would (start jobs
on the exact GPUs given, stop preempted jobs after the grace period and requeue them). The
only thing it knows that a portal does not is each job's true duration, which it uses to end
jobs and never shows to the scheduler: runtime estimates come from `RuntimeHistory`, built from
jobs that already finished.

Preemption cost model (`preempt_overhead_s`): a preempted job keeps its GPUs, making no
progress, for that many seconds while it checkpoints, then requeues with its progress kept.
With 0 preemption is free, as in the Tiresias simulator.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

from scheduler.core import (
    JobId,
    Node,
    PendingJob,
    Plan,
    Profile,
    Quota,
    ReasonCode,
    ReplicaPlacement,
    RunningJob,
    Snapshot,
    UserName,
    VcName,
    VirtualCluster,
    decide,
    left_parked,
)
from scheduler.core.plugins.defrag import Defragment
from scheduler.core.service_history import FinishedHistory
from scheduler.sim.trace import TraceJob

# Cycles at one instant: a free preemption (`--preempt-overhead 0`) requeues its victims at
# once, and its preemptor starts in the next cycle of the same instant, as preemption without
# cost means. A bound, so that no policy can loop for ever; free preemptions at one instant end
# long before it. (It was 4, and a fourth cycle that still preempted left the victims' GPUs idle
# until the next event: 8 of 1,482 preemptors on ITP cluster06 waited up to some 2,000 s.)
MAX_CYCLES_PER_INSTANT = 50


class _Event(IntEnum):
    # Order within one timestamp: releases and finishes free GPUs before arrivals queue.
    FINISH = 0
    RELEASE = 1
    SUBMIT = 2
    WAKE = 3


class RuntimeHistory:
    """History-based runtime estimates: the median of the most recent finished jobs with the
    same (VC, user, GPUs), falling back to (VC, GPUs), (GPUs) and then all jobs."""

    def __init__(self, window: int = 50, min_samples: int = 3) -> None:
        self.window = window
        self.min_samples = min_samples
        self._samples: dict[tuple[str, ...], deque[float]] = {}

    @staticmethod
    def _keys(vc: str, user: str, gpus: int) -> list[tuple[str, ...]]:
        return [("u", vc, user, str(gpus)), ("v", vc, str(gpus)), ("g", str(gpus)), ("all",)]

    def record(self, vc: str, user: str, gpus: int, duration: float) -> None:
        for key in self._keys(vc, user, gpus):
            samples = self._samples.get(key)
            if samples is None:
                samples = self._samples[key] = deque(maxlen=self.window)
            samples.append(duration)

    def estimate(self, vc: str, user: str, gpus: int) -> float | None:
        for key in self._keys(vc, user, gpus):
            samples = self._samples.get(key)
            if samples is not None and len(samples) >= self.min_samples:
                return float(statistics.median(samples))
        return None


@dataclass(slots=True)
class SimJob:
    trace: TraceJob
    replicas: int
    gpus_per_replica: int
    remaining: float
    estimate: float | None = None
    attained_gpu_s: float = 0.0
    attempt: int = 0
    running_since: float | None = None  # start of the current attempt
    first_start: float | None = None
    finished_at: float | None = None
    queued_at: float = 0.0
    placement: tuple[ReplicaPlacement, ...] = ()
    stopping: bool = False
    preemptions: int = 0
    estimated_start: float | None = None  # at submission
    baseline_start: float | None = None  # sum of runtime bounds of the jobs ahead, at submission
    pending_view: PendingJob | None = None
    suspended_on: tuple[ReplicaPlacement, ...] = ()  # time-slicing: waits to resume there
    suspensions: int = 0
    parked: bool = False  # checkpointing on GPUs it was parked on (RunningJob.parked)
    first_in_line: bool = False  # GPUs were freed for it (PendingJob.first_in_line)
    moved: bool = False  # requeued after a migration (PendingJob.moved)

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(slots=True)
class SimResult:
    jobs: list[SimJob]
    dropped: list[TraceJob]
    preemptions: int
    busy_gpu_s_while_waiting: float
    capacity_gpu_s_while_waiting: float
    cycles: int
    capacity: int
    guarantees: dict[str, int] | None = None  # VC -> guaranteed GPUs, when quotas were given
    node_gpus: int = 0  # GPUs of the widest node: jobs at least this wide are gangs
    preemptions_by_reason: dict[str, int] = field(default_factory=dict)
    # GPU-seconds preemption cost: the overhead each preempted job spends checkpointing on its
    # GPUs, making no progress (progress itself is kept, as the model assumes checkpoints).
    preemption_lost_gpu_s: float = 0.0


def gang_shape(gpus: int, node_gpus: int) -> tuple[int, int]:
    """Replicas x GPUs per replica for a job of `gpus` GPUs on nodes of `node_gpus`: one
    replica if it fits a node, else the widest per-node share that divides it evenly."""
    if gpus <= node_gpus:
        return 1, gpus
    per = max(d for d in range(1, node_gpus + 1) if gpus % d == 0)
    return gpus // per, per


# A VC's row of a quota file: (guaranteed, borrow limit) or with its lending limit as well.
VcQuotaRow = tuple[int, int] | tuple[int, int, int | None]


def build_vcs(
    trace_vcs: Sequence[str], quotas: Mapping[str, VcQuotaRow] | None, capacity: int
) -> tuple[VirtualCluster, ...]:
    """VCs for the snapshot. Without a quota file the VCs share one pool: none has a
    guarantee and each may borrow up to the whole cluster, so a job may preempt (by priority
    or LAS) the work of any VC, as in a cluster without quotas. (Giving every VC the whole
    cluster as its guarantee instead would promise the same GPUs to every VC at once, and the
    core never takes a VC's guaranteed GPUs for another VC's job: no job could preempt across
    VCs.) With a quota file, VCs it does not list have no guarantee and may only borrow (up
    to the cluster). A row's lending limit, when given, is what the VC lends of its guarantee."""
    names = sorted(set(trace_vcs) | set(quotas or {}))
    vcs = []
    for name in names:
        row: VcQuotaRow = (0, capacity) if quotas is None else quotas.get(name, (0, capacity))
        guaranteed, borrow, *lending = row
        lend = lending[0] if lending else None
        vcs.append(VirtualCluster(VcName(name), (Quota("*", guaranteed, borrow, lend),)))
    return tuple(vcs)


class Simulator:
    def __init__(
        self,
        nodes: tuple[Node, ...],
        profile: Profile,
        jobs: Sequence[TraceJob],
        vc_quotas: Mapping[str, VcQuotaRow] | None = None,
        preempt_overhead_s: float = 0.0,
        time_limit_s: float | None = None,
        spread_after_s: float | None = None,
    ) -> None:
        self.nodes = nodes
        # Nobody reads what-if hints in a replay; they would only cost time.
        self.profile = replace(
            profile, cycle=replace(profile.cycle, grace_period_s=preempt_overhead_s, whatif_max_jobs=0)
        )
        # Estimated starts are read only at submission, so cycles without arrivals skip them.
        self.quiet_profile = replace(self.profile, cycle=replace(self.profile.cycle, estimate_starts=False))
        self.guarantees = {vc: row[0] for vc, row in vc_quotas.items()} if vc_quotas is not None else None
        self.overhead = preempt_overhead_s
        self.time_limit_s = time_limit_s
        # Locality relaxed after waiting (as Philly's scheduler did, Jeon et al., ATC'19): every
        # job of several GPUs per replica gets this `spread_after_s`, so the core may start it
        # as that many 1-GPU replicas once it has waited this long since it last queued.
        # None: topology always required. The replay charges a spread job no slowdown
        # (optimistic, as the peer).
        self.spread_after_s = spread_after_s
        self.capacity = sum(len(n.gpus) for n in nodes)
        self.node_gpus = max(len(n.gpus) for n in nodes)
        self.vcs = build_vcs([j.vc for j in jobs], vc_quotas, self.capacity)
        self.history = RuntimeHistory()
        # The service distribution the core learns from (Gittins index, estimated ends).
        self.finished = FinishedHistory()
        self.trace = list(jobs)
        # With the time-slicing plugin in the profile every job opts in (the traces say nothing).
        self.time_sliceable = "timeslice" in profile.post_cycle

    def run(self) -> SimResult:
        events: list[tuple[float, int, int, str, int]] = []  # (time, kind, seq, job id, attempt)
        seq = 0

        def push(at: float, kind: _Event, job_id: str = "", attempt: int = 0) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(events, (at, int(kind), seq, job_id, attempt))

        jobs: dict[str, SimJob] = {}
        dropped: list[TraceJob] = []
        for trace_job in self.trace:
            replicas, per = gang_shape(trace_job.gpus, self.node_gpus)
            if trace_job.gpus > self.capacity or per > self.node_gpus:
                dropped.append(trace_job)
                continue
            jobs[trace_job.id] = SimJob(trace_job, replicas, per, remaining=trace_job.duration)
            push(trace_job.submit, _Event.SUBMIT, trace_job.id)

        pending: dict[str, SimJob] = {}  # insertion order = queue arrival, for determinism
        running: dict[str, SimJob] = {}
        busy = 0
        busy_waiting = cap_waiting = 0.0
        preemptions = cycles = 0
        by_reason: dict[str, int] = {}
        lost_gpu_s = 0.0
        last_t: float | None = None
        scheduled_wake: float | None = None

        while events:
            t = events[0][0]
            if last_t is not None and pending:
                dt = t - last_t
                busy_waiting += busy * dt
                cap_waiting += self.capacity * dt
            last_t = t
            submitted: list[SimJob] = []
            while events and events[0][0] == t:
                _, kind, _, job_id, attempt = heapq.heappop(events)
                if kind == _Event.SUBMIT:
                    job = jobs[job_id]
                    job.queued_at = t
                    job.estimate = self.history.estimate(job.trace.vc, job.trace.user, job.gpus)
                    pending[job_id] = job
                    submitted.append(job)
                elif kind == _Event.FINISH:
                    job = jobs[job_id]
                    if job.attempt != attempt or job_id not in running:
                        continue
                    self._advance(job, t)
                    job.finished_at = t
                    busy -= job.gpus
                    del running[job_id]
                    self.history.record(job.trace.vc, job.trace.user, job.gpus, job.trace.duration)
                    self.finished.record(job.gpus, job.attained_gpu_s, job.trace.vc, job.trace.user)
                elif kind == _Event.RELEASE:
                    job = jobs[job_id]
                    if job.attempt != attempt or job_id not in running:
                        continue
                    busy -= job.gpus
                    del running[job_id]
                    self._requeue(job, t)
                    pending[job_id] = job
                elif kind == _Event.WAKE and scheduled_wake == t:
                    scheduled_wake = None

            for _ in range(MAX_CYCLES_PER_INSTANT):  # more only after free preemptions
                cycles += 1
                profile = self.profile if submitted else self.quiet_profile
                plan = decide(self._snapshot(t, running, pending), profile, t)
                if submitted:
                    self._record_estimates(plan, submitted, pending, t)
                    submitted = []
                for start in plan.starts:
                    job = pending.pop(start.job_id)
                    job.attempt += 1
                    job.placement = start.placement
                    job.running_since = t
                    job.pending_view = None
                    job.suspended_on = ()
                    job.first_in_line = job.moved = False
                    if job.first_start is None:
                        job.first_start = t
                    running[start.job_id] = job
                    busy += job.gpus
                    push(t + job.remaining, _Event.FINISH, start.job_id, job.attempt)
                for status in plan.pending:
                    # As the portal does: a job the plan told to wait for its victims goes
                    # first in the next cycle, any other reason ends that.
                    job = pending[status.job_id]
                    first = status.reason is ReasonCode.WAITING_FOR_PREEMPTION
                    if job.first_in_line is not first or job.moved:
                        job.first_in_line, job.moved = first, False
                        job.pending_view = None
                for suspend in plan.suspends:
                    # Its GPUs went to the job started above; it keeps its progress and pays
                    # the cost of saving and restoring its state when it resumes.
                    job = running.pop(suspend.job_id)
                    self._advance(job, t)
                    busy -= job.gpus
                    job.attempt += 1  # invalidates the pending FINISH event
                    job.suspensions += 1
                    job.remaining += suspend.cost_s
                    lost_gpu_s += suspend.cost_s * job.gpus
                    by_reason["timeslice"] = by_reason.get("timeslice", 0) + 1
                    placement = job.placement
                    self._requeue(job, t)
                    job.suspended_on = placement
                    pending[suspend.job_id] = job
                immediate = False
                for preemption in plan.preemptions:
                    if preemption.job_id in pending:
                        # A suspended job told to leave the GPUs it is parked on (for another
                        # tenant's job, or because it cannot resume there): it checkpoints on
                        # those no running job holds, holding them meanwhile as in the portal,
                        # then queues again.
                        job = pending[preemption.job_id]
                        held = [
                            (r.node, i) for j in running.values() for r in j.placement for i in r.gpu_indices
                        ]
                        left = left_parked(job.suspended_on, held)
                        job.suspended_on = ()
                        job.preemptions += 1
                        preemptions += 1
                        by_reason[preemption.reason] = by_reason.get(preemption.reason, 0) + 1
                        lost_gpu_s += self.overhead * job.gpus
                        if not left or self.overhead <= 0:
                            self._requeue(job, t)  # nothing to hold: its own VC's jobs are there
                            immediate = True
                            continue
                        del pending[preemption.job_id]
                        job.placement, job.parked, job.stopping = left, True, True
                        running[preemption.job_id] = job
                        busy += job.gpus
                        push(t + self.overhead, _Event.RELEASE, preemption.job_id, job.attempt)
                        continue
                    job = running[preemption.job_id]
                    self._advance(job, t)
                    job.stopping = True
                    # A moved job restarts right after the jobs first in line (as in the portal).
                    job.first_in_line = False
                    job.moved = preemption.reason == Defragment.name
                    job.preemptions += 1
                    preemptions += 1
                    by_reason[preemption.reason] = by_reason.get(preemption.reason, 0) + 1
                    lost_gpu_s += self.overhead * job.gpus
                    job.attempt += 1  # invalidates the pending FINISH event
                    if self.overhead <= 0:
                        busy -= job.gpus
                        del running[preemption.job_id]
                        self._requeue(job, t)
                        pending[preemption.job_id] = job
                        immediate = True
                    else:
                        push(t + self.overhead, _Event.RELEASE, preemption.job_id, job.attempt)
                if plan.wake_at is not None and (scheduled_wake is None or plan.wake_at < scheduled_wake):
                    scheduled_wake = plan.wake_at
                    push(plan.wake_at, _Event.WAKE)
                if not immediate:
                    break

        return SimResult(
            jobs=list(jobs.values()),
            dropped=dropped,
            preemptions=preemptions,
            busy_gpu_s_while_waiting=busy_waiting,
            capacity_gpu_s_while_waiting=cap_waiting,
            cycles=cycles,
            node_gpus=self.node_gpus,
            preemptions_by_reason=dict(sorted(by_reason.items())),
            preemption_lost_gpu_s=lost_gpu_s,
            capacity=self.capacity,
            guarantees=self.guarantees,
        )

    # -- state helpers -------------------------------------------------------------------

    @staticmethod
    def _advance(job: SimJob, t: float) -> None:
        """Account the progress of the current attempt up to `t`."""
        if job.running_since is None or job.stopping:
            return
        ran = t - job.running_since
        job.remaining = max(job.remaining - ran, 0.0)
        job.attained_gpu_s += ran * job.gpus
        job.running_since = t

    @staticmethod
    def _requeue(job: SimJob, t: float) -> None:
        job.stopping = job.parked = False
        job.running_since = None
        job.placement = ()
        job.queued_at = t
        job.pending_view = None

    def _snapshot(self, t: float, running: Mapping[str, SimJob], pending: Mapping[str, SimJob]) -> Snapshot:
        running_view = []
        for job_id, job in running.items():
            attained = job.attained_gpu_s
            if job.running_since is not None and not job.stopping:
                attained += (t - job.running_since) * job.gpus
            running_view.append(
                RunningJob(
                    id=JobId(job_id),
                    vc=VcName(job.trace.vc),
                    user=UserName(job.trace.user),
                    placement=job.placement,
                    started_at=job.running_since if job.running_since is not None else t,
                    attained_gpu_s=attained,
                    estimated_runtime_s=job.estimate,
                    time_limit_s=self.time_limit_s,
                    submitted_at=job.trace.submit,
                    stopping=job.stopping,
                    parked=job.parked,
                    time_sliceable=self.time_sliceable,
                )
            )
        pending_view = []
        spread_after = self.spread_after_s
        for job_id, job in pending.items():
            if job.pending_view is None:
                job.pending_view = PendingJob(
                    id=JobId(job_id),
                    vc=VcName(job.trace.vc),
                    user=UserName(job.trace.user),
                    replicas=job.replicas,
                    gpus_per_replica=job.gpus_per_replica,
                    submitted_at=job.trace.submit,
                    time_limit_s=self.time_limit_s,
                    estimated_runtime_s=job.estimate,
                    attained_gpu_s=job.attained_gpu_s,
                    queued_at=job.queued_at,
                    time_sliceable=self.time_sliceable,
                    suspended_on=job.suspended_on,
                    spread_after_s=spread_after if job.gpus_per_replica > 1 else None,
                    first_in_line=job.first_in_line,
                    moved=job.moved,
                )
            pending_view.append(job.pending_view)
        return Snapshot(
            self.nodes, self.vcs, tuple(running_view), tuple(pending_view), finished=self.finished.service
        )

    def _record_estimates(
        self, plan: Plan, submitted: list[SimJob], pending: Mapping[str, SimJob], t: float
    ) -> None:
        """Keep each new job's estimated start as shown at submission, and the baseline
        (the runtime bounds of the jobs ahead in the queue, summed over the cluster)."""
        started = {s.job_id for s in plan.starts}
        wanted = {job.trace.id for job in submitted}
        ahead_gpu_s = 0.0
        baseline: dict[str, float] = {}
        estimated: dict[str, float | None] = {}
        for status in plan.pending:
            if status.job_id in wanted:
                baseline[status.job_id] = t + ahead_gpu_s / self.capacity
                estimated[status.job_id] = status.estimated_start
            job = pending.get(status.job_id)
            if job is not None:
                bound = self.time_limit_s if self.time_limit_s is not None else job.estimate
                ahead_gpu_s += (
                    bound if bound is not None else self.profile.cycle.default_runtime_s
                ) * job.gpus
        for job in submitted:
            if job.trace.id in started:
                job.estimated_start = t
                job.baseline_start = t
            else:
                job.estimated_start = estimated.get(job.trace.id)
                job.baseline_start = baseline.get(job.trace.id)

"""The scheduling core's bridge to PostgreSQL: rows in as a Snapshot, a Plan applied in the same
transaction. Every job moves by compare-and-set and the database constraint on live allocations
guards every GPU, so a plan computed from a stale view can lose a race but never double-book.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max, Q, Window
from django.db.models.functions import RowNumber

from agents.protocol import CheckpointRequest, StopRequest, encode
from portal.agentgw.desired import agent_attempt_id
from portal.agentgw.outbox import desired_set_changed, send_request
from portal.cluster import budgets
from portal.cluster.choices import NodeState
from portal.cluster.models import Flavor, Gpu, Node, Quota, VirtualCluster
from portal.jobs.accounting import run_seconds
from portal.jobs.choices import (
    ACTIVE_STATES,
    PENDING_MOVED,
    PENDING_REQUEUED,
    TERMINAL_STATES,
    AttemptState,
    JobState,
)
from portal.jobs.models import Allocation, Checkpoint, Job, JobAttempt
from portal.jobs.services import (
    REQUEUED_AFTER,
    end_attempt,
    report_failed_checkpoint,
    requeue_job,
    transition_job,
    transition_jobs,
)
from scheduler import core
from scheduler.core.service_history import FINISHED_LOOKBACK, FINISHED_PER_WIDTH

logger = logging.getLogger(__name__)


def epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def from_epoch(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, tz=UTC) if value is not None else None


@dataclass
class LoadedState:
    """The snapshot plus what apply_plan needs to recognise what it decided on."""

    snapshot: core.Snapshot
    versions: dict[str, int]  # job id -> version seen
    gpu_ids: dict[tuple[str, int], int]  # (node name, gpu index) -> Gpu pk
    node_ids: dict[str, int]


def load_snapshot(now: float, held: Collection[int] = ()) -> LoadedState:
    nodes, gpu_ids, node_ids = [], {}, {}
    gpus_by_node: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in Gpu.objects.order_by("node_id", "index"):
        gpus_by_node[gpu.node_id].append(gpu)
    for node in Node.objects.order_by("name"):
        node_ids[node.name] = node.pk
        for gpu in gpus_by_node[node.pk]:
            gpu_ids[(node.name, gpu.index)] = gpu.pk
        nodes.append(
            core.Node(
                name=core.NodeName(node.name),
                rack=node.rack,
                state=core.NodeState(node.state),
                cpu_milli=node.cpu * 1000,
                memory_mib=node.memory_gb * 1024,
                gpus=tuple(
                    core.Gpu(
                        index=g.index,
                        model=g.model,
                        uuid=g.uuid,
                        memory_mib=g.memory_mb,
                        nvlink_group=g.nvlink_group,
                        pcie_switch=g.pcie_switch,
                        numa_node=g.numa_node,
                        healthy=g.healthy,
                    )
                    for g in gpus_by_node[node.pk]
                ),
            )
        )
    quotas: dict[int, list[core.Quota]] = defaultdict(list)
    for quota in Quota.objects.all():
        quotas[quota.virtual_cluster_id].append(
            core.Quota(
                quota.gpu_model, quota.guaranteed, quota.borrow_limit, lending_limit=quota.lending_limit
            )
        )
    vc_rows = list(VirtualCluster.objects.select_related("tenant").order_by("name"))
    now_at = datetime.fromtimestamp(now, tz=UTC)
    budgeted = [vc for vc in vc_rows if vc.gpu_hours_per_month is not None]
    budget_hours = budgets.gpu_hours_this_month(budgeted, now_at) if budgeted else {}
    vcs = tuple(
        core.VirtualCluster(
            name=core.VcName(vc.name),
            tenant=vc.tenant.name,
            quotas=tuple(quotas[vc.pk]),
            queueing_policy=vc.queueing_policy,
            max_gpus_per_user=vc.max_gpus_per_user,
            # In the core's units, as the jobs' requests are converted (core_fields).
            max_cpu_milli_per_user=None if vc.max_cpus_per_user is None else vc.max_cpus_per_user * 1000,
            max_memory_mib_per_user=(
                None if vc.max_memory_gb_per_user is None else vc.max_memory_gb_per_user * 1024
            ),
            stop_policy=vc.stop_policy,
            budget_message=budgets.spent_message(vc, budget_hours.get(vc.pk, 0.0), now_at),
        )
        for vc in vc_rows
    )
    # A job waiting out a retry backoff is not offered to the core until its time has come.
    retry_later = Q(state=JobState.PENDING, not_before__gt=from_epoch(now))
    jobs = list(
        Job.objects.filter(Q(state__in=ACTIVE_STATES) | Q(state=JobState.PENDING))
        .exclude(retry_later)
        .exclude(pk__in=held)  # waiting for the jobs they depend on (settle_dependencies)
        .exclude(state=JobState.PENDING, on_hold=True)
        .select_related("virtual_cluster", "owner")
        .annotate(last_checkpoint=Max("checkpoints__written_at"))
    )
    # A suspended (time-sliced) job's allocations say where it waits to resume; they are not
    # a hold on the GPUs, which another job of its VC uses meanwhile.
    placements: dict[int, dict[int, tuple[str, list[int]]]] = defaultdict(dict)
    suspended_on: dict[int, dict[int, tuple[str, list[int]]]] = defaultdict(dict)
    started: dict[int, float] = {}
    current_attempt: dict[int, int] = {}
    slice_started: dict[int, float] = {}
    live = Allocation.objects.filter(
        released_at__isnull=True, attempt__job__in=[j.pk for j in jobs]
    ).select_related("node", "gpu", "attempt")
    for allocation in live.order_by("replica", "gpu__index"):
        job_id = allocation.attempt.job_id
        held = suspended_on if allocation.suspended else placements
        replica = held[job_id].setdefault(allocation.replica, (allocation.node.name, []))
        replica[1].append(allocation.gpu.index)
        started[job_id] = allocation.attempt.created_at.timestamp()
        current_attempt[job_id] = allocation.attempt_id
        if allocation.attempt.resumed_at is not None:
            slice_started[job_id] = allocation.attempt.resumed_at.timestamp()
    earlier = earlier_service(jobs)
    # The current attempt's service: its run so far, the time it spent suspended left out (a
    # time-sliced job that waited for its turn did not run, and the simulator counts only runs).
    current_run = run_seconds(current_attempt.values(), now_at)

    def attained_gpu_s(job: Job) -> float:
        run = current_run.get(current_attempt.get(job.pk, 0), 0.0)
        return earlier.get(job.pk, 0.0) + job.total_gpus * run

    running, pending = [], []
    held: set[tuple[str, int]] | None = None  # GPUs of running jobs, worked out when needed
    for job in jobs:
        if job.state == JobState.PENDING:
            pending.append(queued_job(job, earlier.get(job.pk, 0.0)))
            continue
        common = core_fields(job)
        if job.state == JobState.SUSPENDED:
            pending.append(
                core.PendingJob(
                    replicas=job.replicas,
                    gpus_per_replica=job.gpus_per_replica,
                    suspended_on=placement_of(suspended_on[job.pk]),
                    attained_gpu_s=attained_gpu_s(job),
                    **common,
                )
            )
        elif job.pk in suspended_on and job.pk not in placements:
            # Told to leave the GPUs it was parked on: it checkpoints or stops on them, so
            # until it is gone they are its own, but not its VC's quota.
            if held is None:
                held = {
                    (node, i)
                    for by_replica in placements.values()
                    for node, gpus in by_replica.values()
                    for i in gpus
                }
            left = core.left_parked(placement_of(suspended_on[job.pk]), held)
            if left:
                common["cpu_milli_per_replica"] = common["memory_mib_per_replica"] = 0
                running.append(
                    core.RunningJob(
                        placement=left,
                        started_at=started[job.pk],
                        stopping=True,
                        parked=True,
                        **common,
                    )
                )
        elif job.pk in placements:
            if len(placements[job.pk]) != job.replicas:  # spread over one-GPU replicas
                cpu_milli, memory_mib = job.resources_per_replica(len(placements[job.pk]))
                common["cpu_milli_per_replica"], common["memory_mib_per_replica"] = cpu_milli, memory_mib
            running.append(
                core.RunningJob(
                    placement=placement_of(placements[job.pk]),
                    started_at=started[job.pk],
                    attained_gpu_s=attained_gpu_s(job),
                    last_checkpoint_at=epoch(job.last_checkpoint),
                    checkpointable=bool((job.spec.get("checkpoint") or {}).get("enabled")),
                    # Told to stop already: preempted, or at its time limit (stop_reason), so a
                    # second preemption in its grace window would only stop it twice.
                    stopping=job.state == JobState.CHECKPOINTING or bool(job.stop_reason),
                    slice_started_at=slice_started.get(job.pk),
                    **common,
                )
            )
    flavors = tuple(
        core.Flavor(f.name, f.gpu_model, f.gpus, f.cpu * 1000, f.memory_gb * 1024)
        for f in Flavor.objects.all()
    )
    snapshot = core.Snapshot(
        nodes=tuple(nodes),
        vcs=vcs,
        running=tuple(running),
        pending=tuple(pending),
        flavors=flavors,
        finished=finished_service(),
    )
    return LoadedState(snapshot, {str(j.pk): j.version for j in jobs}, gpu_ids, node_ids)


def core_fields(job: Job) -> dict[str, Any]:
    """What the core reads of every job, waiting or holding GPUs."""
    return {
        "id": core.JobId(str(job.pk)),
        "vc": core.VcName(job.virtual_cluster.name),
        "user": core.UserName(job.owner.username),
        "gpu_model": job.gpu_model,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "time_limit_s": float(job.time_limit_s),
        "cpu_milli_per_replica": job.cpu_per_replica * 1000,
        "memory_mib_per_replica": job.memory_gb_per_replica * 1024,
        "submitted_at": job.submitted_at.timestamp(),
        "time_sliceable": bool(job.spec.get("time_sliceable")),
    }


def queued_job(job: Job, attained_gpu_s: float = 0.0) -> core.PendingJob:
    """A pending job as the core sees it. One place for it, so that a dry run's unsaved job
    (scheduler.dry_run) enters the queue exactly as the stored job would. `attained_gpu_s`:
    the service of its earlier attempts (earlier_service)."""
    return core.PendingJob(
        replicas=job.replicas,
        gpus_per_replica=job.gpus_per_replica,
        attained_gpu_s=attained_gpu_s,
        spread_after_s=job.spec.get("spread_after"),
        # The last cycle preempted jobs for it, or a migration moved it.
        first_in_line=job.pending_reason == core.ReasonCode.WAITING_FOR_PREEMPTION,
        moved=job.pending_reason == PENDING_MOVED,
        topped_at=epoch(job.topped_at),
        **core_fields(job),
    )


def earlier_service(jobs: list[Job]) -> dict[int, float]:
    """GPU-seconds each job ran in its ended attempts: run time (suspensions left out,
    portal.jobs.accounting.run_seconds) times the job's GPUs, as finished_service counts it. A
    requeued job keeps its attained service (the core's contract, and what the simulator does):
    counted from its current attempt only, a preempted job came back as new, ranked first by LAS
    and the Gittins index, and preempted its preemptor back."""
    gpus = {job.pk: job.total_gpus for job in jobs}
    return ended_attempts_gpu_s(gpus)


def ended_attempts_gpu_s(gpus: dict[int, int]) -> dict[int, float]:
    """Per job of `gpus` (job id -> its GPUs), the run time of its ended attempts that started
    times its GPUs; jobs without one are left out."""
    attempts = dict(
        JobAttempt.objects.filter(
            job_id__in=list(gpus), started_at__isnull=False, ended_at__isnull=False
        ).values_list("pk", "job_id")
    )
    service: dict[int, float] = defaultdict(float)
    for attempt_id, seconds in run_seconds(attempts).items():
        service[attempts[attempt_id]] += gpus[attempts[attempt_id]] * seconds
    return dict(service)


def finished_service() -> core.FinishedService:
    """Width, GPU-seconds, VC and owner of the most recently ended jobs of each width
    (`FINISHED_PER_WIDTH` of each among the last `FINISHED_LOOKBACK`, see service_history),
    oldest first. Service is the run time of all their attempts (suspensions left out) times the
    job's GPUs."""
    ended = Job.objects.filter(state__in=TERMINAL_STATES, finished_at__isnull=False)
    lookback = ended.order_by("-finished_at", "-pk").values("pk")[:FINISHED_LOOKBACK]
    recent = list(
        ended.filter(pk__in=lookback)
        .annotate(width=F("replicas") * F("gpus_per_replica"))
        .annotate(
            recency=Window(
                RowNumber(), partition_by=[F("width")], order_by=[F("finished_at").desc(), F("pk").desc()]
            )
        )
        .filter(recency__lte=FINISHED_PER_WIDTH)
        .order_by("-finished_at", "-pk")
        .values_list("pk", "replicas", "gpus_per_replica", "virtual_cluster__name", "owner__username")
    )
    widths = {pk: replicas * gpus_per_replica for pk, replicas, gpus_per_replica, *_ in recent}
    service = ended_attempts_gpu_s(widths)
    jobs, owners = [], []
    for pk, replicas, gpus_per_replica, vc, username in reversed(recent):
        if service.get(pk, 0.0) > 0:
            jobs.append((replicas * gpus_per_replica, service[pk]))
            owners.append((vc, username))
    return core.FinishedService(tuple(jobs), tuple(owners))


def placement_of(replicas: dict[int, tuple[str, list[int]]]) -> tuple[core.ReplicaPlacement, ...]:
    return tuple(
        core.ReplicaPlacement(core.NodeName(node), tuple(indices))
        for _, (node, indices) in sorted(replicas.items())
    )


def apply_plan(plan: core.Plan, loaded: LoadedState, now: float) -> dict[str, int]:
    """Writes the plan. Must run inside the cycle's transaction; returns what it did."""
    # Only the jobs the plan moves: every move is a compare-and-set on the version seen, so the
    # thousands of jobs left pending need neither a row lock nor a second read.
    moving = (
        {int(s.job_id) for s in plan.starts}
        | {int(p.job_id) for p in plan.preemptions}
        | {int(s.job_id) for s in plan.suspends}
    )
    jobs = Job.objects.select_for_update().order_by("pk").in_bulk(moving)  # the order others lock in

    def unchanged(job_id: core.JobId, state: str) -> Job | None:
        job = jobs.get(int(job_id))
        if job is None or job.version != loaded.versions[job_id] or job.state != state:
            return None
        return job

    candidates, resumes = [], []
    for start in plan.starts:
        if job := unchanged(start.job_id, JobState.PENDING):
            candidates.append((job, start))
        elif job := unchanged(start.job_id, JobState.SUSPENDED):
            resumes.append((job, start))
    placeable = still_placeable(candidates, loaded)
    dropped = {start.job_id for _, start in candidates} - {start.job_id for _, start in placeable}
    # Time-slicing next: a suspended job leaves its GPUs to the job that takes its turn. A job
    # whose turn-taker cannot start here (its node or GPU changed since the snapshot) keeps
    # running; when a suspension cannot be made (the job moved on meanwhile), that turn is not
    # taken.
    suspended, no_turn = 0, set()
    for suspend in plan.suspends:
        if suspend.for_job in dropped:
            continue
        job = unchanged(suspend.job_id, JobState.RUNNING)
        if job is not None and suspend_job(job, suspend):
            suspended += 1
        else:
            no_turn.add(suspend.for_job)
    starts = [(job, start) for job, start in placeable if start.job_id not in no_turn]
    resumes = [(job, start) for job, start in resumes if start.job_id not in no_turn]
    started = start_jobs(starts, loaded)
    resumed = sum(resume_job(job, start, now) for job, start in resumes)
    preempted = 0
    # A victim's events name the job it was preempted for only if that job is of its tenant.
    preemptors = Job.objects.filter(pk__in=[int(p.for_job) for p in plan.preemptions if p.for_job])
    tenant_of = {str(pk): tenant for pk, tenant in preemptors.values_list("pk", "tenant_id")}
    for preemption in plan.preemptions:
        # A suspended job is told to leave the GPUs it is parked on (time-slice-evict).
        job_id = preemption.job_id
        job = unchanged(job_id, JobState.RUNNING) or unchanged(job_id, JobState.SUSPENDED)
        same_tenant = job is not None and tenant_of.get(preemption.for_job) == job.tenant_id
        if job is not None and preempt_job(job, preemption, name_preemptor=same_tenant):
            preempted += 1
    record_pending_statuses(plan.pending, loaded.snapshot)
    return {
        "started": started,
        "preempted": preempted,
        "suspended": suspended,
        "resumed": resumed,
        "pending": len(plan.pending),
    }


Starts = list[tuple[Job, core.Start]]


def still_placeable(starts: Starts, loaded: LoadedState) -> Starts:
    """The starts whose nodes are still ready and trusted and whose GPUs are still healthy, with
    those nodes and GPUs locked FOR SHARE until the cycle commits.

    The snapshot was read without locks: a node revoked, cordoned or drained, or a GPU that
    failed, after it was read would otherwise get a job that nothing ever moves away (revoke_node
    and record_gpu_health requeue only the allocations they can see). With the rows locked, such
    a change either committed before (and is seen here, so the start is dropped; the next cycle
    places the job elsewhere) or waits for this cycle to commit and then sees its allocations.
    Lock order: the jobs (locked by apply_plan), then nodes, then GPUs, each in id order, as the
    allocation inserts and desired_set_changed already take them after the jobs."""
    if not starts:
        return starts
    node_ids = sorted({loaded.node_ids[r.node] for _, start in starts for r in start.placement})
    gpu_ids = sorted(
        {loaded.gpu_ids[(r.node, i)] for _, start in starts for r in start.placement for i in r.gpu_indices}
    )
    # A row lock that waited for a writer returns the row as that writer committed it.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Node._meta.db_table} WHERE id = ANY(%s) AND state = %s AND revoked_at IS NULL "
            "ORDER BY id FOR SHARE",
            [node_ids, NodeState.READY],
        )
        usable_nodes = {row[0] for row in cursor.fetchall()}
        cursor.execute(
            f"SELECT id FROM {Gpu._meta.db_table} WHERE id = ANY(%s) AND healthy ORDER BY id FOR SHARE",
            [gpu_ids],
        )
        healthy_gpus = {row[0] for row in cursor.fetchall()}
    kept = []
    for job, start in starts:
        if all(
            loaded.node_ids[r.node] in usable_nodes
            and all(loaded.gpu_ids[(r.node, i)] in healthy_gpus for i in r.gpu_indices)
            for r in start.placement
        ):
            kept.append((job, start))
        else:
            logger.info("start of job %s dropped: its node or GPU changed since the snapshot", job.pk)
    return kept


def placement_text(start: core.Start) -> str:
    return "; ".join(f"{r.node}:{','.join(map(str, r.gpu_indices))}" for r in start.placement)


def start_jobs(starts: list[tuple[Job, core.Start]], loaded: LoadedState) -> int:
    """pending -> scheduled for every start, each with a new attempt and its allocations, in a few
    statements whatever the number of jobs. Should the database refuse an allocation (the GPU
    constraint: a stale view), the batch is undone and the jobs are started one by one, so only
    the job that lost its GPU stays pending."""
    if not starts:
        return 0
    try:
        with transaction.atomic():
            return _start_batch(starts, loaded)
    except IntegrityError:
        started = 0
        for job, start in starts:
            job.refresh_from_db()
            try:
                with transaction.atomic():
                    started += _start_batch([(job, start)], loaded)
            except IntegrityError:
                continue
        return started


def _start_batch(starts: list[tuple[Job, core.Start]], loaded: LoadedState) -> int:
    by_id = {job.pk: start for job, start in starts}
    moved = transition_jobs(
        [job for job, _ in starts],
        JobState.SCHEDULED,
        label="scheduler",
        reasons={job.pk: f"placed on {placement_text(start)}" for job, start in starts},
        data={
            job.pk: {"placement": placement_text(start), "borrowed_gpus": start.borrowed_gpus}
            for job, start in starts
        },
        pending_reason="",
        pending_message="",
        estimated_start_at=None,
        queue_position=None,
        whatif_hints=[],
        time_limit_warned=False,  # the limit is per attempt, and so is its warning
    )
    ids = [job.pk for job in moved]
    numbers = dict(
        JobAttempt.objects.filter(job_id__in=ids)
        .values("job_id")
        .annotate(n=Max("number"))
        .values_list("job_id", "n")
    )
    # Each job resumes from its newest committed checkpoint (garbage collection locks the job
    # row, moved above, before it condemns one, so the choice cannot race a deletion).
    resume_from = dict(
        Checkpoint.objects.filter(job_id__in=ids)
        .committed()
        .order_by("job_id", "-created_at", "-id")  # newest_first, per job
        .distinct("job_id")
        .values_list("job_id", "id")
    )
    attempts = JobAttempt.objects.bulk_create(
        [
            JobAttempt(
                job=job,
                number=numbers.get(job.pk, 0) + 1,
                replicas=len(by_id[job.pk].placement),
                resume=job.pk in resume_from,
                resume_from_id=resume_from.get(job.pk),
            )
            for job in moved
        ]
    )
    allocations, nodes = [], set()
    for attempt in attempts:
        for r, replica in enumerate(by_id[attempt.job_id].placement):
            nodes.add(loaded.node_ids[replica.node])
            allocations.extend(
                Allocation(
                    attempt=attempt,
                    node_id=loaded.node_ids[replica.node],
                    gpu_id=loaded.gpu_ids[(replica.node, index)],
                    replica=r,
                )
                for index in replica.gpu_indices
            )
    Allocation.objects.bulk_create(allocations)
    desired_set_changed(nodes)
    return len(moved)


def record_pending_statuses(statuses: tuple[core.PendingStatus, ...], snapshot: core.Snapshot) -> None:
    """Reason, message, estimated start, queue position and what-if hints of every job left
    pending (or suspended, waiting for its next turn), in one statement; a job that left those
    states meanwhile, or was held (its reason says so), is not touched.

    A job another transaction holds locked is skipped (SKIP LOCKED): this runs last, after the
    cycle locked and wrote nodes, and waiting here for a job whose writer then needs one of
    those nodes (cancelling a suspended job frees its parked GPUs) deadlocked. The status is
    advisory; the next cycle writes it."""
    if not statuses:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_job SET pending_reason = s.reason, pending_message = s.message, "
            "estimated_start_at = s.estimate, queue_position = s.position, whatif_hints = s.hints::jsonb "
            "FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::timestamptz[], %s::integer[], %s::text[]) "
            "AS s(id, reason, message, estimate, position, hints) "
            "WHERE jobs_job.id = s.id AND jobs_job.id IN ("
            "  SELECT id FROM jobs_job WHERE id = ANY(%s::bigint[]) "
            "  AND state IN ('pending', 'suspended') AND NOT on_hold FOR UPDATE SKIP LOCKED)",
            [
                [int(st.job_id) for st in statuses],
                [st.reason.value for st in statuses],
                [st.message[:500] for st in statuses],
                [from_epoch(st.estimated_start) for st in statuses],
                queue_numbers(statuses, snapshot),
                [json.dumps([hint_data(h) for h in st.hints]) for st in statuses],
                [int(st.job_id) for st in statuses],
            ],
        )


OUT_OF_QUEUE = (core.ReasonCode.VC_STOPPED, core.ReasonCode.BUDGET_SPENT)


def queue_numbers(statuses: tuple[core.PendingStatus, ...], snapshot: core.Snapshot) -> list[int | None]:
    """Each waiting job's place in the queue among the waiting jobs of its own tenant, 1 first,
    in the cluster's order; none for a job of a stopped VC (by an admin or by its spent budget),
    which is in no queue until the VC is open. Counted per tenant, because a place counted over
    the whole cluster would tell anyone how many jobs other tenants have waiting."""
    tenant_of_vc = {vc.name: vc.tenant or vc.name for vc in snapshot.vcs}
    tenant_of_job = {
        job.id: tenant_of_vc.get(job.vc, job.vc) for job in (*snapshot.pending, *snapshot.running)
    }
    numbers: list[int | None] = []
    places: Counter[str] = Counter()
    for status in statuses:
        if status.reason in OUT_OF_QUEUE:
            numbers.append(None)
        else:
            tenant = tenant_of_job.get(status.job_id, "")
            places[tenant] += 1
            numbers.append(places[tenant])
    return numbers


def hint_data(hint: core.WhatIfHint) -> dict[str, Any]:
    """A hint as the job API shows it: the changed request (with the flavor of that shape, if
    any, for the submit form to offer) and when the job would start."""
    start = from_epoch(hint.estimated_start)
    return {
        "kind": hint.kind.value,
        "message": hint.message,
        "replicas": hint.replicas,
        "gpus_per_replica": hint.gpus_per_replica,
        "gpu_model": hint.gpu_model,
        "flavor": hint.flavor or None,
        "time_limit_s": None if hint.time_limit_s is None else int(hint.time_limit_s),
        "starts_now": hint.starts_now,
        "estimated_start_at": None if start is None else start.isoformat(),
    }


def preempt_job(
    job: Job, preemption: core.Preemption, name_preemptor: bool = True, actor: Any = None, **fields: Any
) -> bool:
    """running -> checkpointing; the agents checkpoint (or stop) it within the grace period, and
    its GPUs are freed when they report it ended (portal.jobs.services). The event keeps the
    job it was preempted for unless `name_preemptor` is false (a job of another tenant).

    A user's pause (portal.jobs.services.hold_job) takes this same path, so that it ends as a
    preemption does: `actor` is then the user, and `fields` mark the job held in the same move.

    The grace is recorded with the move (Job.stop_grace_s): the request says it, the desired set
    says it for as long as the job is checkpointing, and end_overdue_stops waits for it."""
    data = {"preemption": preemption.reason}
    if name_preemptor and preemption.for_job:
        data["for_job"] = preemption.for_job
    grace = job.preemption_grace_s(preemption.grace_period_s)
    if not transition_job(
        job,
        JobState.CHECKPOINTING,
        actor=actor,
        label="scheduler" if actor is None else "",
        reason=preemption.message,
        data=data,
        stop_grace_s=grace,
        **fields,
    ):
        return False
    attempt = job.current_attempt()
    checkpointable = bool((job.spec.get("checkpoint") or {}).get("enabled"))
    replicas = list(attempt.allocations.values_list("replica", "node_id").distinct()) if attempt else []
    for replica, node_id in replicas:
        message_type = CheckpointRequest if checkpointable else StopRequest
        request = message_type(attempt_id=agent_attempt_id(attempt, replica), grace_period_s=grace)
        send_request(node_id, encode(request))
    # The desired set says it too (checkpoint_and_stop, or leaving the attempt out: stop), so a
    # request lost with a connection still ends in a checkpoint, not a kill, or in a stop.
    desired_set_changed(node_id for _, node_id in replicas)
    return True


def end_overdue_stops(now: datetime, force_after_s: int, profile_grace_s: float) -> list[int]:
    """Ends the preemptions (and pauses, drains) whose agents did not confirm the stop within the
    grace period it was asked with (Job.asked_grace_s; for a stop asked before that was recorded,
    the job's own, else `profile_grace_s`: the longest any path gave them then) plus
    `force_after_s`: checkpointing -> preempted -> pending, the attempt ended and its GPUs
    freed, as if the agents had reported the stop. The time-limit check ends a job
    whose stop went unconfirmed the same way (enforce_time_limits' forced path).

    Without it a lost stop, a failed one, or an agent that never answers, left the job
    'checkpointing' forever, holding GPUs, and the job it was preempted for waited behind it. A
    node that went silent is handled sooner, as lost (check_node_heartbeats); an attempt that
    still runs is not desired any more, so its agent stops it when it hears from the portal.
    Run by beat's scheduling task (scheduler.tasks.schedule_cycle). Returns the requeued job ids."""
    requeued = []
    stopping = Job.objects.filter(state=JobState.CHECKPOINTING).order_by("pk")
    for job_id in stopping.values_list("pk", flat=True):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            asked = job.events.filter(to_state=JobState.CHECKPOINTING).order_by("-created_at", "-id").first()
            if job.state != JobState.CHECKPOINTING or asked is None:
                continue
            grace = job.asked_grace_s(job.grace_s(profile_grace_s))
            overdue = (now - asked.created_at).total_seconds() - grace - force_after_s
            if overdue < 0:
                continue
            attempt = job.current_attempt()
            why = f"the agents did not confirm the stop within {grace:g} + {force_after_s} s"
            if not transition_job(job, JobState.PREEMPTED, label="portal", reason=why):
                continue
            cause = asked.data.get("preemption")
            if attempt is not None:
                end_attempt(job, attempt, AttemptState.STOPPED, None, f"preempted; {why}")
                saved = attempt.checkpoints.filter(created_at__gte=asked.created_at).exists()
                if (job.spec.get("checkpoint") or {}).get("enabled") and not saved:
                    report_failed_checkpoint(job, attempt, "portal", cause or "preemption")
            message, code = REQUEUED_AFTER.get(cause, ("requeued after preemption", PENDING_REQUEUED))
            requeue_job(job, f"{message} ({why})", code)
            requeued.append(job.pk)
    return requeued


@transaction.atomic
def suspend_job(job: Job, suspend: core.Suspend) -> bool:
    """running -> suspended: its processes are paused where they are (the desired set says so,
    level-triggered) and its allocations parked, so the job taking its turn gets the GPUs."""
    if not transition_job(
        job,
        JobState.SUSPENDED,
        label="scheduler",
        reason=suspend.message,
        data={"time_slice": "suspend", "for_job": suspend.for_job},
    ):
        return False
    attempt = job.current_attempt()
    held = Allocation.objects.filter(attempt=attempt, released_at__isnull=True)
    nodes = set(held.values_list("node_id", flat=True))
    held.update(suspended=True)
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUSPENDED)
    desired_set_changed(nodes)
    return True


def resume_job(job: Job, start: core.Start, now: float) -> bool:
    """suspended -> running on the GPUs it was paused on. A paused process cannot move: the core
    resumes a job only where it is parked (elsewhere it has it checkpoint and stop instead,
    `time-slice-move`), so a resume anywhere else is a stale plan and is not made."""
    attempt = job.current_attempt()
    parked = list(
        Allocation.objects.filter(attempt=attempt, released_at__isnull=True, suspended=True).select_related(
            "node", "gpu"
        )
    )
    where = {(a.node.name, a.gpu.index) for a in parked}
    if where != {(r.node, i) for r in start.placement for i in r.gpu_indices}:
        return False
    try:
        with transaction.atomic():
            if not transition_job(
                job,
                JobState.RUNNING,
                label="scheduler",
                reason=f"its turn: resumed on {placement_text(start)}",
                data={"time_slice": "resume"},
            ):
                return False
            Allocation.objects.filter(pk__in=[a.pk for a in parked]).update(suspended=False)
            JobAttempt.objects.filter(pk=attempt.pk).update(
                state=AttemptState.RUNNING, resumed_at=from_epoch(now)
            )
            desired_set_changed({a.node_id for a in parked})
    except IntegrityError:  # a GPU is held by another job: a stale view, the next cycle decides again
        return False
    return True

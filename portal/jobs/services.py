"""The only write paths for jobs. Each state change is a compare-and-set in a transaction that
also writes a JobEvent, so a lost race changes nothing and every change leaves a trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from agents.protocol import AttemptState as AgentAttemptState
from agents.protocol import AttemptStatus, CheckpointDone, LogChunk, supersedes
from portal.accounts.choices import SUBMIT_ROLES, Role
from portal.accounts.services import audit_entry, record_audit
from portal.cluster.models import Flavor, Node, Quota, VirtualCluster
from portal.jobs.choices import (
    ACTIVE_STATES,
    ATTEMPT_ENDED_STATES,
    PENDING_BACKOFF,
    PENDING_DEPENDENCY,
    PENDING_HELD,
    PENDING_MOVED,
    PENDING_NEW,
    PENDING_REQUEUED,
    TERMINAL_STATES,
    AttemptState,
    DependencyType,
    JobState,
    can_transition,
)
from portal.jobs.models import Allocation, Checkpoint, Job, JobAttempt, JobEvent, LogLine, Suspension
from portal.jobs.spec import MAX_RETRY_BACKOFF_S, SECRET_MASK
from portal.lib.db import insert_together
from portal.live.publish import publish_job_change, publish_log_lines, publish_replica_change
from scheduler.core.cycle import DRAIN, VC_DRAIN
from scheduler.core.plugins.defrag import Defragment


class JobRejected(Exception):
    """The job can never run as asked; `field` names the part of the spec to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class InvalidTransition(Exception):
    pass


class PermissionDenied(Exception):
    pass


def actor_label(actor: Any) -> str:
    """A user's name; the portal's own actions (actor None) are the portal's."""
    return "portal" if actor is None else getattr(actor, "username", None) or str(actor)


def transition_job(
    job: Job,
    to_state: str,
    *,
    actor: Any = None,
    label: str = "",
    reason: str = "",
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> bool:
    """Moves `job` from the state and version it was read with to `to_state`.

    Returns False, changing nothing, when another writer moved the job first. Raises
    InvalidTransition when the table in choices.py does not allow the move. Must run inside a
    transaction; updates `job` in place on success.
    """
    moved = transition_jobs(
        [job],
        to_state,
        actor=actor,
        label=label,
        reasons={job.pk: reason},
        data={job.pk: data or {}},
        **fields,
    )
    return bool(moved)


def transition_jobs(
    jobs: Sequence[Job],
    to_state: str,
    *,
    actor: Any = None,
    label: str = "",
    reasons: Mapping[int, str],
    data: Mapping[int, dict[str, Any]] | None = None,
    **fields: Any,
) -> list[Job]:
    """transition_job for many jobs in three statements: one compare-and-set UPDATE over all of
    them, one INSERT of their events, and the browser hints after commit. Returns the jobs that
    moved (in place), leaving out those another writer moved first."""
    for job in jobs:
        if not can_transition(job.state, to_state):
            raise InvalidTransition(f"job {job.pk}: {job.state} -> {to_state} is not allowed")
    if not jobs:
        return []
    assignments, params = ["state = %s", "version = jobs_job.version + 1"], [to_state]
    for name, value in fields.items():
        field = Job._meta.get_field(name)
        assignments.append(f'"{field.column}" = %s')
        params.append(field.get_db_prep_save(value, connection))
    sql = (
        f"UPDATE jobs_job SET {', '.join(assignments)} "
        "FROM unnest(%s::bigint[], %s::integer[], %s::text[]) AS seen(id, version, state) "
        "WHERE jobs_job.id = seen.id AND jobs_job.version = seen.version AND jobs_job.state = seen.state "
        # Whether the owner asked to be mailed about the new state: read back with the move, so
        # that no caller need have loaded it.
        "RETURNING jobs_job.id, %s = ANY(jobs_job.notify_on)"
    )
    params += [[j.pk for j in jobs], [j.version for j in jobs], [j.state for j in jobs], to_state]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    moved_ids = {row[0] for row in rows}
    for job_id, notify in rows:
        if notify:
            mail_owner_about(job_id, to_state, reasons.get(job_id, ""))
    moved, events, leaving_suspension = [], [], []
    person = actor if getattr(actor, "is_authenticated", False) else None
    for job in jobs:
        if job.pk not in moved_ids:
            continue
        if job.state == JobState.SUSPENDED:
            leaving_suspension.append(job.pk)
        events.append(
            JobEvent(
                job=job,
                from_state=job.state,
                to_state=to_state,
                actor=person,
                actor_label=label or actor_label(actor),
                reason=reasons.get(job.pk, "")[:500],
                data=(data or {}).get(job.pk) or {},
            )
        )
        job.state = to_state
        job.version += 1
        for name, value in fields.items():
            setattr(job, name, value)
        publish_job_change(job)
        moved.append(job)
    JobEvent.objects.bulk_create(events)
    record_suspensions(
        suspended=[job.pk for job in moved] if to_state == JobState.SUSPENDED else [],
        resumed_or_ended=leaving_suspension,
    )
    return moved


def record_suspensions(suspended: Sequence[int], resumed_or_ended: Sequence[int]) -> None:
    """Opens a suspension on the current attempt of each job that was just `suspended`, and ends
    the open one of each job that just left that state, in the transition's transaction.

    Done here, where every state change passes, rather than by the time-slicing code alone: a
    suspended job also leaves that state when it is cancelled, lost, timed out, paused, evicted
    or ends on its own, and a suspension left open would keep leaving the job's time out of its
    usage, its VC's budget and its attained service (portal.jobs.accounting.run_seconds)."""
    now = timezone.now()
    if resumed_or_ended:
        Suspension.objects.filter(attempt__job_id__in=resumed_or_ended, ended_at__isnull=True).update(
            ended_at=now
        )
    if suspended:
        current = (
            JobAttempt.objects.filter(job_id__in=suspended)
            .order_by("job_id", "-number")
            .distinct("job_id")
            .values_list("pk", flat=True)
        )
        Suspension.objects.bulk_create(Suspension(attempt_id=pk, started_at=now) for pk in current)


def resolve_resources(spec: dict[str, Any]) -> dict[str, Any]:
    """Per-replica resources and the time limit, from the flavor or the explicit resources."""
    flavor: Flavor | None = spec.get("flavor")
    if flavor is not None:
        limit_s = flavor.max_runtime_hours * 3600
        return {
            "gpu_model": flavor.gpu_model,
            "gpus_per_replica": flavor.gpus,
            "cpu_per_replica": flavor.cpu,
            "memory_gb_per_replica": flavor.memory_gb,
            "time_limit_s": min(spec.get("time_limit", limit_s), limit_s),
        }
    res = spec["resources"]
    return {
        "gpu_model": res["gpu_model"],
        "gpus_per_replica": res["gpus"],
        "cpu_per_replica": res["cpu"],
        "memory_gb_per_replica": res["memory_gb"],
        "time_limit_s": spec.get("time_limit", 7 * 24 * 3600),
    }


# What the rules of submission read, in one statement: the submitter's role in the VC's tenant,
# the VC's quota for the GPU model (its all-models row '*' when it has none for the model), and
# the GPUs of that model per node with the largest CPU and memory among those nodes. Through the
# ORM these were four queries, a millisecond of CPU each.
# Asked to, it also takes the next job id from the table's sequence, so that a single submission
# can write its job, event and audit entry in one statement (a rejected job leaves a gap in the
# ids, as any rolled-back insert does).
ADMISSION_SQL = """
SELECT membership.role, quota.guaranteed, quota.borrow_limit, nodes.gpus, nodes.cpu, nodes.memory_gb,
       CASE WHEN %s THEN nextval(pg_get_serial_sequence('jobs_job', 'id')) END,
       CASE WHEN %s THEN (
           SELECT count(*) FROM jobs_job AS job
           WHERE job.virtual_cluster_id = %s AND job.owner_id = %s AND job.state = 'pending'
       ) END
FROM (SELECT 1) AS one
LEFT JOIN accounts_membership AS membership ON membership.user_id = %s AND membership.tenant_id = %s
LEFT JOIN LATERAL (
    -- The model's own row, else the VC's all-models row ('*'), as the scheduler's core reads them.
    SELECT candidate.guaranteed, candidate.borrow_limit FROM cluster_quota AS candidate
    WHERE candidate.virtual_cluster_id = %s AND candidate.gpu_model IN (%s, '*')
    ORDER BY candidate.gpu_model = '*'
    LIMIT 1
) AS quota ON true
CROSS JOIN (
    SELECT array_agg(per_node.gpus) AS gpus, max(per_node.cpu) AS cpu, max(per_node.memory_gb) AS memory_gb
    FROM (
        SELECT count(*) AS gpus, node.cpu, node.memory_gb
        FROM cluster_gpu AS gpu JOIN cluster_node AS node ON node.id = gpu.node_id
        WHERE gpu.model = %s
        GROUP BY node.id
    ) AS per_node
) AS nodes
"""


@dataclass
class Admission:
    role: str | None
    quota: Quota | None
    gpus_per_node: list[int]
    largest_cpu: int
    largest_memory_gb: int
    job_id: int | None = None  # reserved for the job, when asked for
    pending: int = 0  # the user's pending jobs in the VC, counted only when the VC limits them


def read_admission(user: Any, vc: VirtualCluster, gpu_model: str, reserve_job_id: bool = False) -> Admission:
    capped = vc.max_pending_jobs_per_user is not None
    with connection.cursor() as cursor:
        cursor.execute(
            ADMISSION_SQL,
            [reserve_job_id, capped, vc.pk, user.pk, user.pk, vc.tenant_id, vc.pk, gpu_model, gpu_model],
        )
        role, guaranteed, borrow_limit, gpus, cpu, memory_gb, job_id, pending = cursor.fetchone()
    quota = None
    if guaranteed is not None:
        quota = Quota(
            virtual_cluster=vc, gpu_model=gpu_model, guaranteed=guaranteed, borrow_limit=borrow_limit
        )
    return Admission(role, quota, gpus or [], cpu or 0, memory_gb or 0, job_id, pending or 0)


def check_pending_limit(vc: VirtualCluster, pending: int, adding: int) -> None:
    """Rejects jobs that would take the user past the VC's limit of waiting jobs, so one user's
    script cannot flood a queue that others share. The count is read with the submission's
    other rules, without a lock: submissions of one user at the same instant may pass it by as
    many."""
    limit = vc.max_pending_jobs_per_user
    if limit is not None and pending + adding > limit:
        raise JobRejected(
            "vc",
            f"You have {pending} pending job{'' if pending == 1 else 's'} in VC {vc.name}, "
            f"which allows {limit} per user"
            + (f"; these {adding} would make {pending + adding}" if adding > 1 else "")
            + ". Wait for some to start, or cancel some.",
        )


def check_job_can_ever_fit(
    vc_name: str, admission: Admission, resources: dict[str, Any], replicas: int
) -> None:
    """Rejects a job that would otherwise wait forever: more GPUs than its VC may ever hold, or a
    shape that no set of nodes in the cluster can hold even when empty."""
    model = resources["gpu_model"]
    per_replica = resources["gpus_per_replica"]
    total = per_replica * replicas
    quota = admission.quota
    if quota is None or quota.max_gpus == 0:
        raise JobRejected("vc", f"VC {vc_name} has no quota for {model} GPUs.")
    if total > quota.max_gpus:
        raise JobRejected(
            "replicas" if replicas > 1 else "resources",
            f"The job asks for {total} {model} but VC {vc_name} may hold at most {quota.max_gpus} "
            f"({quota.guaranteed} guaranteed + {quota.borrow_limit} borrowed).",
        )
    per_node = admission.gpus_per_node
    if not per_node:
        raise JobRejected("resources", f"The cluster has no {model} GPUs.")
    if per_replica > max(per_node):
        raise JobRejected(
            "resources",
            f"Each replica asks for {per_replica} {model} but the largest node has {max(per_node)}.",
        )
    holdable = sum(n // per_replica for n in per_node)
    if replicas > holdable:
        raise JobRejected(
            "replicas",
            f"The gang needs {replicas} replicas of {per_replica} {model}; the cluster's nodes can hold "
            f"at most {holdable} such replicas.",
        )
    largest_cpu, largest_mem = admission.largest_cpu, admission.largest_memory_gb
    if largest_cpu and resources["cpu_per_replica"] > largest_cpu:
        raise JobRejected(
            "resources",
            f"Each replica asks for {resources['cpu_per_replica']} CPUs; the largest node has {largest_cpu}.",
        )
    if largest_mem and resources["memory_gb_per_replica"] > largest_mem:
        raise JobRejected(
            "resources",
            f"Each replica asks for {resources['memory_gb_per_replica']} GB of memory; the largest node has "
            f"{largest_mem} GB.",
        )


def stored_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The validated spec as plain JSON, with names in place of resolved objects and secrets
    masked (their values are kept apart, in Job.secret_env)."""
    out = dict(spec)
    out["secret_env"] = dict.fromkeys(spec.get("secret_env", {}), SECRET_MASK)
    out["vc"] = spec["vc"].name
    if spec.get("flavor") is not None:
        out["flavor"] = spec["flavor"].name
    out["priority"] = spec["priority"].name
    return out


# What a job says until the scheduler has looked at it: submitted, or released from a hold.
NEW_PENDING_MESSAGE = "Waiting for the next scheduling cycle."


def pending_job(
    user: Any, spec: dict[str, Any], checked: dict[Any, Any] | None = None, *, reserve_id: bool = True
) -> Job:
    """The unsaved pending Job for a spec validated by JobSpecSerializer, after the domain rules
    every submission passes: the user may submit to the VC, and the job could ever fit.

    Raises PermissionDenied or JobRejected. `checked` remembers the job shapes already admitted
    (per VC), so a job array costs the rules' query once per shape, not once per job, and the
    user's pending jobs per VC as first counted (submit_jobs checks the VC's limit for the whole
    array). A single job (no `checked`) comes with its id reserved, unless `reserve_id` is false:
    a dry run (scheduler.dry_run) passes the same rules but must not take an id it never uses.
    """
    single = checked is None
    checked = {} if checked is None else checked
    vc = spec["vc"]
    resources = resolve_resources(spec)
    shape = ("shape", vc.pk, spec["replicas"], *sorted(resources.items()))
    job_id = None
    if shape not in checked:
        admission = read_admission(user, vc, resources["gpu_model"], reserve_job_id=single and reserve_id)
        if not user.is_staff and admission.role not in SUBMIT_ROLES:
            raise PermissionDenied(f"You may not submit jobs to VC {vc.name}.")
        check_job_can_ever_fit(vc.name, admission, resources, spec["replicas"])
        if single:
            check_pending_limit(vc, admission.pending, 1)
        checked[shape] = True
        checked.setdefault(("pending", vc), admission.pending)
        job_id = admission.job_id
    pc = spec["priority"]
    after = sorted(set(spec.get("after", [])))
    after_type = spec.get("after_type", DependencyType.OK)
    if after and ("after", vc.tenant_id, after_type, *after) not in checked:  # an array names them once
        check_dependencies(user, vc.tenant_id, after, after_type)
        checked[("after", vc.tenant_id, after_type, *after)] = True
    return Job(
        pk=job_id,
        after=after,
        after_type=after_type,
        notify_on=spec.get("notify", []),
        tenant=vc.tenant,
        virtual_cluster=vc,
        owner=user,
        name=spec["name"],
        spec=stored_spec(spec),
        secret_env=spec.get("secret_env", {}),
        priority_class=pc,
        priority=pc.value,
        preemptible=pc.preemptible,
        replicas=spec["replicas"],
        retries_left=spec["retries"]["limit"],
        state=JobState.PENDING,
        pending_reason=PENDING_NEW,
        pending_message=NEW_PENDING_MESSAGE,
        **resources,
    )


# How an ended job that did not succeed is named in a dependent's messages.
ENDED_WITHOUT_SUCCESS = {
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled",
    JobState.TIMED_OUT: "timed out",
}


def jobs_text(job_ids: Sequence[int], limit: int = 5) -> str:
    """'job 12', 'jobs 12 and 13', 'jobs 1, 2, 3, 4, 5 and 7 more': short enough for a reason
    even when a spec names its 64 jobs."""
    if len(job_ids) == 1:
        return f"job {job_ids[0]}"
    shown = [str(job_id) for job_id in job_ids[:limit]]
    if len(job_ids) > limit:
        return f"jobs {', '.join(shown)} and {len(job_ids) - limit} more"
    return f"jobs {', '.join(shown[:-1])} and {shown[-1]}"


def check_dependencies(
    user: Any, tenant_id: int, job_ids: Sequence[int], after_type: str = DependencyType.OK
) -> None:
    """Raises JobRejected unless every job of a spec's `after` is one of the new job's tenant
    that the user may see and the job could still start: for `ok` none has ended without
    succeeding, for `notok` not all of them have succeeded. A job of another tenant reads as one
    that does not exist, even to a user of both: the waiting job's reason and events name its
    jobs to everyone in its tenant, who must not learn of another tenant's."""
    visible = Job.objects.for_user(user).filter(pk__in=job_ids, tenant_id=tenant_id)
    states = dict(visible.values_list("pk", "state"))
    for job_id in job_ids:
        state = states.get(job_id)
        if state is None:
            raise JobRejected("after", f"No job {job_id}.")
        if after_type == DependencyType.OK and state in TERMINAL_STATES and state != JobState.SUCCEEDED:
            ended = ENDED_WITHOUT_SUCCESS[state]
            raise JobRejected("after", f"Job {job_id} {ended}, so this job could never start.")
    if after_type == DependencyType.NOTOK and all(state == JobState.SUCCEEDED for state in states.values()):
        done = jobs_text(job_ids).capitalize() + (" all" if len(job_ids) > 1 else "")
        raise JobRejected("after", f"{done} succeeded, so this job (after_type notok) could never start.")


@dataclass(frozen=True)
class DependencyVerdict:
    """Where a pending job with `after` stands: it can never start (`cancel_reason`), it waits
    for `open_deps`, or (neither) it may start."""

    cancel_reason: str = ""
    open_deps: tuple[int, ...] = ()


def dependency_verdict(after_type: str, after: Sequence[int], states: Mapping[int, str]) -> DependencyVerdict:
    """What the states of a job's `after` jobs mean for it, by its after_type. A job that is
    gone counts as cancelled. `ok` gives up at the first job that ended otherwise (nothing can
    make it start then); `any` and `notok` wait until every job ended, so that a cleanup does
    not start while one of them still runs."""
    ended = {dep: states.get(dep, JobState.CANCELLED) for dep in after}
    if after_type == DependencyType.OK:
        for dep, state in ended.items():
            if state in TERMINAL_STATES and state != JobState.SUCCEEDED:
                return DependencyVerdict(
                    cancel_reason=f"job {dep}, which it depends on, {ENDED_WITHOUT_SUCCESS[state]}"
                )
        return DependencyVerdict(open_deps=tuple(dep for dep in after if ended[dep] != JobState.SUCCEEDED))
    open_deps = tuple(dep for dep in after if ended[dep] not in TERMINAL_STATES)
    if open_deps or after_type == DependencyType.ANY:
        return DependencyVerdict(open_deps=open_deps)
    if all(state == JobState.SUCCEEDED for state in ended.values()):
        every = " all" if len(after) > 1 else ""
        return DependencyVerdict(
            cancel_reason=f"{jobs_text(after)}, which it depends on,{every} succeeded "
            "(after_type notok: it was to start only if one did not)"
        )
    return DependencyVerdict()


def dependency_message(
    after_type: str, after: Sequence[int], open_deps: Sequence[int], states: Mapping[int, str]
) -> str:
    """The pending message of a job waiting for `open_deps`: which jobs, where each stands,
    and what it waits for them to do."""
    listed = ", ".join(f"job {dep} ({states[dep]})" for dep in open_deps[:5])
    more = f" and {len(open_deps) - 5} more" if len(open_deps) > 5 else ""
    if after_type == DependencyType.OK:
        return f"Waiting for {listed}{more} to succeed."
    if after_type == DependencyType.ANY:
        return f"Waiting for {listed}{more} to end."
    not_ok = [dep for dep in after if states.get(dep, JobState.CANCELLED) in ENDED_WITHOUT_SUCCESS]
    if not_ok:
        ended = ENDED_WITHOUT_SUCCESS[states.get(not_ok[0], JobState.CANCELLED)]
        return f"Waiting for {listed}{more} to end; job {not_ok[0]} {ended}, so it starts then."
    return (
        f"Waiting for {listed}{more} to end; it starts only if a job it depends on fails, "
        "is cancelled or times out."
    )


@dataclass
class DependencyStanding:
    """The pending jobs with `after`, the states of the jobs they name (those it will cancel
    counted as cancelled already), and the ones that can never start, with why."""

    waiting: list[Job]
    states: dict[int, str]
    cancelled: dict[int, str]

    def open_deps(self, job: Job) -> tuple[int, ...]:
        return dependency_verdict(job.after_type, job.after, self.states).open_deps


def read_dependencies() -> DependencyStanding:
    """Where the pending jobs with `after` stand, read only: settle_dependencies acts on it, and a
    dry run needs the same answer without the cancellations and messages it writes."""
    # Every cycle: only what is read here (not the spec, nor the secrets, which would be
    # decrypted for each waiting job each time).
    waiting = list(
        Job.objects.filter(state=JobState.PENDING)
        .exclude(after=[])
        .only("state", "version", "after", "after_type", "on_hold", "pending_message", "tenant_id")
    )
    if not waiting:
        return DependencyStanding([], {}, {})
    needed = {dep for job in waiting for dep in job.after}
    states = dict(Job.objects.filter(pk__in=needed).values_list("pk", "state"))
    # Cancel to a fixed point, so that a whole chain behind a failed job goes in one pass.
    cancelled: dict[int, str] = {}
    changed = True
    while changed:
        changed = False
        for job in waiting:
            if job.pk in cancelled:
                continue
            reason = dependency_verdict(job.after_type, job.after, states).cancel_reason
            if reason:
                cancelled[job.pk] = reason
                states[job.pk] = JobState.CANCELLED
                changed = True
    return DependencyStanding(waiting, states, cancelled)


def held_by_dependencies() -> set[int]:
    """The pending jobs a cycle would keep from the scheduler for their `after` jobs, as
    settle_dependencies would find them, without its writes: those it would cancel too, since
    they are not in the queue either once it has."""
    standing = read_dependencies()
    return set(standing.cancelled) | {job.pk for job in standing.waiting if standing.open_deps(job)}


def settle_dependencies() -> set[int]:
    """Pending jobs whose `after` jobs do not yet let them start (by their after_type): those
    that can still start wait, with reason `dependency` naming what they wait for; those that
    never can are cancelled. Returns the ids of the waiting ones, which the scheduler does not
    see. Runs in the scheduling cycle's transaction, once per cycle (no savepoint of its own)."""
    standing = read_dependencies()
    waiting, states, cancelled = standing.waiting, standing.states, standing.cancelled
    held: set[int] = set()
    for job in waiting:
        if job.pk in cancelled:
            reason = cancelled[job.pk]
            transition_job(
                job,
                JobState.CANCELLED,
                label="portal",
                reason=reason,
                **ended_pending_fields(f"DEPENDENCY: {reason}"),
            )
            continue
        open_deps = standing.open_deps(job)
        if not open_deps:
            continue
        held.add(job.pk)
        if job.on_hold:
            continue  # its reason says it is held; that comes first
        message = dependency_message(job.after_type, job.after, open_deps, states)
        if job.pending_message != message:
            Job.objects.filter(pk=job.pk, state=JobState.PENDING).update(
                pending_reason=PENDING_DEPENDENCY,
                pending_message=message,
                queue_position=None,
                estimated_start_at=None,
                whatif_hints=[],
            )
    return held


def submitted_event(job: Job, user: Any) -> JobEvent:
    """The unsaved first event of every job: submitted, pending (its history starts here)."""
    return JobEvent(
        job=job,
        from_state="",
        to_state=JobState.PENDING,
        actor=user,
        actor_label=actor_label(user),
        reason="submitted",
    )


def submit_job(user: Any, spec: dict[str, Any]) -> Job:
    """Queues a job from a spec validated by JobSpecSerializer.

    Raises PermissionDenied for viewers and JobRejected when the job could never run; in both
    cases nothing is stored. The job starts pending, with an event: one statement writes the job,
    the event and the audit entry, so all three are stored or none, with no transaction block
    (whose BEGIN and COMMIT were two of a submission's seven round trips).
    """
    job = pending_job(user, spec)
    insert_together(job, submitted_event(job, user), audit_entry(user, "job.submit", job, tenant=job.tenant))
    publish_job_change(job)  # other tabs of the tenant show the new job at once
    request_scheduling_cycle()
    return job


class JobsRejected(Exception):
    """Some jobs of a bulk submission can never run: {item index: {field: [message]}}."""

    def __init__(self, errors: dict[int, dict[str, list[str]]]) -> None:
        super().__init__(f"{len(errors)} of the jobs were rejected")
        self.errors = errors


@transaction.atomic
def submit_jobs(user: Any, specs: Sequence[dict[str, Any]]) -> list[Job]:
    """Queues many jobs (a job array) all or nothing, with the rules of submit_job.

    Raises PermissionDenied when any VC is closed to the user and JobsRejected naming every item
    that could never run; then nothing is stored. Otherwise two INSERTs (jobs, events), one audit
    entry per tenant and one cycle request, however many jobs.
    """
    checked: dict[Any, Any] = {}
    jobs: list[Job] = []
    errors: dict[int, dict[str, list[str]]] = {}
    for index, spec in enumerate(specs):
        try:
            jobs.append(pending_job(user, spec, checked))
        except JobRejected as exc:
            errors[index] = {exc.field: [exc.message]}
    if not errors:  # (the items' indexes are then the jobs' own)
        for vc, count in Counter(job.virtual_cluster for job in jobs).items():
            try:
                check_pending_limit(vc, checked[("pending", vc)], count)
            except JobRejected as exc:
                first = next(i for i, job in enumerate(jobs) if job.virtual_cluster == vc)
                errors[first] = {exc.field: [exc.message]}
    if errors:
        raise JobsRejected(errors)
    Job.objects.bulk_create(jobs)
    JobEvent.objects.bulk_create([submitted_event(job, user) for job in jobs])
    tenants: dict[int, list[Job]] = {}
    for job in jobs:
        publish_job_change(job)
        tenants.setdefault(job.tenant_id, []).append(job)
    for tenant_jobs in tenants.values():
        ids = ", ".join(str(job.pk) for job in tenant_jobs)
        record_audit(
            user, "job.submit_bulk", tenant=tenant_jobs[0].tenant, detail=f"{len(tenant_jobs)} jobs: {ids}"
        )
    request_scheduling_cycle()
    return jobs


def release_allocations(job: Job) -> int:
    """Ends the job's current attempt and frees its GPUs; returns how many GPUs were freed.
    The nodes that ran it are told after commit, and a scheduling cycle is requested."""
    from portal.agentgw.outbox import desired_set_changed

    now = timezone.now()
    nodes = Allocation.objects.filter(attempt__job=job, released_at__isnull=True).values_list(
        "node_id", flat=True
    )
    desired_set_changed(list(nodes))
    request_scheduling_cycle()
    JobAttempt.objects.filter(job=job).exclude(state__in=ATTEMPT_ENDED_STATES).update(
        state=AttemptState.STOPPED, ended_at=now
    )
    return Allocation.objects.filter(attempt__job=job, released_at__isnull=True).update(released_at=now)


def ended_pending_fields(end_reason: str) -> dict[str, Any]:
    """What a job's row says once it has ended: when and why, and nothing of a wait."""
    return {
        "finished_at": timezone.now(),
        "pending_reason": "",
        "pending_message": "",
        "estimated_start_at": None,
        "queue_position": None,
        "whatif_hints": [],
        "end_reason": end_reason,
    }


@transaction.atomic
def cancel_job(job: Job, actor: Any, reason: str = "cancelled by user") -> Job:
    """Cancels a job in any non-terminal state. Its GPUs are freed in the same transaction; the
    agents stop its processes when they next converge to their desired set."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in TERMINAL_STATES:
        raise InvalidTransition(f"Job {job.pk} has already ended ({job.state}).")
    was_active = job.state in ACTIVE_STATES
    transition_job(
        job,
        JobState.CANCELLED,
        actor=actor,
        reason=reason,
        on_hold=False,  # an ended job waits for no release
        **ended_pending_fields(reason),
    )
    if was_active:
        release_allocations(job)
    else:
        request_scheduling_cycle()  # a reservation may have been held for it
    record_audit(actor, "job.cancel", job, tenant=job.tenant)
    return job


@transaction.atomic
def move_to_front(job: Job, actor: Any) -> Job:
    """Puts a pending job before its owner's other pending jobs of its VC and priority class
    (Slurm's `scontrol top`). It takes the place of the first of them in the scheduler's
    order: no one else's job stands further back, and nothing is preempted for it."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state != JobState.PENDING:
        raise InvalidTransition(f"Job {job.pk} is {job.state}; only a pending job can move in the queue.")
    job.topped_at = timezone.now()
    job.save(update_fields=["topped_at"])
    record_job_event(
        job,
        actor_label(actor),
        f"moved to the front of {job.owner.username}'s pending jobs in {job.virtual_cluster.name}",
        {"topped": True},
    )
    record_audit(actor, "job.top", job, tenant=job.tenant)
    request_scheduling_cycle()
    return job


# A job paused while it ran (hold_job): its stop_reason while it checkpoints and then waits
# held, until it is released; and the preemption reason its checkpointing event carries.
PAUSED = "paused"
PAUSE = "pause"


def held_message(actor: Any) -> str:
    return f"Held by {actor_label(actor)}: it does not start until released."


def paused_message(actor: Any, checkpointed: bool = True) -> str:
    """`actor` a user or the label of one (message_once_held has only the label)."""
    then = (
        "resumes from its checkpoint when released"
        if checkpointed
        else "it saved no checkpoint, so it starts over when released"
    )
    return f"Paused by {actor_label(actor)}: {then}"


def held_fields(message: str) -> dict[str, Any]:
    """What a held job's row says: held, why, and nothing of a place in the queue."""
    return {
        "on_hold": True,
        "pending_reason": PENDING_HELD,
        "pending_message": message,
        "queue_position": None,
        "estimated_start_at": None,
        "whatif_hints": [],
    }


def is_paused(job: Job) -> bool:
    """Held after (or while) it checkpointed and stopped: released, it resumes from there."""
    return job.on_hold and job.stop_reason == PAUSED


@transaction.atomic
def hold_job(job: Job, actor: Any) -> Job:
    """Keeps a job from starting until it is released (Slurm's `scontrol hold`); a pending job
    keeps its place in the order of submission.

    A running or suspended job is paused (Determined's pause), to free its GPUs without losing
    its work: it checkpoints and stops as a preemption would, within its own grace, and comes
    back pending and held, to resume from its checkpoint when released. Without checkpointing it
    would lose its work, so that is refused. A scheduled or starting job has done no work yet:
    it is stopped at once and held. One already checkpointing (preempted) is held once it has
    stopped, instead of being ranked again."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.on_hold:
        raise InvalidTransition(f"Job {job.pk} is already held.")
    was = job.state
    checkpointable = bool((job.spec.get("checkpoint") or {}).get("enabled"))
    if job.state == JobState.PENDING:
        _hold_pending(job, actor)
    elif job.state in (JobState.RUNNING, JobState.SUSPENDED):
        _pause(job, actor, checkpointable)
    elif job.state in (JobState.SCHEDULED, JobState.STARTING):
        transition_job(
            job,
            JobState.PENDING,
            actor=actor,
            reason=f"held while {job.state}: stopped; it does not start until released",
            data={"held": True},
            **held_fields(held_message(actor)),
        )
        release_allocations(job)
    elif job.state == JobState.CHECKPOINTING:
        _hold_when_stopped(job, actor, checkpointable)
    elif job.state in TERMINAL_STATES:
        raise InvalidTransition(f"Job {job.pk} has already ended ({job.state}).")
    else:
        raise InvalidTransition(f"Job {job.pk} is {job.state}; it cannot be held now.")
    record_audit(actor, "job.hold", job, tenant=job.tenant, detail=f"held while {was}")
    request_scheduling_cycle()  # its GPUs, or a reservation made for it, go to others
    return job


def _hold_pending(job: Job, actor: Any) -> None:
    fields = held_fields(held_message(actor))
    for name, value in fields.items():
        setattr(job, name, value)
    # A new version: a cycle that read the job before the hold must not start it (apply_plan
    # acts only on jobs whose version it read).
    job.version += 1
    job.save(update_fields=[*fields, "version"])
    publish_job_change(job)  # open pages show the hold at once
    record_job_event(job, actor_label(actor), "held: it does not start until released", {"held": True})


def _pause(job: Job, actor: Any, checkpointable: bool) -> None:
    """The scheduler's preemption path (scheduler.store.preempt_job), on the user's word: the
    agents are asked to checkpoint and stop it, and the desired set says so too."""
    from scheduler import core
    from scheduler.store import preempt_job

    if not checkpointable:
        raise InvalidTransition(
            f"Job {job.pk} has no checkpointing; pausing it would lose its work. "
            "Cancel it or resubmit with checkpoint.enabled"
        )
    if job.stop_reason:
        raise InvalidTransition(f"Job {job.pk} is being stopped ({job.stop_reason}); it cannot be paused.")
    grace = job.grace_s(120)
    preemption = core.Preemption(
        job_id=core.JobId(str(job.pk)),
        reason=PAUSE,
        message=f"paused by {actor_label(actor)}: it checkpoints, and is held when it stops",
        grace_period_s=grace,
        for_job=core.JobId(""),
    )
    held = held_fields(paused_message(actor))
    if not preempt_job(job, preemption, actor=actor, stop_reason=PAUSED, **held):
        raise InvalidTransition(f"Job {job.pk} changed meanwhile; try again.")


def _hold_when_stopped(job: Job, actor: Any, checkpointable: bool) -> None:
    """A job already checkpointing (or told to stop) for a preemption or migration: once it has
    stopped it comes back held; with checkpointing it is then as paused."""
    if job.stop_reason and job.stop_reason != PAUSED:
        raise InvalidTransition(f"Job {job.pk} is being stopped ({job.stop_reason}); it cannot be held.")
    fields = held_fields(paused_message(actor) if checkpointable else held_message(actor))
    if checkpointable:
        fields["stop_reason"] = PAUSED
    for name, value in fields.items():
        setattr(job, name, value)
    job.version += 1  # as in _hold_pending
    job.save(update_fields=[*fields, "version"])
    publish_job_change(job)
    then = "resumes from its checkpoint" if checkpointable else "does not start"
    record_job_event(
        job, actor_label(actor), f"held: once it has stopped, it {then} when released", {"held": True}
    )


@transaction.atomic
def change_time_limit(job: Job, actor: Any, seconds: int) -> Job:
    """Sets the job's wall-clock limit per attempt (Slurm's `scontrol update TimeLimit`): its
    owner may lower it, an admin of its tenant (or a cluster admin) also raise it, never past
    its flavor's limit. A running job past a lowered limit is stopped at the next check, as at
    any limit; a raised one is warned again before it."""
    from portal.jobs.spec import MAX_DURATION_S, TOO_LONG, duration_text

    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in TERMINAL_STATES:
        raise InvalidTransition(f"Job {job.pk} {job.state}; its time limit no longer applies.")
    if seconds > MAX_DURATION_S:  # what a spec may give; more overflows the column (a 500)
        raise JobRejected("time_limit", TOO_LONG)
    flavor = Flavor.objects.filter(name=job.spec.get("flavor") or "").only("max_runtime_hours").first()
    ceiling = flavor.max_runtime_hours * 3600 if flavor is not None else None
    if ceiling is not None and seconds > ceiling:
        raise JobRejected(
            "time_limit", f"At most {duration_text(ceiling)}, the limit of flavor {flavor.name}."
        )
    is_admin = actor.is_staff or job.tenant.memberships.filter(user=actor, role=Role.ADMIN).exists()
    if seconds > job.time_limit_s and not is_admin:
        raise PermissionDenied(
            "Only an admin of the job's tenant may raise its time limit; you may lower it."
        )
    before = job.time_limit_s
    job.time_limit_s = seconds
    if seconds > before:
        job.time_limit_warned = False
    job.save(update_fields=["time_limit_s", "time_limit_warned"])
    change = f"{duration_text(before)} -> {duration_text(seconds)}"
    record_job_event(job, actor_label(actor), f"time limit changed: {change}", {"time_limit_s": seconds})
    record_audit(actor, "job.time_limit", job, tenant=job.tenant, detail=change)
    request_scheduling_cycle()  # reservations and backfill read the limit
    return job


@transaction.atomic
def release_job(job: Job, actor: Any) -> Job:
    """Lets a held job start again; the next cycle ranks it as before, and a paused one resumes
    from its newest checkpoint, as after a preemption. One released before its pause has stopped
    it is requeued once it has, as after a preemption."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in TERMINAL_STATES:
        # Nothing is left to start; a release would only write a misleading event.
        raise InvalidTransition(f"Job {job.pk} has already ended ({job.state}).")
    if not job.on_hold:
        raise InvalidTransition(f"Job {job.pk} is not held.")
    paused = is_paused(job)
    job.on_hold = False
    if paused:
        job.stop_reason = ""
    if job.state == JobState.PENDING:
        job.pending_reason, job.pending_message = PENDING_NEW, NEW_PENDING_MESSAGE
        reason = "released: it may start again"
        if paused:
            resume = resume_point(job)
            reason += f", from its checkpoint at step {resume.step}" if resume else ", from the start"
    else:
        job.pending_reason = job.pending_message = ""
        reason = "released before it stopped: it is requeued once it has"
    job.version += 1  # as in _hold_pending: a cycle's view of the held job is stale
    job.save(update_fields=["on_hold", "stop_reason", "pending_reason", "pending_message", "version"])
    publish_job_change(job)
    record_job_event(job, actor_label(actor), reason, {"held": False})
    record_audit(actor, "job.release", job, tenant=job.tenant)
    request_scheduling_cycle()
    return job


# ---------------------------------------------------------------------------
# What agents report. Each handler is idempotent: a duplicate, late or reordered message
# changes nothing wrong, because replica reports are ordered by agents.protocol.supersedes
# and job transitions are compare-and-set.
# ---------------------------------------------------------------------------


class StaleReport(Exception):
    """The report names an attempt this node does not run; it is refused."""


def _replica_for(node: Node, agent_attempt_id: str) -> tuple[JobAttempt, int]:
    """The attempt a report names, read without a lock (see `_lock_job_and_attempt`)."""
    from portal.agentgw.desired import parse_agent_attempt_id

    parsed = parse_agent_attempt_id(agent_attempt_id)
    if parsed is None:
        raise StaleReport(f"unknown attempt id {agent_attempt_id!r}")
    attempt_pk, replica = parsed
    attempt = JobAttempt.objects.filter(
        pk=attempt_pk, allocations__node=node, allocations__replica=replica
    ).first()
    if attempt is None:
        raise StaleReport(f"attempt {agent_attempt_id} was never placed on node {node.name}")
    return attempt, replica


def _lock_job_and_attempt(attempt: JobAttempt) -> tuple[Job, JobAttempt]:
    """Locks the job row, then the attempt row, and returns both as they are now.

    Every writer takes the job first (transitions, preemption, cancellation, the scheduler's
    plan); a report that locked its attempt first and then waited for the job deadlocked with
    them under load. The attempt is read again under the lock, so concurrent reports of one
    attempt's replicas merge their states instead of overwriting each other."""
    job = Job.objects.select_for_update().get(pk=attempt.job_id)
    attempt = JobAttempt.objects.select_for_update().get(pk=attempt.pk)
    return job, attempt


def _replicas_on_nodes(attempt: JobAttempt) -> list[int]:
    return list(attempt.allocations.values_list("node_id", flat=True).distinct())


def end_attempt(job: Job, attempt: JobAttempt, state: str, exit_code: int | None, reason: str) -> None:
    """Records the attempt's end and frees its GPUs; the nodes are told after commit."""
    from portal.agentgw.outbox import desired_set_changed

    nodes = _replicas_on_nodes(attempt)
    JobAttempt.objects.filter(pk=attempt.pk).update(
        state=state, ended_at=timezone.now(), exit_code=exit_code, end_reason=reason[:500]
    )
    Allocation.objects.filter(attempt=attempt, released_at__isnull=True).update(released_at=timezone.now())
    desired_set_changed(nodes)
    request_scheduling_cycle()


def mail_owner_about(job_id: int, state: str, reason: str) -> None:
    """Tells the job's owner about its new state after commit (the spec's `notify`), by mail and
    to their webhooks, from a worker: a server that is slow or away never holds up the transition."""
    from portal.jobs.tasks import mail_job_state, post_job_state

    transaction.on_commit(lambda: mail_job_state.delay(job_id, state, reason))
    transaction.on_commit(lambda: post_job_state.delay(job_id, state, reason))


def mail_about_idle_job(job_id: int, message: str) -> None:
    """Tells the owner and the tenant's admins, after commit, that a job's GPUs sit idle (what
    the VC's idle policy promises), and the owner's webhooks too."""
    from portal.jobs.tasks import mail_idle_job, post_idle_job

    transaction.on_commit(lambda: mail_idle_job.delay(job_id, message))
    transaction.on_commit(lambda: post_idle_job.delay(job_id, message))


def request_scheduling_cycle() -> None:
    """Asks for a scheduling cycle after commit (debounced by the task itself)."""
    from scheduler.tasks import request_cycle

    transaction.on_commit(request_cycle)


@transaction.atomic
def record_attempt_status(node: Node, status: AttemptStatus) -> bool:
    """Folds one replica's status report into its attempt and, for the job's current attempt,
    moves the job: all replicas running -> running; all succeeded -> succeeded; one failed ->
    failed (the other replicas are stopped); one vanished -> lost, then pending while retries
    remain. Returns False when the report was a duplicate or late.

    A report that changes what the job's viewers see of the replica (its state, message or exit
    code) but does not move the job, such as an image pull's progress, is told to the job's page
    on its own; one that changes nothing of that (a repeat with a new generation) is not."""
    attempt, replica = _replica_for(node, status.attempt_id)
    job, attempt = _lock_job_and_attempt(attempt)
    stored = attempt.replica_states.get(str(replica))
    old_state = AgentAttemptState(stored["state"]) if stored else None
    if not supersedes(status.state, status.generation, old_state, stored["generation"] if stored else -1):
        return False
    reported = {
        "state": status.state.value,
        "generation": status.generation,
        "exit_code": status.exit_code,
        "reason": status.reason.value if status.reason else None,
        "node": node.name,
        "message": status.message[:500],
    }
    attempt.replica_states[str(replica)] = reported
    JobAttempt.objects.filter(pk=attempt.pk).update(replica_states=attempt.replica_states)
    changed = any((stored or {}).get(key) != reported[key] for key in ("state", "message", "exit_code"))
    version = job.version
    current = job.current_attempt()
    # A report about an old attempt or an ended job changes no job state.
    if current is not None and current.pk == attempt.pk and job.state in ACTIVE_STATES:
        _advance_job(job, attempt, node)
    if changed and job.version == version:  # a move of the job tells its page itself
        publish_replica_change(job)
    return True


# A preempted job's requeue event and pending code, by why it was stopped (preemptions not
# listed: "requeued after preemption").
REQUEUED_AFTER = {
    Defragment.name: ("requeued after a migration: it restarts ahead of the queue", PENDING_MOVED),
    DRAIN: ("requeued after its node was drained: it starts again elsewhere", PENDING_REQUEUED),
    VC_DRAIN: (
        "requeued after its VC was stopped and drained: it starts again once the VC is open",
        PENDING_REQUEUED,
    ),
    PAUSE: ("requeued after it was paused", PENDING_REQUEUED),
}


def _advance_job(job: Job, attempt: JobAttempt, node: Node) -> None:
    replicas = attempt.replicas  # the job's own, or more when it spread over nodes
    states = [attempt.replica_states.get(str(r)) for r in range(replicas)]
    label = f"agent {node.name}"
    now = timezone.now()
    reported = [s for s in states if s is not None]
    ended = [s for s in reported if s["state"] in ("exited", "vanished")]
    failed = [s for s in reported if s["state"] == "exited" and s["reason"] in ("failed", "start_failed")]
    all_succeeded = len(reported) == replicas and all(
        s["state"] == "exited" and s["reason"] == "succeeded" for s in reported
    )
    if job.state == JobState.CHECKPOINTING:
        # Preemption: once every replica has ended (checkpointed, stopped, or failing on the
        # signal), the job goes back to the queue and resumes from its checkpoint. An agent
        # reports "succeeded" or "failed" only for a command that ended on its own before the
        # agent began to stop it (agents.agent._fold: once it has, every exit is "stopped" or
        # "checkpointed"), so such an end is the job's own: a job whose every replica finished
        # is done, not run again, and one that failed counts the failure, as it would have a
        # moment earlier, instead of being rerun as preempted.
        if len(ended) < replicas:
            return
        if all_succeeded:
            _succeed(job, attempt, label)
        elif failed:
            _fail_on_replica(job, attempt, failed[0], label)
        elif transition_job(job, JobState.PREEMPTED, label=label, reason="all replicas stopped"):
            end_attempt(job, attempt, AttemptState.STOPPED, None, "preempted")
            asked = job.events.filter(to_state=JobState.CHECKPOINTING).order_by("-created_at").first()
            if (
                asked is not None
                and (job.spec.get("checkpoint") or {}).get("enabled")
                and not attempt.checkpoints.filter(created_at__gte=asked.created_at).exists()
            ):
                report_failed_checkpoint(job, attempt, label, asked.data.get("preemption") or "preemption")
            reason = asked.data.get("preemption") if asked is not None else None
            requeue_job(job, *REQUEUED_AFTER.get(reason, ("requeued after preemption", PENDING_REQUEUED)))
        return
    if job.state == JobState.SCHEDULED and ended:
        # An end reported before any start (a start failure, a reordered or replayed report)
        # still passes through starting: no end is a transition allowed from scheduled.
        transition_job(job, JobState.STARTING, label=label, reason="the agent is starting it")
    if job.stop_reason == "time-limit":
        if len(ended) == replicas and transition_job(
            job,
            JobState.TIMED_OUT,
            label=label,
            reason="stopped at its time limit",
            finished_at=now,
            end_reason="time limit reached",
        ):
            end_attempt(job, attempt, AttemptState.STOPPED, None, "time limit reached")
        return
    vanished = [s for s in reported if s["state"] == "vanished"]
    if failed:
        _fail_on_replica(job, attempt, failed[0], label)
        return
    if vanished:
        message = f"replica on {vanished[0]['node']} vanished"
        if transition_job(job, JobState.LOST, label=label, reason=message):
            end_attempt(job, attempt, AttemptState.LOST, None, message)
            requeue_lost_job(job, message)
        return
    if all_succeeded:
        _succeed(job, attempt, label)
        return
    if len(ended) == replicas:
        fail_or_retry(job, attempt, None, "the replicas stopped without finishing", label, permanent=False)
        return
    if (
        job.state in (JobState.SCHEDULED, JobState.STARTING)
        and len(reported) == replicas
        and all(s["state"] in ("running", "suspended", "exited") for s in reported)
    ):
        if transition_job(
            job,
            JobState.RUNNING,
            label=label,
            reason="all replicas running",
            started_at=job.started_at or now,
        ):
            JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.RUNNING, started_at=now)
        return
    if job.state == JobState.SCHEDULED and reported:
        transition_job(job, JobState.STARTING, label=label, reason="the agent is starting it")


def _succeed(job: Job, attempt: JobAttempt, label: str) -> None:
    """Every replica exited 0 on its own: the job is done. An ended job is held no more (it may
    have been paused while it finished), so that nothing can release it."""
    if transition_job(
        job,
        JobState.SUCCEEDED,
        label=label,
        reason="all replicas exited 0",
        finished_at=timezone.now(),
        exit_code=0,
        end_reason="succeeded",
        on_hold=False,
    ):
        end_attempt(job, attempt, AttemptState.SUCCEEDED, 0, "succeeded")


def _fail_on_replica(job: Job, attempt: JobAttempt, failed: dict[str, Any], label: str) -> None:
    """A replica failed on its own (or could not start, which no retry mends)."""
    message = f"replica on {failed['node']} exited with code {failed['exit_code']}"
    if failed["reason"] == "start_failed":
        message = f"replica on {failed['node']} could not start: {failed['message']}"
    fail_or_retry(
        job, attempt, failed["exit_code"], message, label, permanent=failed["reason"] == "start_failed"
    )


def retry_backoff_s(retries: dict[str, Any], used: int) -> int:
    """The wait before retry `used + 1`: the spec's backoff, doubled after each retry used, as
    for flapping services, yet never longer than a day however many retries are allowed."""
    return min(retries.get("backoff_seconds", 60) * 2**used, MAX_RETRY_BACKOFF_S)


def fail_or_retry(
    job: Job, attempt: JobAttempt, exit_code: int | None, message: str, label: str, permanent: bool
) -> None:
    """A failed attempt: retry with backoff while retries remain and the exit code is not one the
    spec calls permanent; otherwise the job fails."""
    retries = job.spec.get("retries") or {}
    permanent_code = exit_code in retries.get("permanent_exit_codes", [])
    now = timezone.now()
    if job.retries_left > 0 and not (permanent or permanent_code):
        used = retries.get("limit", 0) - job.retries_left
        backoff = retry_backoff_s(retries, used)
        reason = f"{message}; retry {used + 1} of {retries.get('limit', 0)} in {backoff} s"
        code, pending_message = PENDING_BACKOFF, reason
        if job.on_hold:  # failed while its pause stopped it: it waits held, as after a preemption
            code, pending_message = PENDING_HELD, message_once_held(job)
        if transition_job(
            job,
            JobState.PENDING,
            label=label,
            reason=reason,
            retries_left=job.retries_left - 1,
            not_before=now + timedelta(seconds=backoff),
            pending_reason=code,
            pending_message=pending_message,
        ):
            end_attempt(job, attempt, AttemptState.FAILED, exit_code, message)
        return
    if permanent_code:
        message = f"{message}, which the spec calls permanent: no retry"
    if transition_job(
        job,
        JobState.FAILED,
        label=label,
        reason=message,
        finished_at=now,
        exit_code=exit_code,
        end_reason=message,
        on_hold=False,  # as in _succeed
    ):
        end_attempt(job, attempt, AttemptState.FAILED, exit_code, message)


def report_failed_checkpoint(job: Job, attempt: JobAttempt, label: str, cause: str) -> None:
    """A preemption or migration (`cause`: the scheduler's reason, e.g. defrag) whose attempt
    ended without committing a checkpoint (no marker in time, a bad one, or an agent that died
    before its manifest was published): the job's events say so, and from which committed
    checkpoint the next attempt resumes."""
    resume = resume_point(job)
    outcomes = "; ".join(
        f"replica {replica}: {state.get('reason') or state.get('state')}"
        + (f" ({state['message']})" if state.get("message") else "")
        for replica, state in sorted(attempt.replica_states.items())
    )
    where = f"resumes from step {resume.step}" if resume else "starts over: no committed checkpoint"
    record_job_event(
        job,
        label,
        f"checkpoint failed ({cause}): attempt {attempt.number} stopped without a committed checkpoint "
        f"({outcomes}); the next attempt {where}",
        {
            "checkpoint": "failed",
            "preemption": cause,
            "attempt": attempt.number,
            "resume_from_step": resume.step if resume else None,
        },
    )


def record_job_event(job: Job, label: str, reason: str, data: dict[str, Any] | None = None) -> None:
    """An event that is not a transition (a warning, a request sent to the agents)."""
    JobEvent.objects.create(job=job, actor_label=label, reason=reason[:500], data=data or {})


def requeue_job(job: Job, reason: str, code: str = PENDING_REQUEUED) -> None:
    """Puts a lost or preempted job back in the queue with its original submit time. A job held
    while it ran (paused, or held while it stopped) comes back held, with its hold's message, so
    that it is not ranked again until it is released.

    Why the portal asked the ended attempt to stop (a time limit, say) goes with it: kept, it
    would make the next attempt's reports look like that stop's (a running one ignored, an exit
    taken for a timeout). Only a pause outlives the attempt, until the job is released."""
    message = reason
    if job.on_hold:
        code, message, reason = PENDING_HELD, message_once_held(job), f"{reason}; held until released"
    transition_job(
        job,
        JobState.PENDING,
        label="portal",
        reason=reason,
        pending_reason=code,
        pending_message=message,
        stop_reason=job.stop_reason if job.stop_reason == PAUSED else "",
    )


def message_once_held(job: Job) -> str:
    """The hold's message, unless it promised a checkpoint the pause did not leave.

    Who paused the job is read from the pause's event (its move to checkpointing, or its hold
    while it was already stopping), not from the message, which is worded for people. Holding
    the job again takes a release, which ends the pause, so the newest such event is this one.
    """
    if is_paused(job) and resume_point(job) is None:
        pause = Q(to_state=JobState.CHECKPOINTING, data__preemption=PAUSE) | Q(data__held=True)
        events = job.events.filter(pause).order_by("-created_at", "-id")
        return paused_message(events.values_list("actor_label", flat=True).first(), checkpointed=False)
    return job.pending_message


def requeue_lost_job(job: Job, reason: str) -> None:
    """A lost attempt (its node or its processes gone): back to the queue, to resume from its
    last checkpoint, unless the spec says a job must not run twice; then it fails, NODE_FAIL."""
    if job.spec.get("requeue_on_node_failure", True):
        requeue_job(job, f"requeued: {reason}")
        return
    message = f"NODE_FAIL: {reason}; not requeued (requeue_on_node_failure is false)"
    transition_job(
        job, JobState.FAILED, label="portal", reason=message, finished_at=timezone.now(), end_reason=message
    )


def record_log_chunk(node: Node, chunk: LogChunk) -> int:
    """Stores the chunk's lines; lines the portal already has are skipped. Returns lines added.

    An attempt keeps at most LOG_MAX_BYTES_PER_ATTEMPT bytes of output, its replicas and streams
    together, counted in its `log_bytes`. The first line that does not fit marks the attempt
    `log_truncated`, with one job event; from then on its lines are dropped. Chunks of one attempt
    take its row lock in turn, so the count is exact and the mark set once, however many chunks
    (or copies of one chunk sent again) arrive at once.
    """
    attempt, replica = _replica_for(node, chunk.attempt_id)
    if attempt.log_truncated:
        return 0  # the mark is never taken back: nothing of this attempt is stored any more
    # A job prints what it likes; PostgreSQL text cannot hold NUL, which would refuse the chunk.
    lines = chunk.text.replace("\x00", "\ufffd").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    max_bytes = settings.LOG_MAX_BYTES_PER_ATTEMPT
    with transaction.atomic():
        _share_lock_job(attempt.job_id)
        stored_bytes, truncated = (
            JobAttempt.objects.select_for_update(no_key=True)
            .filter(pk=attempt.pk)
            .values_list("log_bytes", "log_truncated")
            .get()
        )
        if truncated:
            return 0
        existing = set(
            LogLine.objects.filter(
                attempt=attempt,
                replica=replica,
                stream=chunk.stream,
                seq__gte=chunk.seq,
                seq__lt=chunk.seq + len(lines),
            ).values_list("seq", flat=True)
        )
        new: list[LogLine] = []
        for offset, text in enumerate(lines):
            seq = chunk.seq + offset
            if seq in existing:
                continue
            size = log_line_bytes(text)
            if max_bytes and stored_bytes + size > max_bytes:
                truncated = True
                break
            stored_bytes += size
            new.append(LogLine(attempt=attempt, replica=replica, stream=chunk.stream, seq=seq, text=text))
        LogLine.objects.bulk_create(new, ignore_conflicts=True)
        if truncated:
            _mark_log_truncated(attempt, stored_bytes, max_bytes)
        elif new:
            JobAttempt.objects.filter(pk=attempt.pk).update(log_bytes=stored_bytes)
        publish_log_lines(
            attempt.job_id,
            attempt.number,
            [
                {"replica": replica, "stream": chunk.stream, "seq": line.seq, "text": line.text}
                for line in new
            ],
        )
    return len(new)


def log_line_bytes(text: str) -> int:
    """What one stored line counts against the cap: its UTF-8 and the newline that ended it."""
    return len(text.encode("utf-8")) + 1


def _share_lock_job(job_id: int) -> None:
    """Takes the job's row before the attempt's, as every writer does (see _lock_job_and_attempt),
    in the weakest mode, the one that writing a job event takes anyway. It waits only for a writer
    holding the whole row (select_for_update), never for a transition, and a log chunk that then
    holds the attempt cannot deadlock with a writer that holds the job and waits for the attempt.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM jobs_job WHERE id = %s FOR KEY SHARE", [job_id])


def _mark_log_truncated(attempt: JobAttempt, stored_bytes: int, max_bytes: int) -> None:
    """Sets the attempt's truncation mark (compare-and-set) and, if this call set it, writes the
    one job event that says so. The caller holds the attempt's row lock."""
    marked = JobAttempt.objects.filter(pk=attempt.pk, log_truncated=False).update(
        log_bytes=stored_bytes, log_truncated=True
    )
    if marked:
        record_job_event(
            Job.objects.only("id").get(pk=attempt.job_id),
            "portal",
            f"output beyond {byte_size_label(max_bytes)} of attempt {attempt.number} was not kept",
            {"log": "truncated", "attempt": attempt.number, "max_bytes": max_bytes},
        )


def byte_size_label(size: int) -> str:
    """A size as people write it: 100 MiB, 64 KiB, or 300 bytes when it is not a whole unit."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"


@transaction.atomic
def record_checkpoint(node: Node, done: CheckpointDone) -> Checkpoint | None:
    """Commits a checkpoint with its manifest in one transaction (the job row locked, so garbage
    collection sees it or not at all). A report without a manifest commits nothing: its files
    were never listed and checked, so no attempt may resume from it. Replicas sharing the
    directory report the same checkpoint; the first report commits it."""
    attempt, _ = _replica_for(node, done.attempt_id)
    job, attempt = _lock_job_and_attempt(attempt)
    if not done.manifest_sha256 or not done.manifest_path:
        record_job_event(
            job,
            f"agent {node.name}",
            f"checkpoint at step {done.step} reported without a manifest: not committed",
            {"checkpoint": "refused", "step": done.step, "attempt": attempt.number},
        )
        return None
    checkpoint, _ = Checkpoint.objects.get_or_create(
        job=job,
        attempt=attempt,
        path=done.path,
        step=done.step,
        defaults={
            "size_bytes": done.size_bytes,
            "written_at": done.time,
            "metric": done.metric,
            "metric_mode": done.metric_mode,
            "manifest_path": done.manifest_path,
            "manifest_sha256": done.manifest_sha256,
            "manifest": [item.model_dump() for item in done.files],
        },
    )
    return checkpoint


def resume_point(job: Job) -> Checkpoint | None:
    """The checkpoint the job's next attempt resumes from: the newest committed one."""
    return Checkpoint.objects.filter(job=job).committed().newest_first().first()


def requeue_jobs_of_lost_node(node: Node) -> list[int]:
    """Every job holding GPUs on a lost node gets a new attempt elsewhere (from its last
    checkpoint); the node's agent, if it returns, is told to stop what it still runs."""
    return requeue_jobs_holding(
        Allocation.objects.filter(node=node, released_at__isnull=True),
        f"node {node.name} lost (no heartbeat)",
    )


def lock_jobs_holding(allocations: models.QuerySet[Allocation], and_nodes: Iterable[int] = ()) -> list[Job]:
    """Takes the row locks of the active jobs holding these allocations, then of every node they
    hold GPUs on (and of `and_nodes`), each in id order, and returns the jobs. For a writer that
    changes the nodes or GPUs under the jobs and requeues them: it locks in the order of the
    cycle and of every job transition (jobs, then nodes, then GPUs). Holding a node while it
    waited for a job deadlocked with a writer that held the job and needed the node; requeued
    one after another, the jobs' nodes were written out of id order and deadlocked with a cycle
    locking them in order (FOR SHARE)."""
    jobs = list(
        Job.objects.select_for_update()
        .filter(pk__in=allocations.values("attempt__job_id"), state__in=ACTIVE_STATES)
        .order_by("pk")
    )
    their_nodes = Allocation.objects.filter(
        attempt__job__in=[job.pk for job in jobs], released_at__isnull=True
    ).values("node_id")
    nodes = Node.objects.filter(Q(pk__in=their_nodes) | Q(pk__in=list(and_nodes)))
    list(nodes.select_for_update(no_key=True).order_by("pk").values_list("pk", flat=True))
    return jobs


@transaction.atomic
def requeue_jobs_holding(allocations: models.QuerySet[Allocation], reason: str) -> list[int]:
    """The jobs holding these allocations are lost (their attempt ends, GPUs freed) and go back to
    the queue, to resume from their last checkpoint on a new attempt. A caller that locked them
    already (lock_jobs_holding) loses nothing by their being locked again here."""
    requeued = []
    for job in lock_jobs_holding(allocations):
        attempt = job.current_attempt()
        # Read again under the job's lock: a caller that read the allocations before another one
        # requeued the job (a redelivered heartbeat check, say) would otherwise end the next
        # attempt, placed elsewhere since then.
        if attempt is None or not allocations.filter(attempt=attempt, released_at__isnull=True).exists():
            continue
        if transition_job(job, JobState.LOST, label="portal", reason=reason):
            end_attempt(job, attempt, AttemptState.LOST, None, reason)
            requeue_lost_job(job, reason)
            requeued.append(job.pk)
    return requeued


def enforce_time_limits(now: datetime, warn_before_s: int, force_after_s: int) -> dict[str, int]:
    """Warns once before a job's time limit, asks its agents to stop it at the limit within its
    own grace (the job then ends timed-out), and ends it anyway when the agents have not
    confirmed within that grace plus force_after_s. The grace is recorded with the stop
    (Job.stop_grace_s), as a preemption's is, so the request, the desired set and the forced end
    agree on it."""
    from agents.protocol import StopRequest, encode
    from portal.agentgw.desired import agent_attempt_id
    from portal.agentgw.outbox import send_request

    counts = {"warned": 0, "stopping": 0, "forced": 0}
    for job in Job.objects.filter(state__in=[JobState.RUNNING, JobState.SUSPENDED]):
        attempt = job.current_attempt()
        if attempt is None or attempt.started_at is None:
            continue
        left = job.time_limit_s - (now - attempt.started_at).total_seconds()
        with transaction.atomic():
            if 0 < left <= warn_before_s and not job.time_limit_warned:
                if Job.objects.filter(pk=job.pk, time_limit_warned=False).update(time_limit_warned=True):
                    record_job_event(job, "portal", f"reaches its time limit in {int(left)} s")
                    counts["warned"] += 1
            elif left <= 0 and not job.stop_reason:
                # Only while the attempt read above still runs: a job that was stopped, requeued
                # or ended meanwhile must not carry this stop into its next attempt or its end.
                stopping = Job.objects.filter(
                    pk=job.pk,
                    version=job.version,
                    stop_reason="",
                    state__in=[JobState.RUNNING, JobState.SUSPENDED],
                )
                # The version moves, so a cycle that read the job before cannot preempt it too.
                grace = job.grace_s(30)
                if stopping.update(
                    stop_reason="time-limit", stop_grace_s=grace, version=models.F("version") + 1
                ):
                    for replica, node_id in attempt.allocations.values_list("replica", "node_id").distinct():
                        request = StopRequest(
                            attempt_id=agent_attempt_id(attempt, replica), grace_period_s=grace
                        )
                        send_request(node_id, encode(request))
                    record_job_event(job, "portal", f"time limit of {job.time_limit_s} s reached: stopping")
                    counts["stopping"] += 1
            elif left <= -(job.asked_grace_s(0) + force_after_s) and job.stop_reason == "time-limit":
                job = Job.objects.select_for_update().get(pk=job.pk)
                # Read again under the lock: preempted, requeued or ended since, it is not this
                # attempt's to time out.
                if (
                    job.state not in (JobState.RUNNING, JobState.SUSPENDED)
                    or job.stop_reason != "time-limit"
                    or job.current_attempt() != attempt
                ):
                    continue
                if transition_job(
                    job,
                    JobState.TIMED_OUT,
                    label="portal",
                    reason="the agents did not confirm the stop in time",
                    finished_at=now,
                    end_reason="time limit reached",
                ):
                    end_attempt(job, attempt, AttemptState.STOPPED, None, "time limit reached")
                    counts["forced"] += 1
    return counts


def report_idle_jobs(now: datetime, below_pct: float, window_s: int) -> list[int]:
    """A running job whose every GPU stayed under `below_pct` utilization for the last `window_s`
    gets an event (once), which its owner and the admins see; where the VC's idle policy says so,
    an opportunistic job (priority 0 or lower) is stopped as well. Returns the jobs reported."""
    from django.db.models import Max

    from portal.cluster.choices import IdlePolicy
    from portal.jobs.models import TelemetrySample

    since = now - timedelta(seconds=window_s)
    reported = []
    candidates = Job.objects.filter(state=JobState.RUNNING, idle_reported=False, started_at__lte=since)
    for job in candidates.select_related("virtual_cluster"):
        attempt = job.current_attempt()
        if attempt is None or attempt.started_at is None or attempt.started_at > since:
            continue
        samples = TelemetrySample.objects.filter(attempt=attempt, time__gte=since)
        peak = samples.aggregate(peak=Max("utilization_pct"))["peak"]
        # Idle means measured idle: the samples must reach back to the start of the window.
        covered = samples.filter(time__lte=since + timedelta(seconds=window_s / 5)).exists()
        if peak is None or peak >= below_pct or not covered:
            continue
        with transaction.atomic():
            if not Job.objects.filter(pk=job.pk, idle_reported=False).update(idle_reported=True):
                continue
            message = f"idle: every GPU under {below_pct:g} % utilization for {window_s // 60} min"
            record_job_event(job, "portal", message, {"peak_utilization_pct": peak})
            mail_about_idle_job(job.pk, message)
            if job.virtual_cluster.idle_policy == IdlePolicy.STOP_OPPORTUNISTIC and job.priority <= 0:
                cancel_job(job, None, reason=f"stopped by the VC's idle policy ({message})")
        reported.append(job.pk)
    return reported


# (older than, bucket seconds): samples are kept as sent for an hour, in 10 s averages for a day,
# in 1 min averages after that, and not at all after TELEMETRY_RETENTION_DAYS.
DOWNSAMPLING = ((timedelta(hours=1), 10), (timedelta(days=1), 60))


def downsample_telemetry(now: datetime, retention_days: int) -> dict[str, int]:
    """Replaces old samples by per-bucket averages (the energy counter keeps its bucket maximum)
    and deletes those past retention. Idempotent: a bucket already at its resolution is left."""
    counts = {"deleted": 0}
    with transaction.atomic(), connection.cursor() as cursor:
        for age, bucket in DOWNSAMPLING:
            cutoff = now - age
            cursor.execute(
                "WITH old AS (DELETE FROM jobs_telemetrysample WHERE time < %s AND resolution_s < %s "
                "RETURNING attempt_id, gpu_uuid, time, utilization_pct, memory_used_mib, power_w, "
                "temperature_c, energy_j) "
                "INSERT INTO jobs_telemetrysample (attempt_id, gpu_uuid, time, utilization_pct, "
                "memory_used_mib, power_w, temperature_c, energy_j, resolution_s) "
                "SELECT attempt_id, gpu_uuid, date_bin(%s::interval, time, TIMESTAMPTZ '2000-01-01'), "
                "AVG(utilization_pct), AVG(memory_used_mib)::integer, AVG(power_w), AVG(temperature_c), "
                "MAX(energy_j), %s FROM old GROUP BY 1, 2, 3",
                [cutoff, bucket, f"{bucket} seconds", bucket],
            )
            counts[f"buckets_{bucket}s"] = cursor.rowcount
        cursor.execute(
            "DELETE FROM jobs_telemetrysample WHERE time < %s", [now - timedelta(days=retention_days)]
        )
        counts["deleted"] = cursor.rowcount
    return counts


# Lines deleted per statement, each in its own short transaction: a job with a great deal of
# output loses it in many brief locks, not in one long one.
LOG_DELETE_BATCH = 10_000


def delete_expired_logs(
    now: datetime, retention_days: int, batch_size: int = LOG_DELETE_BATCH
) -> dict[str, int]:
    """Deletes the output of jobs that ended (a terminal state) more than `retention_days` before
    `now`, in batches of `batch_size` lines; each such job gets one event. 0 keeps output forever.
    Idempotent: a job whose output is gone is not looked at again."""
    counts = {"jobs": 0, "lines": 0}
    if retention_days <= 0:
        return counts
    expired = (
        Job.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=now - timedelta(days=retention_days))
        .filter(Exists(LogLine.objects.filter(attempt__job=OuterRef("pk"))))
        .order_by("finished_at", "pk")
        .values_list("pk", flat=True)
    )
    for job_id in list(expired):
        deleted = _delete_job_logs(job_id, retention_days, batch_size)
        if deleted:
            counts["jobs"] += 1
            counts["lines"] += deleted
    return counts


def _delete_job_logs(job_id: int, retention_days: int, batch_size: int) -> int:
    """Deletes one job's output a batch at a time, each under the job's row lock so that two runs
    at once take turns. The batch that deletes the last lines writes the job's event in the same
    transaction, so a run stopped halfway leaves the event to the run that finishes the job."""
    deleted = 0
    while True:
        with transaction.atomic():
            job = Job.objects.select_for_update().only("id").get(pk=job_id)
            ids = list(
                LogLine.objects.filter(attempt__job_id=job_id)
                .order_by()
                .values_list("pk", flat=True)[: batch_size + 1]
            )
            if not ids:
                return deleted
            batch = ids[:batch_size]
            LogLine.objects.filter(pk__in=batch).delete()
            deleted += len(batch)
            if len(ids) <= batch_size:
                record_job_event(
                    job,
                    "portal",
                    f"output deleted after {retention_days} days",
                    {"log": "deleted", "retention_days": retention_days},
                )
                return deleted

"""The only write paths for jobs. Each state change is a compare-and-set in a transaction that
also writes a JobEvent, so a lost race changes nothing and every change leaves a trace.
"""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from portal.accounts.choices import SUBMIT_ROLES
from portal.accounts.models import Membership
from portal.accounts.services import record_audit
from portal.cluster.models import Flavor, Gpu, Node, Quota
from portal.jobs.choices import (
    ACTIVE_STATES,
    ATTEMPT_ENDED_STATES,
    TERMINAL_STATES,
    AttemptState,
    JobState,
    PendingReason,
    can_transition,
)
from portal.jobs.models import Allocation, Job, JobAttempt, JobEvent


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
    return getattr(actor, "username", None) or str(actor)


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
    from_state = job.state
    if not can_transition(from_state, to_state):
        raise InvalidTransition(f"job {job.pk}: {from_state} -> {to_state} is not allowed")
    updated = Job.objects.filter(pk=job.pk, state=from_state, version=job.version).update(
        state=to_state, version=F("version") + 1, **fields
    )
    if not updated:
        return False
    job.state = to_state
    job.version += 1
    for name, value in fields.items():
        setattr(job, name, value)
    JobEvent.objects.create(
        job=job,
        from_state=from_state,
        to_state=to_state,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        actor_label=label or actor_label(actor),
        reason=reason[:500],
        data=data or {},
    )
    return True


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


def check_job_can_ever_fit(
    vc_name: str, quota: Quota | None, resources: dict[str, Any], replicas: int
) -> None:
    """Rejects a job that would otherwise wait forever: more GPUs than its VC may ever hold, or a
    shape that no set of nodes in the cluster can hold even when empty."""
    model = resources["gpu_model"]
    per_replica = resources["gpus_per_replica"]
    total = per_replica * replicas
    if quota is None or quota.max_gpus == 0:
        raise JobRejected("vc", f"VC {vc_name} has no quota for {model} GPUs.")
    if total > quota.max_gpus:
        raise JobRejected(
            "replicas" if replicas > 1 else "resources",
            f"The job asks for {total} {model} but VC {vc_name} may hold at most {quota.max_gpus} "
            f"({quota.guaranteed} guaranteed + {quota.borrow_limit} borrowed).",
        )
    per_node = list(
        Gpu.objects.filter(model=model)
        .values("node")
        .annotate(n=models.Count("id"))
        .values_list("n", flat=True)
    )
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
    largest_cpu = Node.objects.filter(gpus__model=model).aggregate(m=models.Max("cpu"))["m"] or 0
    if largest_cpu and resources["cpu_per_replica"] > largest_cpu:
        raise JobRejected(
            "resources",
            f"Each replica asks for {resources['cpu_per_replica']} CPUs; the largest node has {largest_cpu}.",
        )
    largest_mem = Node.objects.filter(gpus__model=model).aggregate(m=models.Max("memory_gb"))["m"] or 0
    if largest_mem and resources["memory_gb_per_replica"] > largest_mem:
        raise JobRejected(
            "resources",
            f"Each replica asks for {resources['memory_gb_per_replica']} GB of memory; the largest node has "
            f"{largest_mem} GB.",
        )


def stored_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The validated spec as plain JSON, with names in place of resolved objects."""
    out = dict(spec)
    out["vc"] = spec["vc"].name
    if spec.get("flavor") is not None:
        out["flavor"] = spec["flavor"].name
    out["priority"] = spec["priority"].name
    return out


@transaction.atomic
def submit_job(user: Any, spec: dict[str, Any]) -> Job:
    """Queues a job from a spec validated by JobSpecSerializer.

    Raises PermissionDenied for viewers and JobRejected when the job could never run; in both
    cases nothing is stored. The job starts pending, with an event.
    """
    vc = spec["vc"]
    if (
        not user.is_staff
        and not Membership.objects.filter(user=user, tenant=vc.tenant, role__in=SUBMIT_ROLES).exists()
    ):
        raise PermissionDenied(f"You may not submit jobs to VC {vc.name}.")
    resources = resolve_resources(spec)
    quota = Quota.objects.filter(virtual_cluster=vc, gpu_model=resources["gpu_model"]).first()
    check_job_can_ever_fit(vc.name, quota, resources, spec["replicas"])
    pc = spec["priority"]
    job = Job.objects.create(
        tenant=vc.tenant,
        virtual_cluster=vc,
        owner=user,
        name=spec["name"],
        spec=stored_spec(spec),
        priority_class=pc,
        priority=pc.value,
        preemptible=pc.preemptible,
        replicas=spec["replicas"],
        retries_left=spec["retries"]["limit"],
        state=JobState.PENDING,
        pending_reason=PendingReason.NEW,
        pending_message="Waiting for the next scheduling cycle.",
        **resources,
    )
    JobEvent.objects.create(
        job=job,
        from_state="",
        to_state=JobState.PENDING,
        actor=user,
        actor_label=actor_label(user),
        reason="submitted",
    )
    record_audit(user, "job.submit", job, tenant=vc.tenant)
    return job


def release_allocations(job: Job) -> int:
    """Ends the job's current attempt and frees its GPUs; returns how many GPUs were freed."""
    now = timezone.now()
    JobAttempt.objects.filter(job=job).exclude(state__in=ATTEMPT_ENDED_STATES).update(
        state=AttemptState.STOPPED, ended_at=now
    )
    return Allocation.objects.filter(attempt__job=job, released_at__isnull=True).update(released_at=now)


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
        finished_at=timezone.now(),
        pending_reason="",
        pending_message="",
        estimated_start_at=None,
        queue_position=None,
        end_reason=reason,
    )
    if was_active:
        release_allocations(job)
    record_audit(actor, "job.cancel", job, tenant=job.tenant)
    return job

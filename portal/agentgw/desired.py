"""The full set of attempts a node should run, built from live allocations (level-triggered)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings

from agents.protocol import DesiredAttempt, DesiredSet, GpuRef, Mount, Resources, ResumeFrom
from portal.cluster.models import Node
from portal.jobs.choices import ACTIVE_STATES, JobState
from portal.jobs.models import Allocation, Checkpoint, Job, JobAttempt


def agent_attempt_id(attempt: JobAttempt, replica: int) -> str:
    """One agent-side attempt per replica: a gang's replicas run and report independently."""
    return f"{attempt.pk}.{replica}"


def parse_agent_attempt_id(value: str) -> tuple[int, int] | None:
    attempt, _, replica = value.partition(".")
    if not (attempt.isdigit() and replica.isdigit()):
        return None
    return int(attempt), int(replica)


def checkpoint_dir(job: Job) -> str:
    return str(PurePosixPath(settings.CHECKPOINT_ROOT) / job.tenant.name / str(job.pk))


def job_mounts(job: Job) -> list[Mount]:
    """Volumes by name, resolved through the VC's admin-allowed list; never a user's host path."""
    allowed = {m.get("name"): m for m in job.virtual_cluster.allowed_mounts or []}
    mounts = []
    for mount in job.spec.get("mounts", []):
        volume = allowed.get(mount["name"])
        if volume is None:  # the admin withdrew it after submission
            continue
        read_only = mount.get("read_only", True) or not volume.get("writable", False)
        mounts.append(Mount(source=volume["host_path"], target=mount["path"], read_only=read_only))
    return mounts


def resume_from(job: Job, checkpoint: Checkpoint | None) -> ResumeFrom | None:
    """What the agent checks before a resume: the committed manifest (older checkpoints, committed
    before manifests existed, have none; the job then reads its marker as before)."""
    if checkpoint is None or not checkpoint.manifest_sha256:
        return None
    job_dir, path = PurePosixPath(checkpoint_dir(job)), PurePosixPath(checkpoint.path)
    return ResumeFrom(
        step=checkpoint.step,
        path=str(path.relative_to(job_dir)) if path.is_relative_to(job_dir) else path.name,
        manifest_path=checkpoint.manifest_path,
        manifest_sha256=checkpoint.manifest_sha256,
    )


def replica_resources(job: Job, attempt: JobAttempt) -> Resources:
    """A replica's CPU and memory limits: the job's own, or its share when the attempt spread
    the job over one-GPU replicas."""
    cpu_milli, memory_mib = job.resources_per_replica(attempt.replicas)
    return Resources(cpus=cpu_milli / 1000, memory_mib=memory_mib)


def desired_grace_s(job: Job, profile_grace_s: float) -> float:
    """The grace the desired set gives the attempt: what its agent gives it when a set has it
    stop (checkpoint_and_stop, or the attempt left out), the newest set that listed it. While
    the job is being stopped (checkpointing, or at its time limit) that is the grace the stop was
    asked with, recorded with the ask, as the request said: an agent whose request was lost
    gives the same. Otherwise it is what a preemption by the scheduler would give, the stop an
    agent most often learns of from a set alone."""
    preemption = job.preemption_grace_s(profile_grace_s)
    being_stopped = job.state == JobState.CHECKPOINTING or bool(job.stop_reason)
    return job.asked_grace_s(preemption) if being_stopped else preemption


def desired_attempt(
    attempt: JobAttempt,
    replica: int,
    allocations: list[Allocation],
    replica_nodes: list[str],
    profile_grace_s: float,
) -> DesiredAttempt:
    job = attempt.job
    spec: dict[str, Any] = job.spec
    checkpoint = spec.get("checkpoint") or {}
    return DesiredAttempt(
        attempt_id=agent_attempt_id(attempt, replica),
        job_id=str(job.pk),
        image=spec.get("image") or "",
        command=spec["command"],
        env={**(spec.get("env") or {}), **job.secret_env},
        mounts=job_mounts(job),
        resources=replica_resources(job, attempt),
        gpus=[
            GpuRef(uuid=a.gpu.uuid, index=a.gpu.index) for a in sorted(allocations, key=lambda a: a.gpu.index)
        ],
        checkpoint_dir=checkpoint_dir(job),
        resume=attempt.resume,
        checkpoint_signal=checkpoint.get("signal", "SIGUSR1"),
        grace_period_s=desired_grace_s(job, profile_grace_s),
        time_sliced=bool(spec.get("time_sliceable")),
        run_state="suspended" if job.state == JobState.SUSPENDED else "running",
        # Preemption of a checkpointable job, level-triggered: it survives a lost request.
        checkpoint_and_stop=job.state == JobState.CHECKPOINTING and bool(checkpoint.get("enabled")),
        resume_from=resume_from(job, attempt.resume_from),
        replica=replica,
        replicas=attempt.replicas,
        replica_nodes=replica_nodes,
    )


def must_stop(job: Job) -> bool:
    """A preempted (or paused, or drained) job without checkpointing: it is stopped, not
    checkpointed. Its attempt leaves the desired set, which the agent reads as "stop it" (SIGTERM,
    then SIGKILL after its grace period) on every set it applies, so the stop is level-triggered
    like checkpoint_and_stop: an agent that missed the one-shot StopRequest (it was not connected)
    still stops the attempt when it reconnects, and its report of the end requeues the job."""
    return job.state == JobState.CHECKPOINTING and not (job.spec.get("checkpoint") or {}).get("enabled")


def desired_set_for(node: Node) -> DesiredSet:
    from scheduler.tasks import load_profile  # imported here: scheduler.store imports this module

    revision = Node.objects.values_list("desired_revision", flat=True).get(pk=node.pk)
    allocations = (
        Allocation.objects.filter(node=node, released_at__isnull=True, attempt__job__state__in=ACTIVE_STATES)
        .select_related(
            "gpu", "attempt__job__tenant", "attempt__job__virtual_cluster", "attempt__resume_from"
        )
        .defer("attempt__resume_from__manifest")  # the agent reads the manifest from the store
        .order_by("attempt_id", "replica")
    )
    grouped: dict[tuple[int, int], list[Allocation]] = defaultdict(list)
    attempts: dict[int, JobAttempt] = {}
    for allocation in allocations:
        if must_stop(allocation.attempt.job):
            continue  # left out: the agent stops what is not desired
        grouped[(allocation.attempt_id, allocation.replica)].append(allocation)
        attempts[allocation.attempt_id] = allocation.attempt
    nodes = replica_nodes(list(attempts))
    profile_grace_s = load_profile().cycle.grace_period_s  # a small file, read once per set
    return DesiredSet(
        revision=revision,
        attempts=[
            desired_attempt(attempts[attempt_id], replica, group, nodes[attempt_id], profile_grace_s)
            for (attempt_id, replica), group in grouped.items()
        ],
    )


def replica_nodes(attempt_ids: list[int]) -> dict[int, list[str]]:
    """The node of each replica of each attempt, in replica order, in one query: a replica on
    this node needs to know where its peers on other nodes run."""
    placed: dict[int, dict[int, str]] = defaultdict(dict)
    live = Allocation.objects.filter(attempt_id__in=attempt_ids, released_at__isnull=True)
    for attempt_id, replica, node_name in live.values_list("attempt_id", "replica", "node__name"):
        placed[attempt_id][replica] = node_name
    return {attempt: [node for _, node in sorted(placed[attempt].items())] for attempt in attempt_ids}

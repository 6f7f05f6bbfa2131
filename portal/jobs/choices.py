"""Job and attempt states, with the allowed transitions in one table."""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    SCHEDULED = "scheduled", "Scheduled"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    SUSPENDED = "suspended", "Suspended"
    CHECKPOINTING = "checkpointing", "Checkpointing"
    PREEMPTED = "preempted", "Preempted"
    LOST = "lost", "Lost"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    TIMED_OUT = "timed-out", "Timed out"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})

# States in which the job holds GPUs (its current attempt has live allocations).
ACTIVE_STATES = frozenset(
    {JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING, JobState.SUSPENDED, JobState.CHECKPOINTING}
)

ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    JobState.PENDING: frozenset({JobState.SCHEDULED, JobState.CANCELLED, JobState.FAILED}),
    JobState.SCHEDULED: frozenset(
        {JobState.STARTING, JobState.RUNNING, JobState.PENDING, JobState.CANCELLED, JobState.LOST}
    ),
    # -> pending from starting or running: a transient failure with retries left.
    JobState.STARTING: frozenset(
        {
            JobState.RUNNING,
            JobState.PENDING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMED_OUT,
            JobState.LOST,
        }
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.PENDING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMED_OUT,
            JobState.SUSPENDED,
            JobState.CHECKPOINTING,
            JobState.PREEMPTED,
            JobState.LOST,
        }
    ),
    # A suspended job's process may still end: it exited just as it was frozen, or was killed
    # while frozen. Its attempt ends as a running one's would (pending: a retry).
    JobState.SUSPENDED: frozenset(
        {
            JobState.RUNNING,
            JobState.CHECKPOINTING,
            JobState.PENDING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMED_OUT,
            JobState.LOST,
        }
    ),
    # -> pending from checkpointing: a replica failed on its own before it was stopped, and
    # retries remain.
    JobState.CHECKPOINTING: frozenset(
        {
            JobState.PREEMPTED,
            JobState.PENDING,
            JobState.RUNNING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMED_OUT,
            JobState.LOST,
        }
    ),
    JobState.PREEMPTED: frozenset({JobState.PENDING, JobState.CANCELLED}),
    JobState.LOST: frozenset({JobState.PENDING, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMED_OUT: frozenset(),
}


def can_transition(from_state: str, to_state: str) -> bool:
    return to_state in ALLOWED_TRANSITIONS.get(from_state, frozenset())


class DependencyType(models.TextChoices):
    """How the jobs of a spec's `after` let it start, named as Slurm's dependency types (afterok,
    afterany, afternotok) without the prefix, so that Slurm users recognise them."""

    OK = "ok", "once they all succeeded"
    ANY = "any", "once they all ended"
    NOTOK = "notok", "once they all ended, if one did not succeed"


class AttemptState(models.TextChoices):
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    SUSPENDED = "suspended", "Suspended"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped"
    LOST = "lost", "Lost"


ATTEMPT_ENDED_STATES = frozenset(
    {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.STOPPED, AttemptState.LOST}
)


# Pending reasons the portal sets itself; after a cycle a job carries the scheduler's reason
# code instead (scheduler.core.ReasonCode: vc-quota, fragmentation, gang-nodes, ...).
PENDING_NEW = "new"
PENDING_REQUEUED = "requeued"
# Requeued after a migration moved it (the scheduler's `defrag`): the next cycle places it
# right after the jobs that waited for their victims, ahead of the rest of the queue.
PENDING_MOVED = "moved"
PENDING_BACKOFF = "backoff"
# Waits for the jobs of its spec's `after` (to succeed, or to end: its `after_type`); the
# scheduler does not see it until then.
PENDING_DEPENDENCY = "dependency"
# Held by its owner or a tenant admin (Slurm's `scontrol hold`) until released.
PENDING_HELD = "held"

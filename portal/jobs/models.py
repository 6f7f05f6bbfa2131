"""Jobs, their attempts, GPU allocations and the event log.

Every state change goes through portal.jobs.services, which compares and sets the state and
writes a JobEvent in the same transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from portal.accounts.choices import Role
from portal.accounts.models import Tenant
from portal.cluster.models import Gpu, Node, PriorityClass, VirtualCluster
from portal.jobs.choices import AttemptState, DependencyType, JobState
from portal.lib.encryption import EncryptedJSONField

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


class JobQuerySet(models.QuerySet["Job"]):
    def for_user(self, user: AbstractBaseUser | AnonymousUser) -> JobQuerySet:
        """Jobs of the user's tenants (any role); cluster admins (staff) see all."""
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self.all()
        return self.filter(tenant__memberships__user=user)

    def manageable_by(self, user: AbstractBaseUser | AnonymousUser) -> JobQuerySet:
        """Jobs the user may cancel: their own (unless a viewer), or all of a tenant they administer."""
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self.all()
        return self.filter(
            Q(tenant__memberships__user=user, tenant__memberships__role=Role.ADMIN)
            | Q(owner=user, tenant__memberships__user=user, tenant__memberships__role=Role.MEMBER)
        ).distinct()


class Job(models.Model):
    """A user's request to run a workload: a validated spec plus its scheduling state.

    The resource fields are copied out of the spec at submission, so the scheduler reads columns,
    not JSON. `version` increases with every transition for compare-and-set updates.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    virtual_cluster = models.ForeignKey(VirtualCluster, on_delete=models.PROTECT, related_name="jobs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=100)
    spec = models.JSONField()
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="jobs")
    priority = models.IntegerField()
    preemptible = models.BooleanField(default=True)

    gpu_model = models.CharField(max_length=32)
    gpus_per_replica = models.PositiveIntegerField()
    replicas = models.PositiveIntegerField(default=1)
    cpu_per_replica = models.PositiveIntegerField()
    memory_gb_per_replica = models.PositiveIntegerField()
    time_limit_s = models.PositiveIntegerField()

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING, db_index=True)
    version = models.PositiveIntegerField(default=0)
    pending_reason = models.CharField(
        max_length=32, blank=True, help_text="A code: new, requeued, or the scheduler's."
    )
    pending_message = models.CharField(max_length=500, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    after = ArrayField(
        models.BigIntegerField(),
        default=list,
        blank=True,
        help_text="Jobs this one waits for (the spec's `after`); how, says after_type.",
    )
    after_type = models.CharField(
        max_length=8,
        choices=DependencyType.choices,
        default=DependencyType.OK,
        help_text=(
            "When the jobs of `after` let it start: ok once they all succeeded, any once they all "
            "ended, notok once they all ended if one did not succeed."
        ),
    )
    notify_on = ArrayField(
        models.CharField(max_length=16),
        default=list,
        blank=True,
        help_text="States the owner is mailed about (the spec's `notify`); read back by each transition.",
    )
    on_hold = models.BooleanField(
        default=False, help_text="Its owner or a tenant admin holds it: it does not start until released."
    )
    topped_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its owner moved it to the front of their own jobs of its VC and priority class.",
    )
    # The values of the spec's secret_env (the spec keeps only masks): for the job's agents only,
    # encrypted at rest.
    secret_env = EncryptedJSONField(default=dict, blank=True)
    whatif_hints = models.JSONField(
        default=list,
        blank=True,
        help_text="The scheduler's what-if hints, cheapest change first.",
    )
    retries_left = models.PositiveIntegerField(default=0)
    not_before = models.DateTimeField(null=True, blank=True, help_text="A retry waits until then.")
    stop_reason = models.CharField(
        max_length=32, blank=True, help_text="Why the portal asked the agents to stop it, e.g. time-limit."
    )
    stop_grace_s = models.FloatField(
        null=True,
        blank=True,
        help_text="The grace period (seconds) its newest stop was asked with, recorded with the ask.",
    )
    time_limit_warned = models.BooleanField(default=False)
    idle_reported = models.BooleanField(default=False)
    exit_code = models.IntegerField(null=True, blank=True)
    end_reason = models.CharField(max_length=500, blank=True)

    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "virtual_cluster"]),
            # A user's waiting jobs in a VC, counted at each submission to a VC that limits them.
            models.Index(
                fields=["virtual_cluster", "owner"],
                condition=models.Q(state="pending"),
                name="pending_per_user",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    def resources_per_replica(self, replicas: int) -> tuple[int, int]:
        """CPU (thousandths) and memory (MiB) of one replica when the job runs as `replicas`
        replicas: its own shape, or spread over one-GPU replicas (rounded up, as the core
        divides them)."""
        cpu_milli = self.cpu_per_replica * 1000 * self.replicas
        memory_mib = self.memory_gb_per_replica * 1024 * self.replicas
        return -(-cpu_milli // replicas), -(-memory_mib // replicas)

    def grace_s(self, default: float) -> float:
        """The grace period the job's spec gives it to save and stop (`checkpoint.grace_seconds`),
        `default` where the spec gives none. A stop's grace starts from it and is then recorded
        (asked_grace_s), so that the agents and the portal's sweeps agree on how long it may take."""
        return float((self.spec.get("checkpoint") or {}).get("grace_seconds", default))

    def preemption_grace_s(self, profile_grace_s: float) -> float:
        """What a preemption by the scheduler gives it: its own grace (how long it needs to save),
        never longer than the profile allows."""
        return min(profile_grace_s, self.grace_s(profile_grace_s))

    def asked_grace_s(self, default: float) -> float:
        """The grace its stop under way was asked with (`stop_grace_s`), `default` for a stop
        asked before the grace was recorded. A stop's grace is recorded once, in the transaction
        that asks for it, and read from there by every path that tells the agents about that stop
        (the request, the desired set) and by the sweeps that end a stop never confirmed: they
        cannot disagree on how long it may take."""
        return self.stop_grace_s if self.stop_grace_s is not None else default

    def current_attempt(self) -> JobAttempt | None:
        """The newest attempt: the one agents run, or the last one that ran."""
        return self.attempts.order_by("-number").first()


class JobAttempt(models.Model):
    """One run of a job on one placement. A requeued job gets a new attempt."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=AttemptState.choices, default=AttemptState.STARTING)
    resume = models.BooleanField(default=False, help_text="Starts from the job's last checkpoint.")
    # How many replicas this attempt runs: the job's own, or one per GPU when the job spread
    # over nodes after waiting (spec `spread_after`).
    replicas = models.PositiveIntegerField(default=1)
    # The committed checkpoint this attempt starts from; garbage collection keeps it while the
    # attempt lives.
    resume_from = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="resumed_attempts"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Time-slicing: when the attempt last resumed after a suspension; its turn (quantum) on
    # the GPUs counts from here, or from created_at if it was never suspended.
    resumed_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    end_reason = models.CharField(max_length=500, blank=True)
    # What the agents last reported per replica: {"0": {"state": "running", "generation": 3,
    # "exit_code": null, "reason": null, "node": "a100-node-1", "message": ""}}. Reports are
    # accepted only when they supersede the stored one (agents.protocol.states), so late ones
    # change nothing.
    replica_states = models.JSONField(default=dict, blank=True)
    # The attempt's stored output, all replicas and streams together, counted as its lines are
    # stored, so that the cap (LOG_MAX_BYTES_PER_ATTEMPT) costs no sum over LogLine per chunk.
    log_bytes = models.PositiveBigIntegerField(
        default=0, help_text="Bytes of output stored: each line's UTF-8 and its newline."
    )
    log_truncated = models.BooleanField(
        default=False, help_text="Output past LOG_MAX_BYTES_PER_ATTEMPT was not kept."
    )

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="one_attempt_number_per_job")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number}"


class Suspension(models.Model):
    """One period in which a time-sliced attempt was suspended: its processes paused, its GPUs
    used by the job that took its turn. It is open (no `ended_at`) exactly while the job is
    suspended; the transition out of that state ends it (portal.jobs.services.transition_jobs).

    The periods themselves are kept, not a running total, because usage reports and monthly
    budgets count a period's part only: a suspension across a month's turn is left out of each
    month for its own part (portal.jobs.accounting.suspended_within)."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="suspensions")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt"], condition=Q(ended_at__isnull=True), name="one_open_suspension_per_attempt"
            )
        ]

    def __str__(self) -> str:
        return f"{self.attempt} suspended at {self.started_at:%Y-%m-%d %H:%M:%S}"


class AllocationQuerySet(models.QuerySet["Allocation"]):
    def holding(self) -> AllocationQuerySet:
        """Allocations that hold their GPU now: not released, and not parked by a suspension."""
        return self.filter(released_at__isnull=True, suspended=False)


class Allocation(models.Model):
    """An attempt's hold on one GPU. The database forbids two live allocations of one GPU.

    A time-sliced attempt that is suspended keeps its allocations, marked `suspended`: they
    say where it waits to resume, but leave the GPU to the job that took its turn. Resuming
    clears the mark, and the constraint then guards the GPU again.
    """

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    replica = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)
    suspended = models.BooleanField(default=False)

    objects = AllocationQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True, suspended=False),
                name="one_live_allocation_per_gpu",
            )
        ]
        # For the month's allocations (those held or released since it began), which every cycle
        # counts while a VC has a GPU-hour budget (portal.cluster.budgets).
        indexes = [models.Index(fields=["released_at"], name="allocation_released_at")]

    def __str__(self) -> str:
        return f"{self.attempt} on {self.gpu}"


class JobEvent(models.Model):
    """One transition of a job (from, to, who, why), or a notable event without a transition."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=64, help_text="user name, 'scheduler', or an agent's node")
    reason = models.CharField(max_length=500, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state or '-'} -> {self.to_state or '-'}"


class LogLine(models.Model):
    """One line of a job's output, numbered per attempt, replica and stream by the agent.

    Agents may send a chunk again after a reconnect; the unique key makes that harmless.
    """

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="log_lines")
    replica = models.PositiveIntegerField(default=0)
    stream = models.CharField(max_length=6)
    seq = models.PositiveIntegerField()
    text = models.TextField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["attempt", "replica", "stream", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "replica", "stream", "seq"], name="one_log_line_per_seq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.attempt} replica {self.replica} {self.stream}:{self.seq}"


class CheckpointQuerySet(models.QuerySet["Checkpoint"]):
    def committed(self) -> CheckpointQuerySet:
        """Checkpoints an attempt may resume from: not condemned by garbage collection."""
        return self.filter(state=Checkpoint.State.COMMITTED)

    def newest_first(self) -> CheckpointQuerySet:
        """In commit order, newest first: the first is what the next attempt resumes from."""
        return self.order_by("-created_at", "-id")


class Checkpoint(models.Model):
    """A checkpoint a job wrote, committed together with its manifest (every file with its size
    and sha256) in one transaction; the next attempt resumes from the newest committed one.

    Garbage collection moves a checkpoint to `deleting` in the transaction that checks that no
    attempt refers to it, and to `deleted` only once its files are gone.
    """

    class State(models.TextChoices):
        COMMITTED = "committed", "Committed"
        DELETING = "deleting", "Deleting"
        DELETED = "deleted", "Deleted"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="checkpoints")
    path = models.CharField(max_length=4096)
    size_bytes = models.PositiveBigIntegerField()
    step = models.PositiveBigIntegerField()
    written_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    metric = models.FloatField(null=True, blank=True, help_text="How good it is, from the job's marker.")
    metric_mode = models.CharField(max_length=3, default="min", help_text="min or max: which metric is best.")
    manifest_path = models.CharField(
        max_length=4096,
        blank=True,
        help_text="The manifest file, relative to the job's checkpoint directory.",
    )
    manifest_sha256 = models.CharField(max_length=64, blank=True)
    manifest = models.JSONField(default=list, blank=True, help_text="[{path, size, sha256}] of every file.")
    state = models.CharField(max_length=9, choices=State.choices, default=State.COMMITTED, db_index=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["job", "-written_at"]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step}"


class TelemetrySample(models.Model):
    """One reading of one GPU while it was allocated to an attempt: the job's GPU history."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="telemetry")
    gpu_uuid = models.CharField(max_length=96)
    time = models.DateTimeField()
    utilization_pct = models.FloatField(null=True)
    memory_used_mib = models.IntegerField(null=True)
    power_w = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)
    energy_j = models.FloatField(null=True, help_text="The GPU's energy counter (NVML), when it has one.")
    resolution_s = models.PositiveIntegerField(
        default=0, help_text="0: as sampled; else the bucket averaged."
    )

    class Meta:
        ordering = ["attempt", "time"]
        indexes = [models.Index(fields=["attempt", "time"])]

    def __str__(self) -> str:
        return f"{self.gpu_uuid} at {self.time:%H:%M:%S}"


class JobTemplateQuerySet(models.QuerySet["JobTemplate"]):
    def visible_to(self, user: AbstractBaseUser | AnonymousUser) -> JobTemplateQuerySet:
        """The user's own templates and the shared ones of their tenants; never another
        tenant's, whoever asks (a template is a user's, not the cluster's). A member removed
        from a tenant loses its templates, their own too, as they lose its jobs: a template
        names the tenant's VC and is the tenant's to keep. A cluster admin, who may save one
        for any tenant, keeps their own."""
        if not user.is_authenticated:
            return self.none()
        tenants = Tenant.objects.filter(memberships__user=user)
        own = Q(owner=user) if user.is_staff else Q(owner=user, tenant__in=tenants)
        return self.filter(own | Q(shared=True, tenant__in=tenants))


class JobTemplate(models.Model):
    """A saved job spec to submit again (OpenPAI's marketplace, Determined's templates).

    `spec` is kept as the user gave it, so that it submits as POST /api/v1/jobs/ takes it; it
    was valid when saved. `tenant` is that of the spec's VC: a shared template is offered to
    that tenant's members.
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="job_templates"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="job_templates")
    name = models.SlugField(max_length=100)
    description = models.CharField(max_length=300, blank=True)
    spec = models.JSONField()
    shared = models.BooleanField(default=False, help_text="Offered to every member of the tenant.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = JobTemplateQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="one_template_name_per_owner")]

    def __str__(self) -> str:
        return f"{self.name} of {self.owner}"

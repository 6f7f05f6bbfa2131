"""The cluster: virtual clusters with quotas, flavors, priority classes, nodes and their GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from portal.accounts.models import Tenant
from portal.cluster.choices import IdlePolicy, NodeState, QueueingPolicy, StopPolicy

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


class VirtualClusterQuerySet(models.QuerySet["VirtualCluster"]):
    def for_user(self, user: AbstractBaseUser | AnonymousUser) -> VirtualClusterQuerySet:
        """Virtual clusters of the user's tenants; cluster admins (staff) see all."""
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self.all()
        return self.filter(tenant__memberships__user=user).distinct()


class VirtualCluster(models.Model):
    """A tenant's queue with quotas per GPU model. Names are unique across the cluster.

    `allowed_mounts` lists the host paths an admin lets this VC's jobs mount, as
    [{"name": "datasets", "host_path": "/srv/datasets", "writable": false}]; a job refers to them
    by name and never names a host path itself.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="virtual_clusters")
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)
    queueing_policy = models.CharField(
        max_length=16, choices=QueueingPolicy.choices, default=QueueingPolicy.PROFILE, blank=True
    )
    max_gpus_per_user = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="GPUs one user's running jobs may hold in this VC; a job that would take its user "
        "past it waits, one that asks for more on its own is refused. Empty means no limit.",
    )
    max_cpus_per_user = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="CPUs one user's running jobs may hold in this VC, all replicas counted; a job "
        "that would take its user past it waits, one that asks for more on its own is refused. "
        "Empty means no limit.",
    )
    max_memory_gb_per_user = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="GB of memory one user's running jobs may hold in this VC, all replicas counted; "
        "a job that would take its user past it waits, one that asks for more on its own is "
        "refused. Empty means no limit.",
    )
    max_pending_jobs_per_user = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="How many jobs one user may have waiting in this VC (Slurm's MaxSubmitJobs, "
        "counting pending jobs only); a submission past it is refused. Empty means no limit.",
    )
    gpu_hours_per_month = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="GPU-hours this VC's jobs may hold per calendar month (UTC), counted as the usage "
        "report counts allocated GPU time. Once they have, none of its waiting jobs starts until "
        "the next month or until the budget is raised; its running jobs go on. Empty means no budget.",
    )
    # The highest share of its budget (BUDGET_NOTICE_PCTS) the VC's tenant admins were told of,
    # and for which month: each level is told once a month (portal.cluster.budgets).
    budget_notice_month = models.DateField(null=True, blank=True, editable=False)
    budget_notice_pct = models.PositiveSmallIntegerField(default=0, editable=False)
    allowed_mounts = models.JSONField(default=list, blank=True)
    stop_policy = models.CharField(
        max_length=16, choices=StopPolicy.choices, default=StopPolicy.OPEN, blank=True
    )
    idle_policy = models.CharField(max_length=24, choices=IdlePolicy.choices, default=IdlePolicy.NOTIFY)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VirtualClusterQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = "virtual cluster"

    def __str__(self) -> str:
        return self.name

    def per_user_excess(self, replicas: int, gpus: int, cpus: int, memory_gb: int) -> str:
        """Why a job of `replicas` replicas of this much each could never start in this VC: on
        its own it asks for more than a per-user cap allows ("" when it does not). The
        scheduler would keep it waiting for its user's other jobs to end, in vain."""
        asks = (
            (gpus, self.max_gpus_per_user, "", "GPUs"),
            (cpus, self.max_cpus_per_user, "", "CPUs"),
            (memory_gb, self.max_memory_gb_per_user, " GB", "GB of memory"),
        )
        for per_replica, cap, unit, what in asks:
            if cap is None or per_replica * replicas <= cap:
                continue
            shape = f" ({replicas} replicas of {per_replica}{unit})" if replicas > 1 else ""
            return (
                f"The job asks for {per_replica * replicas} {what}{shape} but VC {self.name} allows "
                f"one user at most {cap}{unit}, so it could never start."
            )
        return ""


class Quota(models.Model):
    """GPUs of one model a VC is guaranteed, and how many more it may borrow while others idle.

    Guaranteed GPUs are reclaimable for the VC within a grace period; borrowed GPUs are used
    preemptibly. A VC never holds more than guaranteed + borrow_limit of a model.

    `lending_limit` (Kueue's lendingLimit) caps how many of the VC's idle guaranteed GPUs other
    VCs may borrow. The rest of the guarantee is kept free, so the VC's jobs start at once
    instead of after reclaiming GPUs from borrowers. Empty lends them all; 0 lends none.
    """

    virtual_cluster = models.ForeignKey(VirtualCluster, on_delete=models.CASCADE, related_name="quotas")
    gpu_model = models.CharField(max_length=32)
    guaranteed = models.PositiveIntegerField(default=0)
    borrow_limit = models.PositiveIntegerField(default=0)
    lending_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="How many of the idle guaranteed GPUs other VCs may borrow; the rest stay free "
        "for this VC's jobs, which then start without waiting for a reclaim. Empty lends them all, "
        "0 lends none.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["virtual_cluster", "gpu_model"], name="one_quota_per_vc_and_model"
            )
        ]
        ordering = ["virtual_cluster__name", "gpu_model"]

    def __str__(self) -> str:
        return f"{self.virtual_cluster} {self.gpu_model}: {self.guaranteed} + {self.borrow_limit}"

    def clean(self) -> None:
        """A VC can lend only GPUs it is guaranteed."""
        super().clean()
        if (
            self.lending_limit is not None
            and self.guaranteed is not None
            and self.lending_limit > self.guaranteed
        ):
            raise ValidationError(
                {
                    "lending_limit": f"At most {self.guaranteed}, the GPUs guaranteed: "
                    "a VC lends only GPUs of its guarantee."
                }
            )

    @property
    def max_gpus(self) -> int:
        return self.guaranteed + self.borrow_limit


class Flavor(models.Model):
    """A named per-replica bundle of resources with a run-time limit, e.g. m-A100.

    Every amount is at least 1, in the form and in the database: a flavor of 0 GPUs (or CPUs,
    memory, hours) can hold no job, and submissions naming it failed with a server error.
    """

    name = models.SlugField(max_length=64, unique=True)
    gpu_model = models.CharField(max_length=32)
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    cpu = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_gb = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_runtime_hours = models.PositiveIntegerField(validators=[MinValueValidator(1)])

    class Meta:
        ordering = ["gpu_model", "gpus"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(gpus__gte=1, cpu__gte=1, memory_gb__gte=1, max_runtime_hours__gte=1),
                name="flavor_amounts_at_least_1",
            )
        ]

    def __str__(self) -> str:
        return self.name


class PriorityClass(models.Model):
    """A named priority. Higher values go first and may preempt lower, preemptible ones."""

    name = models.SlugField(max_length=64, unique=True)
    value = models.IntegerField()
    preemptible = models.BooleanField(default=True)
    is_default = models.BooleanField(default=False, help_text="Used when a job names no priority.")
    tenant_admins_only = models.BooleanField(
        default=False,
        help_text="Only a tenant's admins (and cluster admins) may submit jobs of this class.",
    )
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-value"]
        verbose_name_plural = "priority classes"
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=models.Q(is_default=True), name="one_default_priority_class"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.value})"


class Node(models.Model):
    """A GPU host run by one agent. The agent authenticates with a per-node token, stored hashed.

    A revoked node keeps its token hash, so that its agent is recognised and refused (and the
    refusal counted against it), until it enrolls again with a new enrollment token.
    """

    name = models.SlugField(max_length=100, unique=True)
    rack = models.CharField(max_length=64, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.NOT_READY)
    state_reason = models.CharField(max_length=200, blank=True)
    cpu = models.PositiveIntegerField(default=0)
    memory_gb = models.PositiveIntegerField(default=0)
    token_hash = models.CharField(max_length=64, blank=True, editable=False)
    revoked_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When an admin revoked the agent's credentials."
    )
    agent_version = models.CharField(max_length=64, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    desired_revision = models.PositiveBigIntegerField(
        default=0, help_text="Increases whenever what this node should run changes."
    )
    # The first hello after registration or enrollment sets the node's GPUs; later ones may not
    # add or change any (a compromised agent claiming GPUs would draw other tenants' jobs and
    # their secrets). What an agent reported beyond them waits here for an admin to accept.
    inventory_accepted = models.BooleanField(default=False, editable=False)
    reported_gpus = models.JSONField(default=list, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    """One GPU with the topology the scheduler scores placements by (Gandiva's affinity order)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=32, db_index=True)
    memory_mb = models.PositiveIntegerField()
    nvlink_group = models.PositiveSmallIntegerField(default=0)
    pcie_switch = models.PositiveSmallIntegerField(default=0)
    numa_node = models.PositiveSmallIntegerField(default=0)
    healthy = models.BooleanField(default=True)
    health_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="one_gpu_per_node_index")]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index} ({self.model})"


class GpuHealthEvent(models.Model):
    """A change of a GPU's health: the GPU's history, kept by UUID, so a card that fails again
    after a repair, or moves to another slot or node, shows its past (errors cluster on cards,
    and a card with a history is one to retire)."""

    gpu_uuid = models.CharField(max_length=64, db_index=True)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpu_health_events")
    gpu_index = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    healthy = models.BooleanField()
    reason = models.CharField(max_length=200, blank=True)
    actor = models.CharField(max_length=150)  # "agent NODE" or the admin who cleared it

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name = "GPU health event"

    def __str__(self) -> str:
        return f"{self.gpu_uuid}: {'healthy' if self.healthy else 'unhealthy'} ({self.reason})"


class EnrollmentTokenQuerySet(models.QuerySet["EnrollmentToken"]):
    def usable(self) -> EnrollmentTokenQuerySet:
        return self.filter(used_at__isnull=True, expires_at__gt=timezone.now())


class EnrollmentToken(models.Model):
    """A one-time, short-lived secret an agent exchanges for its node's own token.

    Only the hash is stored. A token bound to a node name enrolls only that node, and is the only
    way to give an existing node new credentials; an unbound one may only create a new node, so
    that it can never take over a node that already exists.
    """

    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    node_name = models.SlugField(
        max_length=100, blank=True, help_text="The node this token may enroll; empty: any new node."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="enrollments"
    )

    objects = EnrollmentTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        expires = f"{self.expires_at:%Y-%m-%d %H:%M}" if self.expires_at else "-"
        return f"enrollment token for {self.node_name or 'a new node'} (expires {expires})"

"""Typed views of the portal's REST resources.

Unknown fields are ignored, so a newer portal that adds fields does not break an older
client; fields this client needs are declared with the types the API documents.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "timed-out"})


class _Resource(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Membership(_Resource):
    tenant: str
    role: str


class Me(_Resource):
    username: str
    is_staff: bool = False
    memberships: list[Membership] = []


class Allocation(_Resource):
    replica: int
    node: str
    gpu_index: int
    gpu_uuid: str
    created_at: datetime | None = None
    released_at: datetime | None = None


class ReplicaStatus(_Resource):
    """One replica of an attempt as its node's agent last reported it."""

    replica: int
    node: str = ""
    state: str | None = None  # the agent's (starting, running, exited, ...); None until reported
    message: str = ""  # e.g. an image pull's progress while starting
    exit_code: int | None = None


class Attempt(_Resource):
    number: int
    state: str
    resume: bool = False
    created_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    exit_code: int | None = None
    end_reason: str = ""
    allocations: list[Allocation] = []
    replicas_status: list[ReplicaStatus] = []


class WhatIfHint(_Resource):
    """A change to a waiting job's request that would start it now or sooner."""

    kind: str
    message: str
    replicas: int = 1
    gpus_per_replica: int = 0
    gpu_model: str = ""
    flavor: str | None = None
    time_limit_s: int | None = None
    starts_now: bool = False
    estimated_start_at: datetime | None = None


class DryRun(_Resource):
    """What the next scheduling cycle would do with a job spec submitted now (none was)."""

    would_start_now: bool
    reason: str | None = None  # the pending reason it would get; None when it would start
    message: str = ""
    estimated_start: datetime | None = None
    queue_position: int | None = None
    placement: str | None = None  # where it would start: "node:0,1" per replica, "; " apart
    borrowed_gpus: int = 0
    hints: list[WhatIfHint] = []
    scheduling_paused: bool = False  # an admin paused scheduling: nothing starts until it resumes


class Job(_Resource):
    id: int
    name: str
    tenant: str = ""
    vc: str
    owner: str
    state: str
    priority_class: str = ""
    priority: int = 0
    preemptible: bool = True
    gpu_model: str = ""
    gpus_per_replica: int = 0
    replicas: int = 1
    total_gpus: int = 0
    time_limit_s: int | None = None
    pending_reason: str = ""
    pending_message: str = ""
    estimated_start_at: datetime | None = None
    queue_position: int | None = None
    after: list[int] = []  # jobs it waits for
    after_type: str = "ok"  # how: ok (they succeeded), any (they ended), notok (one did not succeed)
    on_hold: bool = False  # held: it does not start until released
    paused: bool = False  # held after it was paused running: released, it resumes from its checkpoint
    topped_at: datetime | None = None  # moved to the front of its owner's jobs (gpuportal top)
    whatif_hints: list[WhatIfHint] = []
    retries_left: int | None = None
    exit_code: int | None = None
    end_reason: str = ""
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_STATES


class JobDetail(Job):
    spec: dict[str, Any] = {}
    attempts: list[Attempt] = []

    @property
    def latest_attempt(self) -> Attempt | None:
        return max(self.attempts, key=lambda a: a.number) if self.attempts else None


class JobEvent(_Resource):
    id: int
    created_at: datetime
    from_state: str = ""
    to_state: str
    actor_label: str = ""
    reason: str = ""
    data: dict[str, Any] = {}

    @property
    def changes_state(self) -> bool:
        """False for an event that is not a transition (a hold, a release, a warning): the
        portal leaves its states empty, or the same."""
        return bool(self.to_state) and self.to_state != self.from_state


class LogLine(_Resource):
    id: int
    attempt: int
    replica: int = 0
    stream: str = "stdout"
    seq: int = 0
    text: str


class Gpu(_Resource):
    index: int
    uuid: str
    model: str
    memory_mb: int | None = None
    healthy: bool = True
    health_reason: str = ""
    allocated: bool = False


class Node(_Resource):
    id: int
    name: str
    rack: str = ""
    state: str
    state_reason: str = ""
    cpu: int | None = None
    memory_gb: int | None = None
    last_heartbeat_at: datetime | None = None
    gpus: list[Gpu] = []


class Quota(_Resource):
    gpu_model: str
    guaranteed: int
    borrow_limit: int
    lending_limit: int | None = None  # of its idle guaranteed GPUs, how many other VCs may borrow; None: all
    in_use: int = 0


class VirtualCluster(_Resource):
    id: int
    name: str
    tenant: str = ""
    description: str = ""
    queueing_policy: str = ""
    queueing_policy_label: str = ""
    max_gpus_per_user: int | None = None
    max_cpus_per_user: int | None = None
    max_memory_gb_per_user: int | None = None
    max_pending_jobs_per_user: int | None = None
    stop_policy: str = ""  # an admin's stop: "" (open), "hold" or "hold-and-drain"
    gpu_hours_per_month: int | None = None  # its monthly GPU-hour budget; None: no budget
    gpu_hours_this_month: float = 0.0  # held by its jobs since the start of this month (UTC)
    budget_spent: bool = False  # none of its jobs starts until next month or a raised budget
    quotas: list[Quota] = []


class Flavor(_Resource):
    id: int
    name: str
    gpu_model: str
    gpus: int
    cpu: int
    memory_gb: int
    max_runtime_hours: int | None = None


class PriorityClass(_Resource):
    id: int
    name: str
    value: int
    preemptible: bool
    is_default: bool = False
    tenant_admins_only: bool = False  # only a tenant's admins (and cluster admins) may submit jobs of it
    description: str = ""


class UsageRow(_Resource):
    """One row of a usage report; ``key`` is what it sums (a VC, user or tenant name, a job id)."""

    key: str
    jobs: int
    allocated_gpu_hours: float
    used_gpu_hours: float = 0.0  # weighted by measured utilization
    energy_kwh: float = 0.0


class UsageReport(_Resource):
    since: datetime
    until: datetime
    group: str
    results: list[UsageRow] = []


class ApiToken(_Resource):
    id: int
    name: str
    prefix: str = ""
    expires_at: datetime | None = None
    token: str | None = None


class Webhook(_Resource):
    """Where the portal posts about your jobs (a spec's `notify`, idle GPUs); the secret is never
    returned, ``has_secret`` says whether there is one."""

    id: int
    url: str
    format: str
    enabled: bool = True
    has_secret: bool = False
    created_at: datetime | None = None
    last_delivery_at: datetime | None = None
    last_delivery_event: str = ""
    last_delivery_status: int | None = None  # the receiver's HTTP status; None when no answer came
    last_delivery_error: str = ""
    last_delivery_ok: bool | None = None  # None before the first delivery


class JobTemplate(_Resource):
    """A saved job spec: the owner's own, or shared with the owner's tenant."""

    id: int
    name: str
    description: str = ""
    spec: dict[str, Any]
    shared: bool = False
    owner: str
    tenant: str
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Tenant(_Resource):
    """A tenant you belong to, with your own role in it (``admin``, ``member`` or ``viewer``)."""

    name: str
    display_name: str = ""
    role: str
    role_label: str = ""


class TenantMember(_Resource):
    """A member of one of your tenants, by user name, with their role. The portal gives no one
    a member's address, not even the tenant's admins."""

    username: str
    role: str
    role_label: str = ""

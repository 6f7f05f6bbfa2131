from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.protocol import AttemptState as AgentAttemptState
from portal.jobs.accounting import Usage, attempt_usage
from portal.jobs.models import (
    Allocation,
    Checkpoint,
    Job,
    JobAttempt,
    JobEvent,
    JobTemplate,
    LogLine,
    TelemetrySample,
)
from portal.jobs.services import is_paused
from portal.jobs.spec import DurationField, JobSpecSerializer, StrictSerializer, unstorable
from scheduler.core import HintKind


class AllocationSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    gpu_index = serializers.IntegerField(source="gpu.index")
    gpu_uuid = serializers.CharField(source="gpu.uuid")

    class Meta:
        model = Allocation
        fields = ["replica", "node", "gpu_index", "gpu_uuid", "created_at", "released_at"]


class ReplicaStatusSerializer(serializers.Serializer):
    """One replica of an attempt as its node's agent last reported it: how far a start got (an
    image pull's progress) is seen nowhere else."""

    replica = serializers.IntegerField()
    node = serializers.CharField()
    state = serializers.ChoiceField(
        choices=[state.value for state in AgentAttemptState],
        allow_null=True,
        help_text="The agent's state of the replica; null until its agent reported it.",
    )
    message = serializers.CharField(
        allow_blank=True,
        help_text="What the agent said with it: a start's progress (`pulling IMAGE: 312 of 1,024 MiB`), "
        "why it could not start or vanished; empty when there is nothing to say.",
    )
    exit_code = serializers.IntegerField(allow_null=True)


class JobAttemptSerializer(serializers.ModelSerializer):
    allocations = AllocationSerializer(many=True)
    replicas_status = serializers.SerializerMethodField()

    class Meta:
        model = JobAttempt
        fields = [
            "number",
            "state",
            "resume",
            "replicas",
            "created_at",
            "started_at",
            "ended_at",
            "exit_code",
            "end_reason",
            "log_truncated",
            "allocations",
            "replicas_status",
        ]

    @extend_schema_field(ReplicaStatusSerializer(many=True))
    def get_replicas_status(self, attempt: JobAttempt) -> list[dict[str, Any]]:
        # Every replica, reported or not, so that one whose agent is silent shows as such; its
        # node then comes from the (prefetched) allocations.
        nodes = {allocation.replica: allocation.node.name for allocation in attempt.allocations.all()}
        replicas = []
        for replica in range(attempt.replicas):
            reported = attempt.replica_states.get(str(replica)) or {}
            replicas.append(
                {
                    "replica": replica,
                    "node": reported.get("node") or nodes.get(replica, ""),
                    "state": reported.get("state"),
                    "message": reported.get("message") or "",
                    "exit_code": reported.get("exit_code"),
                }
            )
        return replicas


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["id", "created_at", "from_state", "to_state", "actor_label", "reason", "data"]


class WhatIfHintSerializer(serializers.Serializer):
    """One what-if hint as the scheduler stored it (see scheduler/core/whatif.py)."""

    kind = serializers.ChoiceField(choices=[kind.value for kind in HintKind])
    message = serializers.CharField()
    replicas = serializers.IntegerField()
    gpus_per_replica = serializers.IntegerField()
    gpu_model = serializers.CharField()
    flavor = serializers.CharField(allow_null=True, help_text="A flavor of this shape, if one exists.")
    time_limit_s = serializers.IntegerField(allow_null=True)
    starts_now = serializers.BooleanField()
    estimated_start_at = serializers.DateTimeField(allow_null=True)


class JobSerializer(serializers.ModelSerializer):
    whatif_hints = WhatIfHintSerializer(many=True, read_only=True)
    tenant = serializers.CharField(source="tenant.name")
    vc = serializers.CharField(source="virtual_cluster.name")
    owner = serializers.CharField(source="owner.username")
    priority_class = serializers.CharField(source="priority_class.name")
    total_gpus = serializers.IntegerField()
    paused = serializers.SerializerMethodField(
        help_text="Held after it was paused while it ran (or while it checkpoints to stop): "
        "released, it resumes from its checkpoint."
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "tenant",
            "vc",
            "owner",
            "state",
            "priority_class",
            "priority",
            "preemptible",
            "gpu_model",
            "gpus_per_replica",
            "replicas",
            "total_gpus",
            "cpu_per_replica",
            "memory_gb_per_replica",
            "time_limit_s",
            "pending_reason",
            "pending_message",
            "estimated_start_at",
            "queue_position",
            "on_hold",
            "paused",
            "topped_at",
            "after",
            "after_type",
            "whatif_hints",
            "retries_left",
            "exit_code",
            "end_reason",
            "submitted_at",
            "started_at",
            "finished_at",
        ]
        brief_fields = ["id", "name", "vc", "owner", "state", "total_gpus", "pending_reason", "submitted_at"]

    def get_paused(self, job: Job) -> bool:
        return is_paused(job)


class CheckpointSerializer(serializers.ModelSerializer):
    attempt = serializers.IntegerField(source="attempt.number")

    class Meta:
        model = Checkpoint
        fields = ["attempt", "step", "path", "size_bytes", "written_at"]


class UsageSerializer(serializers.Serializer):
    allocated_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField(help_text="GPU-hours weighted by measured utilization.")
    energy_kwh = serializers.FloatField()


class JobDetailSerializer(JobSerializer):
    attempts = JobAttemptSerializer(many=True)
    checkpoints = CheckpointSerializer(
        many=True, help_text="Newest first; the next attempt resumes from the first."
    )
    usage = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "spec", "attempts", "checkpoints", "usage"]

    @extend_schema_field(UsageSerializer)
    def get_usage(self, job: Job) -> dict[str, float]:
        # From the prefetched attempts: a job that never ran (every new one) costs no query.
        total = Usage()
        for usage in attempt_usage(attempt.pk for attempt in job.attempts.all()).values():
            total.add(usage)
        return total.as_dict()


class LogLineSerializer(serializers.ModelSerializer):
    attempt = serializers.IntegerField(source="attempt.number")

    class Meta:
        model = LogLine
        fields = ["id", "attempt", "replica", "stream", "seq", "text", "received_at"]


class TelemetrySampleSerializer(serializers.ModelSerializer):
    attempt = serializers.IntegerField(source="attempt.number")

    class Meta:
        model = TelemetrySample
        fields = [
            "attempt",
            "gpu_uuid",
            "time",
            "utilization_pct",
            "memory_used_mib",
            "power_w",
            "temperature_c",
        ]


class TimeLimitSerializer(serializers.Serializer):
    time_limit = DurationField(help_text="Seconds or '36h': the job's new wall-clock limit per attempt.")


class UsageRowSerializer(UsageSerializer):
    key = serializers.CharField(
        help_text="What the row sums: a VC, user or tenant name or a job id (also under the group's name)."
    )
    jobs = serializers.IntegerField()


class UsageReportSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    group = serializers.CharField()
    results = UsageRowSerializer(many=True)


MAX_BULK_JOBS = 1000
ARRAY_INDEX_ENV = "ARRAY_INDEX"


@extend_schema_field(JobSpecSerializer(many=True))
class JobSpecListField(serializers.ListField):
    """A list of job specs, checked one by one in BulkSubmitSerializer."""

    child = serializers.DictField()


@extend_schema_field(JobSpecSerializer)
class JobSpecField(serializers.DictField):
    """One job spec, checked in BulkSubmitSerializer."""


class BulkSubmitSerializer(serializers.Serializer):
    """Many jobs in one request, all or nothing: either `jobs`, a list of specs, or `job` and
    `array`, one spec queued `array` times as NAME-0 .. NAME-(N-1), each with its index in the
    environment variable ARRAY_INDEX. Errors name the item: {"jobs": {"3": {"vc": [...]}}}."""

    jobs = JobSpecListField(required=False, min_length=1, max_length=MAX_BULK_JOBS)
    job = JobSpecField(required=False, help_text="One spec to queue `array` times.")
    array = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BULK_JOBS)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "jobs" in attrs:
            if "job" in attrs or "array" in attrs:
                raise serializers.ValidationError({"jobs": ["Give either jobs, or job and array; not both."]})
            return {"specs": self._checked_specs(attrs["jobs"]), "array": False}
        if "job" not in attrs or "array" not in attrs:
            raise serializers.ValidationError({"jobs": ["Give a list of jobs, or a job and an array size."]})
        spec = self._checked_specs([attrs["job"]], field="job")[0]
        count = attrs["array"]
        if len(spec["name"]) + len(suffix := f"-{count - 1}") > 100:
            raise serializers.ValidationError(
                {"job": {"name": [f"Leave room for the index: at most {100 - len(suffix)} characters."]}}
            )
        if ARRAY_INDEX_ENV in spec["env"]:
            raise serializers.ValidationError(
                {"job": {"env": [f"{ARRAY_INDEX_ENV} is set per job of the array."]}}
            )
        specs = [
            {**spec, "name": f"{spec['name']}-{i}", "env": {**spec["env"], ARRAY_INDEX_ENV: str(i)}}
            for i in range(count)
        ]
        return {"specs": specs, "array": True}

    def _checked_specs(self, items: list[dict[str, Any]], field: str = "jobs") -> list[dict[str, Any]]:
        """Each item through JobSpecSerializer; every bad item's errors under its index. One
        serializer checks them all, as DRF's ListSerializer does: building one copies its fields."""
        specs, errors = [], {}
        child = JobSpecSerializer(context=self.context)
        for index, item in enumerate(items):
            try:
                specs.append(child.run_validation(item))
            except serializers.ValidationError as exc:
                errors[index] = exc.detail
        if errors:
            raise serializers.ValidationError({field: errors[0] if field == "job" else errors})
        return specs


class BulkSubmitResultSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.IntegerField(), help_text="In the order of the request.")


class DryRunSerializer(serializers.Serializer):
    """What the next scheduling cycle would do with a job spec submitted now (nothing stored)."""

    would_start_now = serializers.BooleanField()
    reason = serializers.CharField(
        allow_null=True, help_text="The pending_reason it would get; null when it would start now."
    )
    message = serializers.CharField(help_text="Its pending message, or where it would start.")
    estimated_start = serializers.DateTimeField(
        allow_null=True, help_text="Now if it would start now; null when it cannot be estimated."
    )
    queue_position = serializers.IntegerField(allow_null=True)
    placement = serializers.CharField(
        allow_null=True, help_text="Where it would start: node:GPU indices per replica; null if it waits."
    )
    borrowed_gpus = serializers.IntegerField(help_text="Of its GPUs, those beyond its VC's guarantee.")
    hints = WhatIfHintSerializer(many=True, help_text="Changes that would start it now or sooner.")
    scheduling_paused = serializers.BooleanField(
        help_text="An admin has paused the scheduling loop: nothing starts until it resumes."
    )


class TemplateSpecField(serializers.JSONField):
    """A template's spec, kept as written. Not checked as JSON here: DRF's check answered a date
    (YAML's reading of an unquoted 2026-01-01) anywhere in the spec with "Value must be valid
    JSON.", naming no field. JobTemplateSerializer.validate_spec checks the spec as a submission
    does, then names any value that JSON still cannot hold."""

    def to_internal_value(self, data: Any) -> Any:
        return data


class JobTemplateSerializer(StrictSerializer, serializers.ModelSerializer):
    """A saved job spec. The spec is checked as a submission checks it, its errors nested under
    `spec` with the same words; the spec's VC gives the template its tenant."""

    # StrictSerializer: a field a template does not have is refused, as the spec's are, and one
    # given a date (YAML's reading of an unquoted 2026-01-01) says so.

    owner = serializers.CharField(source="owner.username", read_only=True)
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    name = serializers.SlugField(
        max_length=100,
        error_messages={"invalid": "Use only letters, digits, '-' and '_' in a template's name."},
    )
    spec = TemplateSpecField(help_text="A job spec exactly as POST /api/v1/jobs/ takes it.")

    class Meta:
        model = JobTemplate
        fields = [
            "id",
            "name",
            "description",
            "spec",
            "shared",
            "owner",
            "tenant",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "owner", "tenant", "created_at", "updated_at"]

    def validate_spec(self, value: Any) -> Any:
        checked = JobSpecSerializer(data=value, context=self.context)
        if not checked.is_valid():
            raise serializers.ValidationError(checked.errors)
        problems = unstorable(value)
        if problems:
            raise serializers.ValidationError(problems)
        self.spec_tenant = checked.validated_data["vc"].tenant
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "spec" in attrs:
            attrs["tenant"] = self.spec_tenant
        return attrs

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.cluster import budgets
from portal.cluster.models import Flavor, Gpu, Node, PriorityClass, Quota, VirtualCluster
from portal.cluster.services import NODE_ACTIONS, quota_in_use


class FlavorSerializer(serializers.ModelSerializer):
    class Meta:
        model = Flavor
        fields = ["id", "name", "gpu_model", "gpus", "cpu", "memory_gb", "max_runtime_hours"]


class PriorityClassSerializer(serializers.ModelSerializer):
    class Meta:
        model = PriorityClass
        fields = ["id", "name", "value", "preemptible", "is_default", "tenant_admins_only", "description"]


class QuotaSerializer(serializers.ModelSerializer):
    in_use = serializers.SerializerMethodField(
        help_text="GPUs of this model the VC's jobs hold now; of every model for gpu_model '*'."
    )

    class Meta:
        model = Quota
        fields = ["gpu_model", "guaranteed", "borrow_limit", "lending_limit", "in_use"]
        extra_kwargs = {
            "lending_limit": {
                "help_text": "How many of the VC's idle guaranteed GPUs other VCs may borrow; the rest "
                "stay free for its own jobs. null lends them all, 0 none."
            }
        }

    def get_in_use(self, quota: Quota) -> int:
        usage: dict[tuple[int, str], int] = self.context.get("usage", {})
        return quota_in_use(usage, quota.virtual_cluster_id, quota.gpu_model)


class VirtualClusterSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.name")
    quotas = QuotaSerializer(many=True)
    queueing_policy_label = serializers.CharField(source="get_queueing_policy_display", read_only=True)
    gpu_hours_this_month = serializers.SerializerMethodField(
        help_text="GPU-hours the VC's jobs held since the start of this month (UTC), as the usage "
        "report counts them: what its monthly budget is checked against."
    )
    budget_spent = serializers.SerializerMethodField(
        help_text="Whether the VC has a monthly budget and has used it: none of its jobs starts "
        "until the next month (UTC) or until an admin raises the budget."
    )

    class Meta:
        model = VirtualCluster
        fields = [
            "id",
            "name",
            "tenant",
            "description",
            "queueing_policy",
            "queueing_policy_label",
            "max_gpus_per_user",
            "max_cpus_per_user",
            "max_memory_gb_per_user",
            "max_pending_jobs_per_user",
            "stop_policy",
            "gpu_hours_per_month",
            "gpu_hours_this_month",
            "budget_spent",
            "quotas",
        ]

    def get_gpu_hours_this_month(self, vc: VirtualCluster) -> float:
        hours: dict[int, float] = self.context.get("budget_hours", {})
        return round(hours.get(vc.pk, 0.0), 2)

    def get_budget_spent(self, vc: VirtualCluster) -> bool:
        return budgets.is_spent(vc, self.context.get("budget_hours", {}).get(vc.pk, 0.0))


class GpuReadingSerializer(serializers.Serializer):
    """The latest reading of a GPU: numbers only, never its processes (they may be another
    tenant's)."""

    time = serializers.DateTimeField()
    utilization_pct = serializers.FloatField(allow_null=True)
    memory_used_mib = serializers.IntegerField(allow_null=True)
    memory_total_mib = serializers.IntegerField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)


class GpuSerializer(serializers.ModelSerializer):
    allocated = serializers.SerializerMethodField()
    job = serializers.SerializerMethodField(help_text="The job holding it, if it is one of your tenants'.")
    latest = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = [
            "index",
            "uuid",
            "model",
            "memory_mb",
            "nvlink_group",
            "pcie_switch",
            "numa_node",
            "healthy",
            "health_reason",
            "allocated",
            "job",
            "latest",
        ]

    def get_allocated(self, gpu: Gpu) -> bool:
        return gpu.pk in self.context.get("allocated_gpu_ids", set())

    def get_job(self, gpu: Gpu) -> int | None:
        return self.context.get("visible_jobs", {}).get(gpu.pk)

    @extend_schema_field(GpuReadingSerializer(allow_null=True))
    def get_latest(self, gpu: Gpu) -> dict[str, Any] | None:
        sample = self.context.get("latest_samples", {}).get(gpu.node_id, {}).get(gpu.uuid)
        return None if sample is None else GpuReadingSerializer(sample).data


class NodeSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "rack",
            "labels",
            "state",
            "state_reason",
            "cpu",
            "memory_gb",
            "last_heartbeat_at",
            "gpus",
        ]


class NodeActionSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=sorted(NODE_ACTIONS), help_text="cordon, drain or uncordon")
    reason = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)

from __future__ import annotations

from rest_framework import serializers

from portal.cluster.models import Flavor, Gpu, Node, PriorityClass, Quota, VirtualCluster


class FlavorSerializer(serializers.ModelSerializer):
    class Meta:
        model = Flavor
        fields = ["id", "name", "gpu_model", "gpus", "cpu", "memory_gb", "max_runtime_hours"]


class PriorityClassSerializer(serializers.ModelSerializer):
    class Meta:
        model = PriorityClass
        fields = ["id", "name", "value", "preemptible", "is_default", "description"]


class QuotaSerializer(serializers.ModelSerializer):
    in_use = serializers.SerializerMethodField(help_text="GPUs of this model the VC's jobs hold now.")

    class Meta:
        model = Quota
        fields = ["gpu_model", "guaranteed", "borrow_limit", "in_use"]

    def get_in_use(self, quota: Quota) -> int:
        usage: dict[tuple[int, str], int] = self.context.get("usage", {})
        return usage.get((quota.virtual_cluster_id, quota.gpu_model), 0)


class VirtualClusterSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.name")
    quotas = QuotaSerializer(many=True)

    class Meta:
        model = VirtualCluster
        fields = ["id", "name", "tenant", "description", "queueing_policy", "max_gpus_per_user", "quotas"]


class GpuSerializer(serializers.ModelSerializer):
    allocated = serializers.SerializerMethodField()

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
        ]

    def get_allocated(self, gpu: Gpu) -> bool:
        return gpu.pk in self.context.get("allocated_gpu_ids", set())


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

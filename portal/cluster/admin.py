from __future__ import annotations

from typing import Any

from django.contrib import admin, messages

from portal.cluster.models import Flavor, Gpu, Node, PriorityClass, Quota, VirtualCluster
from portal.cluster.services import gpus_in_use, issue_node_token, set_node_state
from portal.lib.admin import AuditedModelAdmin


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 1


@admin.register(VirtualCluster)
class VirtualClusterAdmin(AuditedModelAdmin):
    list_display = ["name", "tenant", "queueing_policy", "max_gpus_per_user"]
    list_filter = ["tenant", "queueing_policy"]
    search_fields = ["name"]
    inlines = [QuotaInline]


@admin.register(Quota)
class QuotaAdmin(AuditedModelAdmin):
    list_display = ["virtual_cluster", "gpu_model", "in_use", "guaranteed", "borrow_limit"]
    list_filter = ["gpu_model", "virtual_cluster__tenant"]
    readonly_fields = ["in_use"]

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).select_related("virtual_cluster")

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        self._usage = gpus_in_use(Quota.objects.values_list("virtual_cluster", flat=True))
        return super().changelist_view(request, extra_context)

    @admin.display(description="in use / guaranteed + borrow limit")
    def in_use(self, quota: Quota) -> str:
        usage = getattr(self, "_usage", None)
        if usage is None or quota.pk is None:
            usage = gpus_in_use([quota.virtual_cluster_id]) if quota.pk else {}
        used = usage.get((quota.virtual_cluster_id, quota.gpu_model), 0)
        return f"{used} / {quota.guaranteed} + {quota.borrow_limit}"


@admin.register(Flavor)
class FlavorAdmin(AuditedModelAdmin):
    list_display = ["name", "gpu_model", "gpus", "cpu", "memory_gb", "max_runtime_hours"]
    list_filter = ["gpu_model"]


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedModelAdmin):
    list_display = ["name", "value", "preemptible", "is_default", "tenant_admins_only"]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
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
    ]


def node_action(action: str, description: str) -> Any:
    @admin.action(description=description)
    def run(modeladmin: Any, request: Any, queryset: Any) -> None:
        for node in queryset:
            set_node_state(node, action, request.user)

    run.__name__ = action
    return run


@admin.register(Node)
class NodeAdmin(AuditedModelAdmin):
    list_display = [
        "name",
        "rack",
        "state",
        "state_reason",
        "gpu_count",
        "last_heartbeat_at",
        "agent_version",
    ]
    list_filter = ["state", "rack"]
    search_fields = ["name"]
    readonly_fields = ["last_heartbeat_at", "agent_version"]
    inlines = [GpuInline]
    actions = [
        node_action("cordon", "Cordon: take no new jobs"),
        node_action("drain", "Drain: take no new jobs and move jobs away"),
        node_action("uncordon", "Uncordon: take jobs again"),
        "issue_agent_token",
    ]

    @admin.action(description="Issue a new agent token (shown once; the old one stops working)")
    def issue_agent_token(self, request: Any, queryset: Any) -> None:
        for node in queryset:
            token = issue_node_token(node, request.user)
            self.message_user(request, f"Agent token for {node.name}: {token}", messages.WARNING)

    @admin.display(description="GPUs")
    def gpu_count(self, node: Node) -> int:
        return node.gpus.count()


@admin.register(Gpu)
class GpuAdmin(AuditedModelAdmin):
    list_display = ["__str__", "uuid", "model", "memory_mb", "nvlink_group", "pcie_switch", "healthy"]
    list_filter = ["model", "healthy", "node"]
    search_fields = ["uuid", "node__name"]

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce

from portal.cluster.models import (
    EnrollmentToken,
    Flavor,
    Gpu,
    GpuHealthEvent,
    Node,
    PriorityClass,
    Quota,
    VirtualCluster,
)
from portal.cluster.services import (
    accept_reported_gpus,
    clear_gpu_health,
    create_enrollment_token,
    gpus_in_use,
    issue_node_token,
    quota_in_use,
    revoke_node,
    set_node_state,
    void_enrollment_tokens,
)
from portal.jobs.services import request_scheduling_cycle
from portal.lib.admin import AuditedModelAdmin, ReadOnlyModelAdmin


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 1


@admin.register(VirtualCluster)
class VirtualClusterAdmin(AuditedModelAdmin):
    list_display = [
        "name",
        "tenant",
        "stop_policy",
        "queueing_policy",
        "max_gpus_per_user",
        "max_cpus_per_user",
        "max_memory_gb_per_user",
        "max_pending_jobs_per_user",
        "gpu_hours_per_month",
    ]
    list_filter = ["tenant", "stop_policy", "queueing_policy"]
    search_fields = ["name"]
    inlines = [QuotaInline]

    def get_readonly_fields(self, request: Any, obj: VirtualCluster | None = None) -> Any:
        """A VC's tenant is fixed once it exists. Moved, its jobs stayed the old tenant's while the
        new tenant's users saw the VC with their GPUs in use and GPU-hours this month, submitted
        to it and got its budget notices; make a new VC instead."""
        readonly = list(super().get_readonly_fields(request, obj))
        return readonly if obj is None else [*readonly, "tenant"]

    def save_model(self, request: Any, obj: VirtualCluster, form: Any, change: bool) -> None:
        if "gpu_hours_per_month" in form.changed_data:
            obj.budget_notice_pct = 0  # a new budget: its levels are told afresh
        super().save_model(request, obj, form, change)
        request_scheduling_cycle()  # a stop, a reopening, a new quota or budget takes effect at once


@admin.register(Quota)
class QuotaAdmin(AuditedModelAdmin):
    list_display = ["virtual_cluster", "gpu_model", "in_use", "guaranteed", "borrow_limit", "lends"]
    list_filter = ["gpu_model", "virtual_cluster__tenant"]
    readonly_fields = ["in_use"]

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).select_related("virtual_cluster")

    def save_model(self, request: Any, obj: Quota, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        request_scheduling_cycle()  # as from the VC's page: a changed quota takes effect at once

    def delete_model(self, request: Any, obj: Quota) -> None:
        super().delete_model(request, obj)
        request_scheduling_cycle()  # a removed quota too

    def delete_queryset(self, request: Any, queryset: Any) -> None:
        super().delete_queryset(request, queryset)
        request_scheduling_cycle()

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        self._usage = gpus_in_use(Quota.objects.values_list("virtual_cluster", flat=True))
        return super().changelist_view(request, extra_context)

    @admin.display(description="in use / guaranteed + borrow limit")
    def in_use(self, quota: Quota) -> str:
        usage = getattr(self, "_usage", None)
        if usage is None or quota.pk is None:
            usage = gpus_in_use([quota.virtual_cluster_id]) if quota.pk else {}
        used = quota_in_use(usage, quota.virtual_cluster_id, quota.gpu_model)
        return f"{used} / {quota.guaranteed} + {quota.borrow_limit}"

    @admin.display(description="lends", ordering="lending_limit")
    def lends(self, quota: Quota) -> str:
        """How many idle guaranteed GPUs other VCs may borrow; an empty limit lends them all."""
        return "all" if quota.lending_limit is None else str(quota.lending_limit)


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
    # As on the GPU's own page: health changes through the agent's reports and the "Return to
    # service" action only. Editable here, saving the node wrote back the health the page showed,
    # returning a GPU that failed meanwhile to service without an event or an audit entry.
    readonly_fields = ["healthy", "health_reason"]


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
        "revoked_at",
    ]
    list_filter = ["state", "rack"]
    search_fields = ["name"]
    # What the portal and the agent keep up to date is shown, never posted back: saving the page
    # wrote back the state and desired revision it showed (a revision going back makes the
    # agent skip desired sets). State changes go through the actions; cpu and memory_gb are
    # what the agent's hello reports.
    readonly_fields = [
        "state",
        "cpu",
        "memory_gb",
        "desired_revision",
        "last_heartbeat_at",
        "agent_version",
        "revoked_at",
        "reported_gpus",
    ]
    inlines = [GpuInline]

    def get_queryset(self, request: Any) -> Any:
        # A subquery, not a join with GROUP BY: the actions and the change page lock and save
        # rows of this queryset.
        gpus = Gpu.objects.filter(node=OuterRef("pk")).order_by().values("node").annotate(n=Count("pk"))
        total = Coalesce(Subquery(gpus.values("n"), output_field=IntegerField()), 0)
        return super().get_queryset(request).annotate(gpu_total=total)

    def save_model(self, request: Any, obj: Node, form: Any, change: bool) -> None:
        """Writes only the fields the admin changed: the row was read when the form was posted,
        and its other columns (heartbeat, state, revision) may have moved on since."""
        if change:
            obj.save(update_fields=form.changed_data)
        else:
            super().save_model(request, obj, form, change)

    actions = [
        node_action("cordon", "Cordon: take no new jobs"),
        node_action("drain", "Drain: take no new jobs and move jobs away"),
        node_action("uncordon", "Uncordon: take jobs again"),
        "issue_agent_token",
        "revoke_agent_credentials",
        "accept_reported_gpus",
    ]

    @admin.action(description="Accept the GPUs its agent reports (after replacing or adding cards)")
    def accept_reported_gpus(self, request: Any, queryset: Any) -> None:
        for node in queryset:
            accepted = accept_reported_gpus(node, request.user)
            if accepted:
                self.message_user(
                    request, f"{node.name}: {accepted} GPU(s) registered. Uncordon it to take jobs again."
                )
            else:
                self.message_user(
                    request, f"{node.name}: its agent reported no other GPUs.", messages.WARNING
                )

    @admin.action(description="Revoke agent credentials: drop the agent, requeue its jobs, trust it no more")
    def revoke_agent_credentials(self, request: Any, queryset: Any) -> None:
        for node in queryset:
            requeued = revoke_node(node, request.user)
            self.message_user(
                request,
                f"{node.name}: credentials revoked, {len(requeued)} job(s) requeued. "
                "It takes work again after it enrolls with a new enrollment token and is uncordoned.",
                messages.WARNING,
            )

    @admin.action(description="Issue a new agent token (shown once; the old one stops working)")
    def issue_agent_token(self, request: Any, queryset: Any) -> None:
        for node in queryset:
            token = issue_node_token(node, request.user)
            self.message_user(request, f"Agent token for {node.name}: {token}", messages.WARNING)

    @admin.display(description="GPUs", ordering="gpu_total")
    def gpu_count(self, node: Node) -> int:
        """Counted in the list's one query: a count per row made a big cluster's list slow."""
        return node.gpu_total  # type: ignore[attr-defined]


@admin.register(Gpu)
class GpuAdmin(AuditedModelAdmin):
    list_display = [
        "__str__",
        "uuid",
        "model",
        "memory_mb",
        "nvlink_group",
        "pcie_switch",
        "healthy",
        "health_reason",
    ]
    list_filter = ["model", "healthy", "node"]
    list_select_related = ["node"]  # each row's name is its node's
    search_fields = ["uuid", "node__name"]
    readonly_fields = ["healthy", "health_reason", "health_history"]
    actions = ["return_to_service"]

    @admin.action(description="Return to service: clear the failure (after a reset, repair or reboot)")
    def return_to_service(self, request: Any, queryset: Any) -> None:
        cleared = [str(gpu) for gpu in queryset if clear_gpu_health(gpu, request.user)]
        self.message_user(request, f"Returned to service: {', '.join(cleared) or 'none (all were healthy)'}.")

    @admin.display(description="Health history (by UUID, latest first)")
    def health_history(self, gpu: Gpu) -> str:
        events = GpuHealthEvent.objects.filter(gpu_uuid=gpu.uuid).select_related("node")[:20]
        return (
            "\n".join(
                f"{e.created_at:%Y-%m-%d %H:%M:%S} {e.node.name}/{e.gpu_index} "
                f"{'healthy' if e.healthy else 'unhealthy'} by {e.actor}: {e.reason}"
                for e in events
            )
            or "no failures recorded"
        )


@admin.register(GpuHealthEvent)
class GpuHealthEventAdmin(ReadOnlyModelAdmin):
    """The GPUs' health history, kept by the portal."""

    list_display = ["created_at", "gpu_uuid", "node", "gpu_index", "healthy", "reason", "actor"]
    list_filter = ["healthy", "node"]
    search_fields = ["gpu_uuid", "node__name", "reason"]


class EnrollmentTokenForm(forms.ModelForm):
    valid_minutes = forms.IntegerField(
        min_value=1,
        max_value=settings.ENROLLMENT_TOKEN_MAX_TTL_MINUTES,
        initial=settings.ENROLLMENT_TOKEN_TTL_MINUTES,
        help_text="How long the token may be used (once).",
    )

    class Meta:
        model = EnrollmentToken
        fields = ["node_name"]


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(admin.ModelAdmin):
    """Adding a token shows its secret once; tokens are never edited. The service audits them."""

    form = EnrollmentTokenForm
    list_display = ["__str__", "node_name", "created_by", "created_at", "expires_at", "used_at", "node"]
    list_filter = ["used_at"]
    search_fields = ["node_name"]
    actions = ["void"]

    @admin.action(description="Void: the selected tokens that could still enroll a node stop working now")
    def void(self, request: Any, queryset: Any) -> None:
        voided = void_enrollment_tokens(queryset, request.user)
        self.message_user(request, f"{voided} enrollment token(s) voided.", messages.WARNING)

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def save_model(self, request: Any, obj: Any, form: Any, change: bool) -> None:
        token, raw = create_enrollment_token(
            request.user, form.cleaned_data["node_name"], form.cleaned_data["valid_minutes"]
        )
        for field in EnrollmentToken._meta.concrete_fields:  # the page after this shows the stored token
            setattr(obj, field.attname, getattr(token, field.attname))
        self.message_user(request, f"Enrollment token ({token}), shown once: {raw}", messages.WARNING)

from __future__ import annotations

from typing import Any

from django.contrib import admin

from portal.jobs.accounting import job_usage
from portal.jobs.choices import TERMINAL_STATES
from portal.jobs.models import Allocation, Job, JobAttempt, JobEvent, JobTemplate
from portal.jobs.services import cancel_job
from portal.lib.admin import AuditedModelAdmin


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "from_state", "to_state", "actor_label", "reason"]
    fields = readonly_fields

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(AuditedModelAdmin):
    """Jobs change state only through the services; here they are read and cancelled."""

    list_display = ["id", "name", "tenant", "virtual_cluster", "owner", "state", "total_gpus", "submitted_at"]
    list_filter = ["state", "tenant", "virtual_cluster"]
    search_fields = ["name", "owner__username"]
    inlines = [JobEventInline]
    actions = ["cancel"]

    exclude = ["secret_env"]  # not even cluster admins read a job's secrets here

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        return [f.name for f in Job._meta.fields if f.name != "secret_env"] + ["usage"]

    @admin.display(description="usage (allocated GPU-h / used GPU-h / kWh)")
    def usage(self, job: Job) -> str:
        figures = job_usage([job.pk])[job.pk].as_dict()
        return f"{figures['allocated_gpu_hours']} / {figures['used_gpu_hours']} / {figures['energy_kwh']}"

    def has_add_permission(self, request: Any) -> bool:
        return False

    @admin.action(description="Cancel selected jobs")
    def cancel(self, request: Any, queryset: Any) -> None:
        for job in queryset.exclude(state__in=TERMINAL_STATES):
            cancel_job(job, request.user, reason="cancelled by a cluster admin")


@admin.register(JobAttempt)
class JobAttemptAdmin(admin.ModelAdmin):
    list_display = ["job", "number", "state", "started_at", "ended_at", "exit_code"]
    list_filter = ["state"]

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["attempt", "node", "gpu", "replica", "created_at", "released_at"]
    list_filter = ["node"]

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(JobTemplate)
class JobTemplateAdmin(AuditedModelAdmin):
    """Users save their own templates, through the spec's check and the rule that a template
    keeps no secrets (portal.jobs.job_templates), so the spec is not edited here; a cluster
    admin may reword one, stop sharing it or delete it. Only cluster admins get into this site
    (PortalAdminSite), so it shows every tenant's templates."""

    list_display = ["name", "owner", "tenant", "shared", "updated_at"]
    list_filter = ["tenant", "shared"]
    search_fields = ["name", "owner__username"]
    fields = ["name", "owner", "tenant", "description", "shared", "spec", "created_at", "updated_at"]
    readonly_fields = ["name", "owner", "tenant", "spec", "created_at", "updated_at"]

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).select_related("owner", "tenant")

    def get_readonly_fields(self, request: Any, obj: JobTemplate | None = None) -> list[str]:
        # Sharing is its owner's choice: an admin may take a template back, never share one.
        if obj is not None and not obj.shared:
            return [*self.readonly_fields, "shared"]
        return list(self.readonly_fields)

    def has_add_permission(self, request: Any) -> bool:
        return False

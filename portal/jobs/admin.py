from __future__ import annotations

from typing import Any

from django.contrib import admin, messages

from portal.jobs.accounting import job_usage
from portal.jobs.choices import TERMINAL_STATES
from portal.jobs.models import Allocation, Job, JobAttempt, JobEvent, JobTemplate
from portal.jobs.services import InvalidTransition, cancel_job
from portal.lib.admin import AuditedModelAdmin, ReadOnlyModelAdmin


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

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        """A deleted job took its attempts and allocations with it: a running one's GPUs looked
        free to the scheduler while its program went on, and its tenant lost its history, with
        no event. Cancel it instead."""
        return False

    @admin.action(description="Cancel selected jobs")
    def cancel(self, request: Any, queryset: Any) -> None:
        """A job may end between the list being read and its row being locked (an agent's report
        comes in): that one is told, the others are still cancelled."""
        ended = []
        for job in queryset.exclude(state__in=TERMINAL_STATES):
            try:
                cancel_job(job, request.user, reason="cancelled by a cluster admin")
            except InvalidTransition:
                ended.append(str(job))
        if ended:
            self.message_user(
                request, f"Ended meanwhile, not cancelled: {', '.join(ended)}.", messages.WARNING
            )


@admin.register(JobAttempt)
class JobAttemptAdmin(ReadOnlyModelAdmin):
    """Attempts are the scheduler's and the agents' record: one added or deleted here placed or
    dropped work behind the services' backs, without an event or an audit entry."""

    list_display = ["job", "number", "state", "started_at", "ended_at", "exit_code"]
    list_filter = ["state"]
    list_select_related = ["job"]


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyModelAdmin):
    """A deleted allocation freed a GPU under a running job (the next cycle placed another job
    on it), an added one took a GPU for nothing; only the services place and release them."""

    list_display = ["attempt", "node", "gpu", "replica", "created_at", "released_at"]
    list_filter = ["node"]
    list_select_related = ["attempt", "node", "gpu__node"]


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

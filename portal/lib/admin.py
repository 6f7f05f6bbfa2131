"""The bases for admin classes: each add, change and delete writes an audit entry; a record that
services append to is read only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from portal.accounts.services import record_audit


def tenant_of(obj: Any) -> Any:
    return getattr(obj, "tenant", None) or getattr(getattr(obj, "virtual_cluster", None), "tenant", None)


class AuditedModelAdmin(admin.ModelAdmin):
    def log_addition(self, request: Any, obj: Any, message: Any) -> Any:
        record_audit(request.user, "admin.add", obj, tenant=tenant_of(obj), detail=str(message))
        return super().log_addition(request, obj, message)

    def log_change(self, request: Any, obj: Any, message: Any) -> Any:
        record_audit(request.user, "admin.change", obj, tenant=tenant_of(obj), detail=str(message))
        return super().log_change(request, obj, message)

    def log_deletions(self, request: Any, queryset: Any) -> Any:
        for obj in queryset:
            record_audit(request.user, "admin.delete", obj, tenant=tenant_of(obj))
        return super().log_deletions(request, queryset)


class ReadOnlyModelAdmin(admin.ModelAdmin):
    """Rows that services append to (the audit log, GPU health events): listed, never edited."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

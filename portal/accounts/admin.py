from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from portal.accounts.models import ApiToken, AuditEntry, Membership, OidcIdentity, Tenant, TotpDevice, Webhook
from portal.accounts.services import revoke_api_token
from portal.lib.admin import AuditedModelAdmin, ReadOnlyModelAdmin


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(AuditedModelAdmin):
    list_display = ["name", "display_name", "created_at"]
    search_fields = ["name", "display_name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(AuditedModelAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__name"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedModelAdmin):
    """Tokens are created by their users (the secret is shown to them once); admins only revoke."""

    list_display = ["name", "user", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username", "prefix"]
    readonly_fields = ["user", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: Any, queryset: Any) -> None:
        for token in queryset:
            revoke_api_token(token, request.user)


@admin.register(Webhook)
class WebhookAdmin(AuditedModelAdmin):
    """Users register their own webhooks; admins see where they post and may disable or delete
    one. The URL is shown by its host only (a chat tool's webhook URL is a credential) and the
    secret never."""

    list_display = ["__str__", "host", "format", "enabled", "last_delivery_at", "last_delivery_status"]
    list_filter = ["enabled", "format"]
    list_select_related = ["user"]  # each row's name is its user's
    search_fields = ["user__username"]
    fields = [
        "user",
        "host",
        "format",
        "enabled",
        "created_at",
        "last_delivery_at",
        "last_delivery_event",
        "last_delivery_status",
        "last_delivery_error",
    ]
    readonly_fields = [
        "user",
        "host",
        "format",
        "created_at",
        "last_delivery_at",
        "last_delivery_event",
        "last_delivery_status",
        "last_delivery_error",
    ]

    def has_add_permission(self, request: Any) -> bool:
        return False

    @admin.display(description="host")
    def host(self, obj: Webhook) -> str:
        return urlsplit(obj.url).hostname or ""


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyModelAdmin):
    """The audit log is appended to by the services, never edited."""

    list_display = ["created_at", "actor", "action", "object_type", "object_repr", "tenant"]
    list_filter = ["action", "object_type", "tenant"]
    search_fields = ["object_repr", "detail", "actor__username"]
    date_hierarchy = "created_at"


@admin.register(TotpDevice)
class TotpDeviceAdmin(AuditedModelAdmin):
    """Cluster admins' authenticators. Users enroll their own; deleting one resets it (the user's
    admin sessions end and they enroll again). The secret is never shown here."""

    list_display = ["user", "created_at", "confirmed_at", "last_used_at"]
    search_fields = ["user__username"]
    readonly_fields = ["user", "created_at", "confirmed_at", "last_used_at"]
    exclude = ["secret", "last_used_step"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(OidcIdentity)
class OidcIdentityAdmin(AuditedModelAdmin):
    """Which portal user each single sign-on account is. A first sign-in creates the user and this
    link; to let a provider account sign in as an existing user (one whose name it shares, say),
    add the link here with the provider's subject. Deleting a link stops that account's sign-ins."""

    list_display = ["user", "subject", "issuer", "created_at", "last_login_at"]
    search_fields = ["user__username", "subject"]
    autocomplete_fields = ["user"]
    readonly_fields = ["created_at", "last_login_at"]


# Users and groups are managed here too, so their changes are audited like everything else.
admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(AuditedModelAdmin, UserAdmin):
    pass


@admin.register(Group)
class AuditedGroupAdmin(AuditedModelAdmin, GroupAdmin):
    pass

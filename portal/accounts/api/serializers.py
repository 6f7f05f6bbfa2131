from __future__ import annotations

from rest_framework import serializers

from portal.accounts import webhooks
from portal.accounts.choices import Role
from portal.accounts.models import ApiToken, Membership, Webhook


class ApiTokenSerializer(serializers.ModelSerializer):
    expires_in_days = serializers.IntegerField(
        write_only=True, required=False, min_value=0, max_value=3650, help_text="0 means never; default 90."
    )
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "is_active",
            "expires_in_days",
        ]
        read_only_fields = ["prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]


class CreatedApiTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret. Shown only in this response.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class WebhookSerializer(serializers.ModelSerializer):
    url = serializers.URLField(
        max_length=2000, help_text="Where the portal POSTs: http or https, on a public host."
    )
    secret = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=200,
        trim_whitespace=False,
        help_text="Signs each delivery (X-GPU-Portal-Signature); never returned. Empty: unsigned.",
    )
    has_secret = serializers.BooleanField(read_only=True)
    last_delivery_ok = serializers.BooleanField(
        read_only=True,
        allow_null=True,
        help_text="Whether the latest delivery got a 2xx; null before the first.",
    )

    class Meta:
        model = Webhook
        fields = [
            "id",
            "url",
            "format",
            "enabled",
            "secret",
            "has_secret",
            "created_at",
            "last_delivery_at",
            "last_delivery_event",
            "last_delivery_status",
            "last_delivery_error",
            "last_delivery_ok",
        ]
        read_only_fields = [
            "created_at",
            "last_delivery_at",
            "last_delivery_event",
            "last_delivery_status",
            "last_delivery_error",
        ]

    def validate_url(self, value: str) -> str:
        try:
            webhooks.check_url(value)
        except webhooks.UnsafeUrl as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class MembershipSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.name")

    class Meta:
        model = Membership
        fields = ["tenant", "role"]


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    is_staff = serializers.BooleanField()
    email = serializers.CharField(help_text="Where the portal mails you (set by a cluster admin).")
    mail_enabled = serializers.BooleanField(help_text="Whether the portal sends mail (a spec's notify).")
    memberships = MembershipSerializer(many=True)


class TenantSerializer(serializers.ModelSerializer):
    """A tenant as its member sees it: a membership of the requester, named by its tenant."""

    name = serializers.CharField(source="tenant.name", read_only=True)
    display_name = serializers.CharField(source="tenant.display_name", read_only=True)
    role_label = serializers.CharField(source="get_role_display", read_only=True)

    class Meta:
        model = Membership
        fields = ["name", "display_name", "role", "role_label"]
        read_only_fields = ["role"]


class MemberSerializer(serializers.ModelSerializer):
    # No email, not even for the tenant's admins: they may add any account, so an address shown
    # to them would be any user's (add them, read it, remove them again).
    username = serializers.CharField(source="user.username", read_only=True)
    role_label = serializers.CharField(source="get_role_display", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "role_label"]
        read_only_fields = ["role"]


class AddMemberSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150, help_text="An existing, active user account.")
    role = serializers.ChoiceField(choices=Role.choices)


class MemberRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)

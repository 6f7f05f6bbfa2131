from __future__ import annotations

from rest_framework import serializers

from portal.accounts.models import ApiToken, Membership


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

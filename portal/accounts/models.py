"""Tenants, their members, API tokens, webhooks and the audit log."""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

from portal.accounts.choices import Role, WebhookFormat
from portal.lib.encryption import EncryptedTextField

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


class TenantQuerySet(models.QuerySet["Tenant"]):
    def for_user(self, user: AbstractBaseUser | AnonymousUser) -> TenantQuerySet:
        """Tenants the user belongs to; cluster admins (staff) see all."""
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self.all()
        return self.filter(memberships__user=user).distinct()


class Tenant(models.Model):
    """An organisation that owns virtual clusters and jobs. Nothing crosses tenant borders."""

    name = models.SlugField(max_length=64, unique=True)
    display_name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in one tenant. A user may belong to several tenants."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")]
        ordering = ["tenant__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


TOKEN_PREFIX = "gpp_"


def hash_secret(raw: str) -> str:
    """Tokens are stored as SHA-256: they are long random secrets, so a slow hash adds nothing."""
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def usable(self) -> ApiTokenQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    """A bearer token for scripts and the CLI. Only its hash is stored; the secret is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise a token.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()


class Webhook(models.Model):
    """Where the portal posts its notices about a user's jobs (the states a spec's `notify` names,
    idle GPUs), beside or instead of mail.

    The URL is encrypted at rest like the secret: a chat tool's incoming-webhook URL is itself a
    credential (whoever has it may post to the channel). The secret signs each delivery, so the
    portal must read it back: it cannot be hashed, and the API never returns it. The outcome of
    the latest delivery is kept for the user to debug their receiver.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks")
    url = EncryptedTextField()
    format = models.CharField(max_length=8, choices=WebhookFormat.choices, default=WebhookFormat.SLACK)
    secret = EncryptedTextField(blank=True, help_text="Signs each delivery (HMAC-SHA256); never shown.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_delivery_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_delivery_event = models.CharField(max_length=32, blank=True, editable=False)
    last_delivery_status = models.PositiveSmallIntegerField(
        null=True, blank=True, editable=False, help_text="The receiver's HTTP status; empty when none came."
    )
    last_delivery_error = models.CharField(max_length=300, blank=True, editable=False)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of {self.user}"

    @property
    def has_secret(self) -> bool:
        return bool(self.secret)

    @property
    def last_delivery_ok(self) -> bool | None:
        """None before the first delivery."""
        if self.last_delivery_at is None:
            return None
        status = self.last_delivery_status
        return status is not None and 200 <= status < 300 and not self.last_delivery_error


class AuditEntry(models.Model):
    """One admin or API action, kept for accountability. Never edited or deleted through the UI."""

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=100, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_repr}"


class TotpDevice(models.Model):
    """A cluster admin's authenticator: the second factor Django admin asks for (RFC 6238).

    The secret is encrypted at rest (the portal must compute with it, so it cannot be hashed).
    `last_used_step` makes every code single-use. Deleting the device resets the user's second
    factor: their admin sessions end, and they enroll again at their next sign-in.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="totp_device"
    )
    secret = EncryptedTextField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    confirmed_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Empty until the user enters a first code."
    )
    last_used_step = models.PositiveBigIntegerField(default=0, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "TOTP device"

    def __str__(self) -> str:
        return f"authenticator of {self.user}"


class OidcIdentity(models.Model):
    """The link between a portal user and an account at the single sign-on provider. Users are
    found by the provider's subject, never by a name that matches: a provider account named
    like an existing local user does not become that user unless a cluster admin links them
    here."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    issuer = models.URLField(max_length=300)
    subject = models.CharField(max_length=255, help_text="The provider's `sub` claim for this account.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "single sign-on identity"
        verbose_name_plural = "single sign-on identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_oidc_subject")
        ]

    def __str__(self) -> str:
        return f"{self.user} at {self.issuer}"

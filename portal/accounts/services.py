"""Write paths for accounts: API tokens and the audit log."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from portal.accounts.models import ApiToken, AuditEntry, Tenant, hash_secret, new_secret
from portal.live.publish import publish_access_change, token_key


def record_audit(actor: Any, action: str, obj: models.Model | None = None, **fields: Any) -> AuditEntry:
    """Appends one audit entry (arguments as audit_entry takes them). Callers run it inside the
    transaction of the change it records."""
    entry = audit_entry(actor, action, obj, **fields)
    entry.save()
    return entry


def audit_entry(
    actor: Any,
    action: str,
    obj: models.Model | None = None,
    tenant: Tenant | None = None,
    detail: str = "",
    object_type: str = "",
    object_id: str = "",
) -> AuditEntry:
    """The unsaved audit entry, for a caller that writes it with other rows. A refused request may
    name an object that does not exist: give its type and id instead of ``obj``."""
    return AuditEntry(
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        action=action,
        object_type=obj._meta.label if obj is not None else object_type[:100],
        object_id=str(obj.pk) if obj is not None else object_id[:64],
        object_repr=str(obj)[:200] if obj is not None else "",
        tenant=tenant,
        detail=detail,
    )


@transaction.atomic
def create_api_token(user: Any, name: str, expires_in_days: int | None = None) -> tuple[ApiToken, str]:
    """Creates a token and returns it with its secret, which is never stored and never shown again."""
    days = settings.API_TOKEN_DEFAULT_DAYS if expires_in_days is None else expires_in_days
    raw = new_secret()
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=raw[:12],
        token_hash=hash_secret(raw),
        expires_at=timezone.now() + timedelta(days=days) if days else None,
    )
    record_audit(user, "api_token.create", token)
    return token, raw


@transaction.atomic
def revoke_api_token(token: ApiToken, actor: Any) -> ApiToken:
    """Revokes a token; revoking twice keeps the first time. A socket the token opened (a shell
    from the CLI) closes, as the REST API refuses the token's next request."""
    if token.revoked_at is None:
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        token.refresh_from_db()
        record_audit(actor, "api_token.revoke", token)
        publish_access_change(token.user_id, token_key(token.pk))
    return token

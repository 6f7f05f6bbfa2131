"""Write paths for accounts: API tokens, tenant members and the audit log."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from portal.accounts.choices import Role
from portal.accounts.models import ApiToken, AuditEntry, Membership, Tenant, hash_secret, new_secret
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


# ---------------------------------------------------------------------------
# Tenant members, managed by the tenant's own admins (cluster admins also may, in Django admin).
# ---------------------------------------------------------------------------


class MemberRefused(Exception):
    """The change breaks a rule of the tenant's membership (400); `field` names the request's
    field at fault, None the request as a whole."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class MemberDenied(Exception):
    """The actor is not an admin of the tenant (403)."""


class NoSuchMember(Exception):
    """The tenant has no member of that name (404)."""


def _locked_members(tenant: Tenant, actor: Any) -> dict[str, Membership]:
    """The tenant's memberships by user name, locked until the transaction ends, after checking
    that the actor is one of its admins. Every change of a tenant's members takes these locks
    first (in one order, so two changes wait for each other and never deadlock): two admins
    demoting each other at once cannot both pass the last-admin check, and an admin demoted a
    moment ago changes nothing more."""
    locked = (
        Membership.objects.select_for_update(of=("self",))
        .filter(tenant=tenant)
        .select_related("user")
        .order_by("pk")
    )
    members = {m.user.username: m for m in locked}
    own = next((m for m in members.values() if m.user_id == actor.pk), None)
    if own is None or own.role != Role.ADMIN:
        raise MemberDenied(f"Only an admin of tenant {tenant.name} may change its members.")
    return members


def _member(members: dict[str, Membership], tenant: Tenant, username: str) -> Membership:
    membership = members.get(username)
    if membership is None:
        raise NoSuchMember(f"Tenant {tenant.name} has no member named {username!r}.")
    return membership


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise MemberRefused(f"{role!r} is not a role; the roles are {', '.join(Role.values)}.", "role")


def _keeps_an_admin(members: dict[str, Membership], leaving: Membership) -> bool:
    """Whether an admin other than `leaving` remains who can act: a deactivated account cannot
    sign in, so it manages nothing and does not count."""
    return any(m.role == Role.ADMIN and m.user.is_active for m in members.values() if m.pk != leaving.pk)


@transaction.atomic
def add_member(tenant: Tenant, actor: Any, username: str, role: str) -> Membership:
    """Adds an existing, active account to the tenant. Accounts are made by cluster admins (or
    single sign-on), never here: a tenant admin may only let in someone the portal already knows.
    A deactivated account is refused exactly as an unknown name, so that no one learns of it."""
    _check_role(role)
    members = _locked_members(tenant, actor)
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise MemberRefused(f"No user named {username!r}.", "username")
    already = f"{username} is already a member of {tenant.name}; change their role instead."
    if username in members:
        raise MemberRefused(already, "username")
    membership = Membership(user=user, tenant=tenant, role=role)
    try:
        with transaction.atomic():
            membership.save()
    except IntegrityError:  # added at the same moment in Django admin, which takes no lock
        raise MemberRefused(already, "username") from None
    record_audit(actor, "member.add", membership, tenant=tenant, detail=f"{username} as {role}")
    return membership


@transaction.atomic
def change_member_role(tenant: Tenant, actor: Any, username: str, role: str) -> Membership:
    """Gives a member another role; the tenant keeps at least one admin whose account is active,
    so that someone can still manage it without calling a cluster admin. Admins may demote
    themselves."""
    _check_role(role)
    members = _locked_members(tenant, actor)
    membership = _member(members, tenant, username)
    before = membership.role
    if role == before:
        return membership
    if before == Role.ADMIN and not _keeps_an_admin(members, membership):
        raise MemberRefused(
            f"{username} is the last admin of {tenant.name}; make another member an admin first.", "role"
        )
    membership.role = role
    membership.save(update_fields=["role"])  # saved, not updated: the signal closes their sockets
    record_audit(actor, "member.role", membership, tenant=tenant, detail=f"{username}: {before} -> {role}")
    return membership


@transaction.atomic
def remove_member(tenant: Tenant, actor: Any, username: str) -> None:
    """Takes a user out of the tenant. Their jobs stay with the tenant, whose admins manage them;
    the user no longer sees them. Admins may remove themselves if another active admin remains."""
    members = _locked_members(tenant, actor)
    membership = _member(members, tenant, username)
    if membership.role == Role.ADMIN and not _keeps_an_admin(members, membership):
        raise MemberRefused(
            f"{username} is the last admin of {tenant.name}; make another member an admin first."
        )
    record_audit(
        actor, "member.remove", membership, tenant=tenant, detail=f"{username} (was {membership.role})"
    )
    membership.delete()

"""Refused requests in the audit log, and an alert when one principal keeps being refused.

One mechanism for both realms: a user refused a write by the API (403, or the 404 another
tenant's object answers like a missing one) and an agent refused by the gateway (an unknown or
revoked token, another node's name, a report on a replica placed on another node, a used or
expired enrollment token). Each refusal is an audit entry whose action ends in ".denied". For a
user the entry's actor is the user and its object the target; for an agent, which is no user,
the object is the node (or nothing, for an unknown token) and the detail says what it reached for.

Refusals are counted per principal ("user:7", "node:3", "address:10.0.0.5") in a sliding window
in Redis. When a principal reaches SECURITY_ALERT_THRESHOLD refusals within
SECURITY_ALERT_WINDOW_S, one alert is raised for that window: an audit entry "security.alert", an
ERROR log line and `gpuportal_security_alerts_total` on /metrics. The counts are hints: losing
Redis only delays an alert, and a Redis error never turns a refusal into a server error; the
audit entries are the record.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from redis.exceptions import RedisError
from rest_framework import status
from rest_framework.permissions import SAFE_METHODS
from rest_framework.views import exception_handler

from portal.accounts.models import AuditEntry
from portal.accounts.services import record_audit
from portal.lib.redis import get_redis

log = logging.getLogger(__name__)

DENIED = ".denied"
ALERT = "security.alert"
REALMS = ("user", "agent")
METRICS_KEY = "metrics:security"


def record_refusal(
    realm: str,
    principal: str,
    action: str,
    *,
    actor: Any = None,
    obj: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    detail: str = "",
) -> AuditEntry:
    """Audits one refused request (`action` is what was attempted, e.g. "job.cancel") and counts
    it towards an alert on `principal`. Runs outside the refused request's transaction, which
    rolls back, so that the record stays."""
    from portal.lib.admin import tenant_of

    entry = record_audit(
        actor,
        action + DENIED,
        obj,
        tenant=tenant_of(obj) if obj is not None else None,
        detail=detail[:2000],
        object_type=object_type,
        object_id=object_id,
    )
    count = _count(realm, principal)
    if count >= settings.SECURITY_ALERT_THRESHOLD and _first_alert_in_window(principal):
        raise_alert(realm, principal, count, actor=actor, obj=obj)
    return entry


def raise_alert(realm: str, principal: str, count: int, *, actor: Any = None, obj: Any = None) -> None:
    """One alert, three outlets: the audit log (for the record), an ERROR log line (for the log
    shipper's alerting) and a counter on /metrics (for Prometheus rules)."""
    window = settings.SECURITY_ALERT_WINDOW_S
    detail = f"{count} refused requests by {principal} within {window} s"
    record_audit(actor, ALERT, obj, detail=detail)
    log.error("security alert (%s realm): %s", realm, detail)
    _incr(f"alerts:{realm}")


def _count(realm: str, principal: str) -> int:
    """Adds one refusal to the principal's window and returns how many the window holds."""
    now = time.time()
    window = settings.SECURITY_ALERT_WINDOW_S
    key = f"security:refusals:{principal}"
    try:
        pipe = get_redis().pipeline()
        pipe.zadd(key, {uuid.uuid4().hex: now})
        pipe.zremrangebyscore(key, "-inf", now - window)
        pipe.zcard(key)
        pipe.expire(key, window)
        pipe.hincrby(METRICS_KEY, f"refusals:{realm}", 1)
        return int(pipe.execute()[2])
    except RedisError as exc:
        log.warning("cannot count a refusal of %s: %s", principal, exc)
        return 0


def _first_alert_in_window(principal: str) -> bool:
    try:
        key = f"security:alerted:{principal}"
        return bool(get_redis().set(key, 1, nx=True, ex=settings.SECURITY_ALERT_WINDOW_S))
    except RedisError:
        return False


def _incr(field: str) -> None:
    try:
        get_redis().hincrby(METRICS_KEY, field, 1)
    except RedisError as exc:
        log.warning("cannot count %s: %s", field, exc)


def security_counts() -> dict[str, int]:
    """Refusals and alerts so far, per realm, for /metrics ("refusals:user" -> n, ...)."""
    return {key.decode(): int(value) for key, value in get_redis().hgetall(METRICS_KEY).items()}


# ---------------------------------------------------------------------------
# The API realm: DRF's exception handler, so every write refused with 403 or 404 is recorded,
# on every route, present and future. The response is DRF's own, unchanged: the same 404 for
# another tenant's object as for a missing one. A POST that changes nothing (a view or action
# with `changes_nothing`, such as a dry run) is a read here: its refusals are not recorded.
# ---------------------------------------------------------------------------

REFUSED = (status.HTTP_403_FORBIDDEN, status.HTTP_404_NOT_FOUND)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    response = exception_handler(exc, context)
    request, view = context.get("request"), context.get("view")
    if (
        response is None
        or response.status_code not in REFUSED
        or request is None
        or request.method in SAFE_METHODS
        or getattr(view, "changes_nothing", False)
        or not getattr(request.user, "is_authenticated", False)
    ):
        return response
    model, target_id, obj = _target(view)
    name = getattr(view, "basename", None) or type(view).__name__.lower()
    what = getattr(view, "action", None) or request.method.lower()
    record_refusal(
        "user",
        f"user:{request.user.pk}",
        f"{name}.{what}",
        actor=request.user,
        obj=obj,
        object_type=model._meta.label if model is not None else "",
        object_id=target_id,
        detail=f"{request.method} {request.path}: {response.status_code}",
    )
    return response


def _target(view: Any) -> tuple[type[models.Model] | None, str, models.Model | None]:
    """The model, id and (if it exists at all, in any tenant) object the refused request named."""
    try:
        model = view.get_queryset().model
    except Exception:  # a view without a queryset names no object
        return None, "", None
    field = getattr(view, "lookup_field", "pk")
    target_id = str(view.kwargs.get(getattr(view, "lookup_url_kwarg", None) or field, ""))[:64]
    if not target_id:
        return model, "", None
    try:
        return model, target_id, model._default_manager.filter(**{field: target_id}).first()
    except (ValueError, TypeError, ValidationError):  # an id of the wrong shape names nothing
        return model, target_id, None

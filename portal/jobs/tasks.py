from __future__ import annotations

import smtplib
import uuid
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from portal.accounts import webhooks
from portal.jobs import notifications
from portal.jobs.services import (
    delete_expired_logs,
    downsample_telemetry,
    enforce_time_limits,
    report_idle_jobs,
)
from scheduler.tasks import loop_paused

PAUSED: dict[str, Any] = {"paused": True}


@shared_task
def check_time_limits() -> dict[str, Any]:
    if loop_paused():
        return PAUSED
    return enforce_time_limits(
        timezone.now(), settings.TIME_LIMIT_WARNING_S, settings.TIME_LIMIT_FORCE_AFTER_S
    )


@shared_task
def check_idle_jobs() -> Any:
    if loop_paused():
        return PAUSED
    return report_idle_jobs(timezone.now(), settings.IDLE_BELOW_PCT, settings.IDLE_AFTER_S)


@shared_task
def compact_telemetry() -> dict[str, Any]:
    if loop_paused():
        return PAUSED
    return downsample_telemetry(timezone.now(), settings.TELEMETRY_RETENTION_DAYS)


@shared_task
def expire_logs() -> dict[str, Any]:
    if loop_paused():
        return PAUSED
    return delete_expired_logs(timezone.now(), settings.LOG_RETENTION_DAYS)


@shared_task
def collect_checkpoints() -> dict[str, Any]:
    """Checkpoint garbage collection (portal.jobs.checkpoints)."""
    from portal.jobs.checkpoints import collect_checkpoints as collect

    if loop_paused():
        return PAUSED
    return collect()


# An SMTP server that is away or refuses for a while: tried again, 1, 2, 4, ... minutes apart.
MAIL_RETRY = {"autoretry_for": (OSError, smtplib.SMTPException), "retry_backoff": 60, "max_retries": 6}


@shared_task(**MAIL_RETRY)
def mail_job_state(job_id: int, state: str, reason: str) -> int:
    return notifications.mail_job_state(job_id, state, reason)


@shared_task(**MAIL_RETRY)
def mail_idle_job(job_id: int, message: str) -> int:
    return notifications.mail_idle_job(job_id, message)


# A webhook receiver that is away, overloaded (5xx) or asks to slow down (429): tried again 10 s,
# 1 min and 5 min later; any other answer is final (a 404 stays a 404).
WEBHOOK_BACKOFF_S = (10, 60, 300)


@shared_task(bind=True)
def post_job_state(self: Any, job_id: int, state: str, reason: str) -> int:
    """Queues a delivery to each of the owner's enabled webhooks; returns how many."""
    found = notifications.job_state_event(job_id, state, reason)
    return post_to_webhooks(self.request.id, *found) if found else 0


@shared_task(bind=True)
def post_idle_job(self: Any, job_id: int, message: str) -> int:
    found = notifications.idle_job_event(job_id, message)
    return post_to_webhooks(self.request.id, *found) if found else 0


def post_to_webhooks(task_id: str, user_id: int, payload: dict[str, Any]) -> int:
    """One task per webhook, so that a receiver that fails is retried on its own and one that
    answered hears the event once. The delivery id stays the same through retries, and through
    a second run of the posting task (`task_id`) after its worker was lost (acks late), for the
    receiver to drop a repeat."""
    ids = webhooks.enabled_webhook_ids(user_id)
    for webhook_id in ids:
        delivery_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{task_id}/{webhook_id}")
        deliver_webhook.delay(webhook_id, payload, str(delivery_id))
    return len(ids)


@shared_task(bind=True, max_retries=len(WEBHOOK_BACKOFF_S))
def deliver_webhook(self: Any, webhook_id: int, payload: dict[str, Any], delivery_id: str) -> dict[str, Any]:
    outcome = webhooks.deliver(webhook_id, payload, delivery_id)
    if outcome is None:
        return {"skipped": "the webhook was deleted or disabled"}
    if outcome.retry and self.request.retries < len(WEBHOOK_BACKOFF_S):
        raise self.retry(countdown=WEBHOOK_BACKOFF_S[self.request.retries])
    return outcome.as_dict()

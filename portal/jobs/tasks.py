from __future__ import annotations

import smtplib
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

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

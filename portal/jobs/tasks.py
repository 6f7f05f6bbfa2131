from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from portal.jobs.services import downsample_telemetry, enforce_time_limits, report_idle_jobs


@shared_task
def check_time_limits() -> dict[str, int]:
    return enforce_time_limits(
        timezone.now(), settings.TIME_LIMIT_WARNING_S, settings.TIME_LIMIT_FORCE_AFTER_S
    )


@shared_task
def check_idle_jobs() -> list[int]:
    return report_idle_jobs(timezone.now(), settings.IDLE_BELOW_PCT, settings.IDLE_AFTER_S)


@shared_task
def compact_telemetry() -> dict[str, int]:
    return downsample_telemetry(timezone.now(), settings.TELEMETRY_RETENTION_DAYS)

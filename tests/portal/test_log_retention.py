from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from portal.jobs.choices import JobState
from portal.jobs.models import Job, JobAttempt, JobEvent, LogLine
from portal.jobs.services import delete_expired_logs

pytestmark = pytest.mark.django_db


def job_with_output(api_for: Any, small_job: dict[str, Any], state: str, finished_at: datetime | None) -> int:
    """A job in `state` that ended at `finished_at`, with three lines from each of two attempts."""
    job_id = api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"]
    Job.objects.filter(pk=job_id).update(state=state, finished_at=finished_at)
    for number in (1, 2):
        attempt = JobAttempt.objects.create(job_id=job_id, number=number)
        LogLine.objects.bulk_create(
            LogLine(attempt=attempt, stream="stdout", seq=seq, text=f"line {seq}") for seq in range(3)
        )
    return int(job_id)


def lines_of(job_id: int) -> int:
    return LogLine.objects.filter(attempt__job_id=job_id).count()


def deletion_events(job_id: int) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job_id, data__log="deleted").values_list("reason", flat=True))


def test_output_of_jobs_that_ended_before_the_retention_goes_once(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    now = timezone.now()
    succeeded = job_with_output(api_for, small_job, JobState.SUCCEEDED, now - timedelta(days=100))
    failed = job_with_output(api_for, small_job, JobState.FAILED, now - timedelta(days=91))
    recent = job_with_output(api_for, small_job, JobState.CANCELLED, now - timedelta(days=89))
    # Only an ended job loses its output: the state decides, not a stray finished_at.
    running = job_with_output(api_for, small_job, JobState.RUNNING, now - timedelta(days=100))
    pending = job_with_output(api_for, small_job, JobState.PENDING, None)

    # Batches of 2 lines: each job's 6 lines go in 3 batches, with one event.
    assert delete_expired_logs(now, retention_days=90, batch_size=2) == {"jobs": 2, "lines": 12}
    assert [lines_of(job) for job in (succeeded, failed, recent, running, pending)] == [0, 0, 6, 6, 6]
    assert deletion_events(succeeded) == deletion_events(failed) == ["output deleted after 90 days"]
    assert deletion_events(recent) == deletion_events(running) == deletion_events(pending) == []
    alice = api_for("alice")
    assert alice.get(f"/api/v1/jobs/{succeeded}/logs/").json()["count"] == 0
    assert alice.get(f"/api/v1/jobs/{recent}/logs/").json()["count"] == 3

    # Running it again changes nothing.
    events = JobEvent.objects.count()
    assert delete_expired_logs(now, retention_days=90, batch_size=2) == {"jobs": 0, "lines": 0}
    assert [lines_of(job) for job in (succeeded, failed, recent, running, pending)] == [0, 0, 6, 6, 6]
    assert JobEvent.objects.count() == events


def test_a_retention_of_0_keeps_output_forever(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    now = timezone.now()
    ancient = job_with_output(api_for, small_job, JobState.SUCCEEDED, now - timedelta(days=3650))
    assert delete_expired_logs(now, retention_days=0) == {"jobs": 0, "lines": 0}
    assert lines_of(ancient) == 6 and deletion_events(ancient) == []
    # The same job does go under a retention of a year.
    assert delete_expired_logs(now, retention_days=365) == {"jobs": 1, "lines": 6}
    assert deletion_events(ancient) == ["output deleted after 365 days"]

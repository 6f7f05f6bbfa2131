"""Agent reports take the job's row lock before the attempt's, as every other writer does.

Under load a replica report that locked its attempt and then waited for the job met a
transition that held the job and waited for the attempt: PostgreSQL broke the deadlock by
failing one of them. Here the other writer holds the job while a report comes in, and only
then touches the attempt; with the order of locks the same on both sides, both go through."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from agents.protocol import AttemptState, AttemptStatus, utc_now
from portal.agentgw.desired import agent_attempt_id
from portal.jobs.models import Job, JobAttempt
from portal.jobs.services import record_attempt_status
from tests.conftest import wait_for
from tests.portal.store_helpers import placed_attempt

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_for_a_lock(backend_pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
            [backend_pid],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def test_a_report_waits_for_the_job_lock_before_it_locks_the_attempt(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    node, attempt = placed_attempt(api_for)
    job = attempt.job
    report = AttemptStatus(
        attempt_id=agent_attempt_id(attempt, 0),
        job_id=str(job.pk),
        state=AttemptState.RUNNING,
        generation=1,
        time=utc_now(),
    )

    outcome: dict[str, Any] = {}

    def report_from_the_agent() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            outcome["pid"] = cursor.fetchone()[0]
        try:
            outcome["result"] = record_attempt_status(node, report)
        except Exception as error:  # the test reports whatever broke it
            outcome["error"] = error
        finally:
            connection.close()

    reporter = threading.Thread(target=report_from_the_agent)
    with transaction.atomic():
        # The other writer: the job first ...
        Job.objects.select_for_update().get(pk=job.pk)
        reporter.start()
        wait_for(lambda: "pid" in outcome, 10, "the report's connection")
        wait_for(lambda: waiting_for_a_lock(outcome["pid"]), 10, "the report to wait for a lock")
        with connection.cursor() as cursor:
            # ... then the attempt. Had the report locked the attempt, this would wait for it
            # while the report waits for the job: a deadlock, or this lock timeout.
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        JobAttempt.objects.filter(pk=attempt.pk).update(end_reason="touched by the other writer")
    reporter.join(timeout=30)

    assert not reporter.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] is True
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.state == "running"  # the report went through after the other writer
    assert attempt.end_reason == "touched by the other writer"
    assert attempt.replica_states["0"]["state"] == "running"

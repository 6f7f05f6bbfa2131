"""The cycle's last write, the pending jobs' statuses, never waits for a job another writer holds.

By then the cycle has locked and written nodes (the desired-set revision of every node it
started or stopped work on). A writer that holds a job and then needs its node (cancelling a
suspended job frees the GPUs it is parked on and bumps their node's revision) met the cycle
waiting for that job: PostgreSQL broke the deadlock by failing one of them. The status is
advisory, so the cycle skips a job it cannot lock at once, and the next cycle writes it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from portal.cluster.models import Node
from portal.jobs.models import Job
from scheduler import core
from scheduler.store import load_snapshot, record_pending_statuses
from tests.conftest import wait_for
from tests.portal.test_report_lock_order import waiting_for_a_lock

pytestmark = pytest.mark.django_db(transaction=True)


def test_statuses_skip_a_job_whose_writer_then_needs_a_node_the_cycle_holds(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    node = Node.objects.get(name="a100-node-1")
    revision = node.desired_revision
    body = {"name": "waits", "vc": "vision", "flavor": "s-A100", "command": "true"}
    response = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    snapshot = load_snapshot(time.time()).snapshot
    status = core.PendingStatus(core.JobId(str(job.pk)), core.ReasonCode.INSUFFICIENT_GPUS, "busy", None)

    job_locked, cycle_holds_node = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def writer() -> None:
        """Holds the job, then writes its node, as a cancellation of a parked job does."""
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=job.pk)
                job_locked.set()
                cycle_holds_node.wait(10)
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '20s'")
                Node.objects.filter(pk=node.pk).update(desired_revision=revision + 7)
        except Exception as error:  # the test reports whatever broke it
            outcome["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert job_locked.wait(10)
    cycle_error = None
    try:
        with transaction.atomic():
            # The cycle: nodes written (desired_set_changed) ...
            Node.objects.filter(pk=node.pk).update(desired_revision=revision + 1)
            cycle_holds_node.set()
            wait_for(lambda: waiting_for_a_lock(outcome["pid"]), 10, "the writer to wait for the node")
            # ... then the statuses, last.
            record_pending_statuses((status,), snapshot)
    except Exception as error:
        cycle_error = error
    thread.join(timeout=60)

    assert cycle_error is None, cycle_error
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    node.refresh_from_db()
    assert node.desired_revision == revision + 7  # both writes went through, the writer's last
    job.refresh_from_db()
    assert job.pending_message != "busy"  # skipped while held; the next cycle writes it
    record_pending_statuses((status,), snapshot)
    job.refresh_from_db()
    assert job.pending_message == "busy"

"""Revoking a node takes the locks of the jobs on it before the node's, as every other writer does.

A revoke that locked the node and then waited for a job running there met a writer that held
that job and then needed the node: a cancellation (freeing the job's GPUs bumps the node's
desired-set revision) or a scheduling cycle (it locks the jobs it moves, then the nodes it
places on FOR SHARE). PostgreSQL broke the deadlock by failing one of them. Here the other
writer holds the job while the revoke comes in, and only then touches the node; with the order
of locks the same on both sides, both go through, one after the other."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from portal.cluster.models import Node
from portal.cluster.services import revoke_node
from portal.jobs.models import Allocation, Job
from portal.jobs.services import cancel_job
from scheduler import core
from scheduler.store import load_snapshot, still_placeable
from scheduler.tasks import load_profile
from tests.conftest import wait_for
from tests.portal.store_helpers import placed_attempt
from tests.portal.test_report_lock_order import waiting_for_a_lock

pytestmark = pytest.mark.django_db(transaction=True)


def revoke_in_another_connection(node: Node, outcome: dict[str, Any]) -> threading.Thread:
    def revoke() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            outcome["pid"] = cursor.fetchone()[0]
        try:
            outcome["requeued"] = revoke_node(node, None, "stolen")
        except Exception as error:  # the test reports whatever broke it
            outcome["error"] = error
        finally:
            connection.close()

    return threading.Thread(target=revoke)


def test_a_revoke_waits_for_a_cancellation_that_holds_a_job_on_the_node(api_for, users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    node, attempt = placed_attempt(api_for)
    job = attempt.job
    outcome: dict[str, Any] = {}
    revoker = revoke_in_another_connection(node, outcome)
    with transaction.atomic():
        # The cancellation: the job first ...
        job = Job.objects.select_for_update().get(pk=job.pk)
        revoker.start()
        wait_for(lambda: "pid" in outcome, 10, "the revoke's connection")
        wait_for(lambda: waiting_for_a_lock(outcome["pid"]), 10, "the revoke to wait for a lock")
        with connection.cursor() as cursor:
            # ... then the node (its desired-set revision). Had the revoke locked the node first,
            # this would wait for it while the revoke waits for the job: a deadlock.
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        cancel_job(job, users["alice"])
    revoker.join(timeout=30)

    assert not revoker.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["requeued"] == []  # the job had ended when the revoke got to it
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    node.refresh_from_db()
    assert node.revoked_at is not None and node.state == "cordoned"
    assert not Allocation.objects.filter(released_at__isnull=True).exists()


def test_a_revoke_waits_for_a_cycle_that_moves_a_job_on_the_node(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """The cycle locks the jobs it moves (a running job whose turn ends, say) and then, for a
    start on the same node, the node FOR SHARE (still_placeable)."""
    node, attempt = placed_attempt(api_for)
    running = attempt.job
    body = {"name": "next", "vc": "vision", "flavor": "s-A100", "command": "sleep 600"}
    response = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        plan = core.decide(loaded.snapshot, load_profile(), now)
    [start] = plan.starts
    assert [r.node for r in start.placement] == [node.name]
    waiting = Job.objects.get(pk=response.json()["id"])

    outcome: dict[str, Any] = {}
    revoker = revoke_in_another_connection(node, outcome)
    with transaction.atomic():
        # The cycle: the jobs it moves first, in id order ...
        Job.objects.select_for_update().order_by("pk").in_bulk([running.pk, waiting.pk])
        revoker.start()
        wait_for(lambda: "pid" in outcome, 10, "the revoke's connection")
        wait_for(lambda: waiting_for_a_lock(outcome["pid"]), 10, "the revoke to wait for a lock")
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        # ... then the node it places on, which the revoke must not be holding.
        assert still_placeable([(waiting, start)], loaded) == [(waiting, start)]
    revoker.join(timeout=30)

    assert not revoker.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["requeued"] == [running.pk]
    assert Job.objects.get(pk=running.pk).state == "pending"
    node.refresh_from_db()
    assert node.revoked_at is not None and node.state == "cordoned"

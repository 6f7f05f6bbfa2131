"""Requeueing several jobs locks all their nodes, in id order, before it writes the first.

It requeued job by job, and each requeue wrote its job's nodes (their desired-set revision), so
the nodes were written in the jobs' order, not the nodes'. A cycle locks the nodes it places on
FOR SHARE in id order; holding the lower one while the requeue held the higher one and then
wanted the lower, each waited for the other and PostgreSQL failed one of them."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job
from portal.jobs.services import requeue_jobs_holding
from scheduler.tasks import run_cycle
from tests.conftest import wait_for
from tests.portal.test_report_lock_order import waiting_for_a_lock

pytestmark = pytest.mark.django_db(transaction=True)


def place_on(api_for: Any, node: Node, name: str) -> Job:
    Node.objects.update(state="cordoned")
    Node.objects.filter(pk=node.pk).update(state="ready")
    body = {"name": name, "vc": "vision", "flavor": "s-A100", "command": "sleep 600"}
    response = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    assert run_cycle()["started"] == 1
    return Job.objects.get(pk=response.json()["id"])


def test_a_requeue_of_jobs_on_two_nodes_waits_for_a_cycle_holding_the_lower_node(
    api_for, paused_loop
) -> None:  # type: ignore[no-untyped-def]
    lower, higher = Node.objects.filter(name__in=["a100-node-1", "a100-node-2"]).order_by("pk")
    first = place_on(api_for, higher, "first")  # the lower job id on the higher node
    second = place_on(api_for, lower, "second")
    assert first.pk < second.pk

    outcome: dict[str, Any] = {}

    def requeue() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            outcome["pid"] = cursor.fetchone()[0]
        try:
            with transaction.atomic():
                outcome["requeued"] = requeue_jobs_holding(
                    Allocation.objects.filter(released_at__isnull=True), "node lost"
                )
        except Exception as error:  # the test reports whatever broke it
            outcome["error"] = error
        finally:
            connection.close()

    writer = threading.Thread(target=requeue)
    with transaction.atomic(), connection.cursor() as cursor:
        # The cycle: the nodes it places on, FOR SHARE in id order; the lower one first ...
        cursor.execute("SELECT id FROM cluster_node WHERE id = %s FOR SHARE", [lower.pk])
        writer.start()
        wait_for(lambda: "pid" in outcome, 10, "the requeue's connection")
        wait_for(lambda: waiting_for_a_lock(outcome["pid"]), 10, "the requeue to wait for a lock")
        cursor.execute("SET LOCAL lock_timeout = '5s'")
        # ... then the higher one, which the requeue must not be holding while it waits.
        cursor.execute("SELECT id FROM cluster_node WHERE id = %s FOR SHARE", [higher.pk])
    writer.join(timeout=30)

    assert not writer.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert sorted(outcome["requeued"]) == [first.pk, second.pk]
    assert set(Job.objects.filter(pk__in=[first.pk, second.pk]).values_list("state", flat=True)) == {
        "pending"
    }

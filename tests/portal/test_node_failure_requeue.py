"""A lost node's jobs go back to the queue, except those whose spec says they must not run
twice: they fail with NODE_FAIL (reliability-security.md F2, F3). A node is lost whatever an
admin made of it (cordoned, draining), and no job starts on a node revoked during the cycle."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from portal.cluster.models import Node
from portal.cluster.services import lost_nodes, mark_silent_nodes_not_ready, revoke_node, set_node_state
from portal.jobs.models import Allocation, Job, JobAttempt
from portal.jobs.services import requeue_jobs_of_lost_node
from scheduler import core
from scheduler.store import apply_plan, load_snapshot
from scheduler.tasks import load_profile, run_cycle
from tests.portal.store_helpers import placed_attempt, run

pytestmark = pytest.mark.django_db(transaction=True)


def submit(client: Any, name: str, **spec: Any) -> int:
    body = {"name": name, "vc": "vision", "flavor": "s-A100", "command": "sleep 600", **spec}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


def test_a_lost_node_requeues_its_jobs_unless_they_opted_out(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    Node.objects.filter(name="a100-node-1").update(state="ready")
    alice = api_for("alice")
    again = submit(alice, "again")
    once = submit(alice, "once", requeue_on_node_failure=False)
    run_cycle()
    assert set(Job.objects.values_list("state", flat=True)) == {"scheduled"}

    requeued = requeue_jobs_of_lost_node(Node.objects.get(name="a100-node-1"))

    assert requeued == [again, once]  # both attempts ended as lost
    assert Job.objects.get(pk=again).state == "pending"
    failed = Job.objects.get(pk=once)
    assert failed.state == "failed" and failed.end_reason.startswith("NODE_FAIL: node a100-node-1 lost")
    assert list(failed.events.exclude(to_state="").values_list("to_state", flat=True))[-2:] == [
        "lost",
        "failed",
    ]
    assert {a.state for a in JobAttempt.objects.filter(job_id__in=[again, once])} == {"lost"}
    assert not Allocation.objects.filter(released_at__isnull=True).exists()
    shown = alice.get(f"/api/v1/jobs/{once}/").json()
    assert shown["state"] == "failed" and "NODE_FAIL" in shown["end_reason"]


def test_the_spec_field_must_be_a_boolean(api_for) -> None:  # type: ignore[no-untyped-def]
    body = {
        "name": "x",
        "vc": "vision",
        "flavor": "s-A100",
        "command": "true",
        "requeue_on_node_failure": "maybe",
    }
    response = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400 and "requeue_on_node_failure" in response.json()
    assert not Job.objects.exists()


@pytest.mark.parametrize(("action", "job_state"), [("drain", "checkpointing"), ("cordon", "running")])
def test_a_cordoned_or_draining_node_that_goes_silent_is_lost(
    api_for, paused_loop, action, job_state
) -> None:  # type: ignore[no-untyped-def]
    """Its jobs cannot stop or report there: they are requeued as for any lost node, and the node
    keeps the state its admin gave it."""
    node, attempt = placed_attempt(api_for)
    run(attempt.job_id)
    set_node_state(node, action, None)
    run_cycle()  # a drain tells the job to stop
    assert Job.objects.get(pk=attempt.job_id).state == job_state
    now = timezone.now()
    Node.objects.exclude(pk=node.pk).update(last_heartbeat_at=now)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=49))
    assert mark_silent_nodes_not_ready(now, 30) == []  # only a ready node becomes not-ready
    assert lost_nodes(now, 50) == []  # not silent for long enough yet
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=51))

    assert lost_nodes(now, 50) == [node.name]
    assert requeue_jobs_of_lost_node(node) == [attempt.job_id]

    assert Job.objects.get(pk=attempt.job_id).state == "pending"
    assert not Allocation.objects.filter(node=node, released_at__isnull=True).exists()
    assert Node.objects.get(pk=node.pk).state == {"drain": "draining", "cordon": "cordoned"}[action]
    assert lost_nodes(now, 50) == []  # nothing left to requeue there


def test_no_job_starts_on_a_node_revoked_between_the_snapshot_and_the_plan(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    Node.objects.filter(name="a100-node-1").update(state="ready")
    job_id = submit(api_for("alice"), "x")
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        plan = core.decide(loaded.snapshot, load_profile(), now)
    assert [s.job_id for s in plan.starts] == [str(job_id)]
    revoke_node(Node.objects.get(name="a100-node-1"), None, "stolen")  # commits meanwhile

    with transaction.atomic():
        assert apply_plan(plan, loaded, now)["started"] == 0

    job = Job.objects.get(pk=job_id)
    assert job.state == "pending" and not JobAttempt.objects.filter(job=job).exists()
    assert not Allocation.objects.exists()
    # A node an admin cordons meanwhile gets nothing either; once it is ready again, it does.
    node = Node.objects.get(name="a100-node-2")
    Node.objects.filter(pk=node.pk).update(state="ready")
    with transaction.atomic():
        loaded = load_snapshot(now)
        plan = core.decide(loaded.snapshot, load_profile(), now)
    set_node_state(node, "cordon", None)
    with transaction.atomic():
        assert apply_plan(plan, loaded, now)["started"] == 0
    set_node_state(node, "uncordon", None)
    Node.objects.filter(pk=node.pk).update(state="ready")
    with transaction.atomic():
        assert apply_plan(plan, load_snapshot(now), now)["started"] == 1

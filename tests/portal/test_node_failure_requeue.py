"""A lost node's jobs go back to the queue, except those whose spec says they must not run
twice: they fail with NODE_FAIL (reliability-security.md F2, F3)."""

from __future__ import annotations

from typing import Any

import pytest

from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobAttempt
from portal.jobs.services import requeue_jobs_of_lost_node
from scheduler.tasks import run_cycle

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

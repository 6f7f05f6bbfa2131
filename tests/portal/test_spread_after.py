"""A job with `spread_after` that has waited that long starts as one-GPU replicas over several
nodes; its attempt runs that many replicas, each with its share of the CPU and memory."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.protocol import AttemptState, AttemptStatus, utc_now
from portal.agentgw.desired import agent_attempt_id, desired_set_for
from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobAttempt
from portal.jobs.services import record_attempt_status
from scheduler.tasks import run_cycle

pytestmark = pytest.mark.django_db(transaction=True)


def submit(client: Any, name: str, flavor: str, **spec: Any) -> Any:
    body = {"name": name, "vc": "vision", "flavor": flavor, "command": "sleep 600", **spec}
    return client.post("/api/v1/jobs/", body, format="json")


def only_ready(name: str) -> None:
    Node.objects.exclude(name=name).update(state="cordoned")
    Node.objects.filter(name=name).update(state="ready")


def test_spread_after_is_refused_for_one_gpu_replicas_and_read_as_a_duration(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    refused = alice.post(
        "/api/v1/jobs/",
        {
            "name": "one",
            "vc": "vision",
            "resources": {"gpus": 1, "gpu_model": "A100", "cpu": 4, "memory_gb": 8},
            "command": "true",
            "spread_after": "10m",
        },
        format="json",
    )
    assert refused.status_code == 400
    assert "more than one GPU per replica" in refused.json()["spread_after"][0]
    bad = submit(alice, "bad", "l-A100", spread_after="soon")
    assert bad.status_code == 400 and "spread_after" in bad.json()
    assert not Job.objects.exists()
    accepted = submit(alice, "wide", "l-A100", spread_after="30m")
    assert accepted.status_code == 201, accepted.json()
    assert Job.objects.get(pk=accepted.json()["id"]).spec["spread_after"] == 1800


def test_a_job_that_waited_spreads_over_two_half_free_nodes(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    # Four GPUs busy on each A100 node: 8 free in all, no node with 8.
    for node in ("a100-node-1", "a100-node-2"):
        only_ready(node)
        assert submit(alice, f"half-{node}", "m-A100").status_code == 201
        assert run_cycle()["started"] == 1
    Node.objects.filter(name__startswith="a100").update(state="ready")
    wide = submit(alice, "wide", "l-A100", spread_after="10m").json()["id"]
    kept = submit(alice, "kept", "l-A100").json()["id"]  # no spread_after: waits for a node

    run_cycle()
    assert Job.objects.get(pk=wide).state == "pending"  # it has not waited 10 minutes yet

    Job.objects.filter(pk__in=[wide, kept]).update(submitted_at=timezone.now() - timedelta(minutes=11))
    assert run_cycle()["started"] == 1
    job = Job.objects.get(pk=wide)
    assert job.state == "scheduled" and Job.objects.get(pk=kept).state == "pending"
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.replicas == 8
    assert [a["replicas"] for a in alice.get(f"/api/v1/jobs/{wide}/").json()["attempts"]] == [8]
    allocations = Allocation.objects.filter(attempt=attempt)
    assert sorted(allocations.values_list("replica", flat=True)) == list(range(8))
    per_node = {name: allocations.filter(node__name=name).count() for name in ("a100-node-1", "a100-node-2")}
    assert per_node == {"a100-node-1": 4, "a100-node-2": 4}

    # Each replica is told its share: l-A100 is 256 CPUs and 1,024 GB per 8 GPUs.
    node = Node.objects.get(name="a100-node-1")
    mine = [a for a in desired_set_for(node).attempts if a.job_id == str(wide)]
    assert len(mine) == 4
    assert all(
        len(a.gpus) == 1 and a.resources.cpus == 32 and a.resources.memory_mib == 128 * 1024 for a in mine
    )

    # The job runs once all eight replicas do, not after the first one.
    for replica in range(8):
        on = (
            "a100-node-1"
            if allocations.filter(replica=replica, node__name="a100-node-1").exists()
            else "a100-node-2"
        )
        report = AttemptStatus(
            attempt_id=agent_attempt_id(attempt, replica),
            job_id=str(wide),
            state=AttemptState.RUNNING,
            generation=1,
            time=utc_now(),
        )
        assert record_attempt_status(Node.objects.get(name=on), report)
        expected = "running" if replica == 7 else "starting"
        assert Job.objects.get(pk=wide).state == expected, replica

"""A preempted job's events name the job it was preempted for only when that job is of its own
tenant: nobody learns that another tenant's job exists."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import transaction

from portal.cluster.models import Node
from portal.jobs.models import Job
from portal.jobs.services import transition_job
from scheduler import core
from scheduler.store import apply_plan, load_snapshot
from scheduler.tasks import load_profile, run_cycle

pytestmark = pytest.mark.django_db(transaction=True)


def submit(client: Any, name: str, vc: str) -> int:
    body = {"name": name, "vc": vc, "flavor": "s-A100", "command": "sleep 600"}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


CASES = [("bob", "vision", True), ("carol", "speech", False)]


@pytest.mark.parametrize(("user", "vc", "named"), CASES)
def test_the_preemptor_is_named_only_within_the_tenant(api_for, paused_loop, user, vc, named) -> None:  # type: ignore[no-untyped-def]
    Node.objects.update(state="ready")
    victim = submit(api_for("alice"), "victim", "vision")
    run_cycle(load_profile())
    assert transition_job(Job.objects.get(pk=victim), "running", label="test")
    preemptor = submit(api_for(user), "preemptor", vc)
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        preemption = core.Preemption(
            core.JobId(str(victim)), "priority", "preempted", 30.0, core.JobId(str(preemptor))
        )
        assert apply_plan(core.Plan(preemptions=(preemption,)), loaded, now)["preempted"] == 1
    shown = api_for("alice").get(f"/api/v1/jobs/{victim}/events/").json()["results"]
    (event,) = [e for e in shown if e["to_state"] == "checkpointing"]
    assert event["data"]["preemption"] == "priority"
    assert event["data"].get("for_job") == (str(preemptor) if named else None)

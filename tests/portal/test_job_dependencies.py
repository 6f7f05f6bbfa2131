"""A job may wait for other jobs to succeed first (the spec's `after`, Slurm's afterok): it
waits with reason `dependency` while they run, starts once they all succeeded, and is
cancelled when one ends otherwise. Only jobs the submitter may see can be named."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from portal.cluster.models import Node
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from portal.jobs.services import release_allocations, transition_job
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile

pytestmark = pytest.mark.django_db(transaction=True)


def post(client: Any, name: str, **spec: Any) -> Any:
    body = {"name": name, "vc": "vision", "flavor": "s-A100", "command": "sleep 600", **spec}
    return client.post("/api/v1/jobs/", body, format="json")


def end(job_id: int, state: str) -> None:
    with transaction.atomic():
        job = Job.objects.get(pk=job_id)
        if job.state == JobState.SCHEDULED:
            assert transition_job(job, JobState.RUNNING, label="test")
        assert transition_job(job, state, label="test")
        release_allocations(job)


def test_a_job_waits_for_its_dependencies_and_starts_once_they_succeeded(
    api_for: Any, paused_loop: Any
) -> None:
    Node.objects.update(state="ready")
    profile = live_profile()
    alice = api_for("alice")
    first = post(alice, "prepare").json()["id"]
    second = post(alice, "train", after=[first, first]).json()
    assert second["after"] == [first]
    run_cycle(profile)
    waiting = Job.objects.get(pk=second["id"])
    assert Job.objects.get(pk=first).state == JobState.SCHEDULED
    assert (waiting.state, waiting.pending_reason) == (JobState.PENDING, "dependency")  # room, yet it waits
    assert waiting.pending_message == f"Waiting for job {first} (pending) to succeed."
    run_cycle(profile)  # each cycle says where the dependency stands
    assert (
        Job.objects.get(pk=second["id"]).pending_message == f"Waiting for job {first} (scheduled) to succeed."
    )

    end(first, JobState.SUCCEEDED)
    run_cycle(profile)
    assert Job.objects.get(pk=second["id"]).state == JobState.SCHEDULED

    third = post(alice, "evaluate", after=[second["id"]]).json()["id"]
    fourth = post(alice, "report", after=[third]).json()["id"]
    run_cycle(profile)
    assert Job.objects.get(pk=third).pending_reason == "dependency"
    end(second["id"], JobState.FAILED)
    run_cycle(profile)  # one cycle cancels the whole chain behind the failed job
    cancelled = Job.objects.get(pk=third)
    assert cancelled.state == JobState.CANCELLED
    assert cancelled.end_reason == f"DEPENDENCY: job {second['id']}, which it depends on, failed"
    assert cancelled.events.last().reason == f"job {second['id']}, which it depends on, failed"
    assert (
        Job.objects.get(pk=fourth).end_reason
        == f"DEPENDENCY: job {third}, which it depends on, was cancelled"
    )


def test_only_jobs_the_submitter_may_see_and_that_may_still_succeed_can_be_named(
    api_for: Any, paused_loop: Any
) -> None:
    alice, carol = api_for("alice"), api_for("carol")
    theirs = carol.post(
        "/api/v1/jobs/",
        {"name": "theirs", "vc": "speech", "flavor": "s-V100", "command": "true"},
        format="json",
    ).json()["id"]
    failed = post(alice, "broken").json()["id"]
    Node.objects.update(state="ready")
    run_cycle()
    end(failed, JobState.FAILED)
    before = Job.objects.count()
    for after, message in [
        ([theirs], f"No job {theirs}."),
        ([999_999], "No job 999999."),
        ([failed], f"Job {failed} failed, so this job could never start."),
    ]:
        refused = post(alice, "waits", after=after)
        assert refused.status_code == 400 and refused.json() == {"after": [message]}, refused.json()
    assert post(alice, "waits", after=["x"]).json()["after"]
    assert post(alice, "waits", after=list(range(1, 66))).json()["after"]
    assert Job.objects.count() == before


def test_a_job_array_after_one_job_checks_it_once(api_for: Any, paused_loop: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    alice = api_for("alice")
    first = post(alice, "prepare").json()["id"]
    spec = {"name": "sweep", "vc": "vision", "flavor": "s-A100", "command": "true", "after": [first]}
    with CaptureQueriesContext(connection) as queries:
        made = alice.post("/api/v1/jobs/bulk/", {"job": spec, "array": 50}, format="json")
    assert made.status_code == 201, made.json()
    assert sum("cluster_" not in q["sql"] and '"jobs_job"."state"' in q["sql"] for q in queries) == 1
    afters = Job.objects.filter(pk__in=made.json()["ids"]).values_list("after", flat=True)
    assert len(afters) == 50 and all(after == [first] for after in afters)

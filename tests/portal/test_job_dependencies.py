"""A job may wait for other jobs first (the spec's `after`). By default (`after_type: ok`,
Slurm's afterok) it waits with reason `dependency` while they run, starts once they all
succeeded, and is cancelled when one ends otherwise; `any` (afterany) starts once they all
ended, however; `notok` (afternotok) starts once they all ended if one did not succeed, and is
cancelled if they all did. Only jobs the submitter may see can be named."""

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
    api_for: Any, users: Any, paused_loop: Any
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
    # Nor a job of another tenant the submitter also belongs to: the waiting job's reason and
    # events, which everyone of its tenant reads, would name it.
    from portal.accounts.models import Membership, Tenant

    Membership.objects.create(user=users["alice"], tenant=Tenant.objects.get(name="speech"), role="viewer")
    assert api_for("alice").get(f"/api/v1/jobs/{theirs}/").status_code == 200  # she sees it
    refused = post(alice, "waits", after=[theirs])
    assert refused.status_code == 400 and refused.json() == {"after": [f"No job {theirs}."]}
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


# What a job waiting for one scheduled job says, by after_type.
WAITING = {
    "ok": "Waiting for job {dep} (scheduled) to succeed.",
    "any": "Waiting for job {dep} (scheduled) to end.",
    "notok": (
        "Waiting for job {dep} (scheduled) to end; it starts only if a job it depends on fails, "
        "is cancelled or times out."
    ),
}
NOTOK_CANCELLED = "(after_type notok: it was to start only if one did not)"

# after_type, how the job it waits for ends, and then the job's end reason (None: it starts).
OUTCOMES = [
    ("ok", JobState.SUCCEEDED, None),
    ("ok", JobState.FAILED, "job {dep}, which it depends on, failed"),
    ("ok", JobState.CANCELLED, "job {dep}, which it depends on, was cancelled"),
    ("ok", JobState.TIMED_OUT, "job {dep}, which it depends on, timed out"),
    ("any", JobState.SUCCEEDED, None),
    ("any", JobState.FAILED, None),
    ("any", JobState.CANCELLED, None),
    ("any", JobState.TIMED_OUT, None),
    ("notok", JobState.SUCCEEDED, f"job {{dep}}, which it depends on, succeeded {NOTOK_CANCELLED}"),
    ("notok", JobState.FAILED, None),
    ("notok", JobState.CANCELLED, None),
    ("notok", JobState.TIMED_OUT, None),
]


@pytest.mark.parametrize(
    ("after_type", "outcome", "end_reason"), OUTCOMES, ids=[f"{t}-{o}" for t, o, _ in OUTCOMES]
)
def test_each_after_type_starts_or_cancels_the_job_by_how_its_dependency_ended(
    api_for: Any, paused_loop: Any, after_type: str, outcome: str, end_reason: str | None
) -> None:
    Node.objects.update(state="ready")
    profile = live_profile()
    alice = api_for("alice")
    dep = post(alice, "prepare").json()["id"]
    made = post(alice, "next", after=[dep], after_type=after_type)
    assert made.status_code == 201, made.json()
    assert made.json()["after_type"] == after_type
    job_id = made.json()["id"]
    run_cycle(profile)
    run_cycle(profile)  # the first one's reason was made before it scheduled the dependency
    assert Job.objects.get(pk=dep).state == JobState.SCHEDULED
    waiting = Job.objects.get(pk=job_id)
    assert (waiting.state, waiting.pending_reason, waiting.pending_message) == (
        JobState.PENDING,
        "dependency",
        WAITING[after_type].format(dep=dep),
    )

    end(dep, outcome)
    run_cycle(profile)
    job = Job.objects.get(pk=job_id)
    if end_reason is None:
        assert job.state == JobState.SCHEDULED
    else:
        reason = end_reason.format(dep=dep)
        assert (job.state, job.end_reason, job.pending_reason) == (
            JobState.CANCELLED,
            f"DEPENDENCY: {reason}",
            "",
        )
        event = job.events.last()
        assert (event.from_state, event.to_state, event.reason) == (
            JobState.PENDING,
            JobState.CANCELLED,
            reason,
        )


def test_afternotok_waits_for_every_job_and_is_cancelled_only_when_all_succeeded(
    api_for: Any, paused_loop: Any
) -> None:
    Node.objects.update(state="ready")
    profile = live_profile()
    alice = api_for("alice")
    first, second = post(alice, "shard-0").json()["id"], post(alice, "shard-1").json()["id"]
    cleanup = post(alice, "cleanup", after=[first, second], after_type="notok").json()["id"]
    run_cycle(profile)
    end(first, JobState.FAILED)
    run_cycle(profile)  # one failed, but the other still runs: a cleanup must not race it
    waiting = Job.objects.get(pk=cleanup)
    assert (waiting.state, waiting.pending_reason) == (JobState.PENDING, "dependency")
    assert waiting.pending_message == (
        f"Waiting for job {second} (scheduled) to end; job {first} failed, so it starts then."
    )
    end(second, JobState.SUCCEEDED)
    run_cycle(profile)
    assert Job.objects.get(pk=cleanup).state == JobState.SCHEDULED

    # All succeeded: the notok job is cancelled, an ok job behind it too and an any job behind
    # it starts, all in the same cycle.
    third, fourth = post(alice, "shard-2").json()["id"], post(alice, "shard-3").json()["id"]
    alert = post(alice, "alert", after=[third, fourth], after_type="notok").json()["id"]
    report = post(alice, "report", after=[alert]).json()["id"]
    tidy = post(alice, "tidy", after=[alert], after_type="any").json()["id"]
    run_cycle(profile)
    assert Job.objects.get(pk=tidy).pending_message == f"Waiting for job {alert} (pending) to end."
    end(third, JobState.SUCCEEDED)
    end(fourth, JobState.SUCCEEDED)
    run_cycle(profile)
    cancelled = Job.objects.get(pk=alert)
    assert (cancelled.state, cancelled.end_reason) == (
        JobState.CANCELLED,
        f"DEPENDENCY: jobs {third} and {fourth}, which it depends on, all succeeded {NOTOK_CANCELLED}",
    )
    behind = Job.objects.get(pk=report)
    assert behind.end_reason == f"DEPENDENCY: job {alert}, which it depends on, was cancelled"
    assert Job.objects.get(pk=tidy).state == JobState.SCHEDULED


def test_after_type_is_checked_at_submission_and_other_tenants_jobs_read_as_missing(
    api_for: Any, paused_loop: Any
) -> None:
    alice, carol = api_for("alice"), api_for("carol")
    theirs = carol.post(
        "/api/v1/jobs/",
        {"name": "theirs", "vc": "speech", "flavor": "s-V100", "command": "true"},
        format="json",
    ).json()["id"]
    failed, succeeded = post(alice, "broken").json()["id"], post(alice, "fine").json()["id"]
    Node.objects.update(state="ready")
    run_cycle()
    end(failed, JobState.FAILED)
    end(succeeded, JobState.SUCCEEDED)
    before = Job.objects.count()
    for spec, errors in [
        (
            {"after": [failed], "after_type": "sometimes"},
            {"after_type": ["'sometimes' is not a dependency type: give ok, any or notok."]},
        ),
        (
            {"after_type": "any"},
            {"after_type": ["No jobs to wait for: list them in after, or leave after_type out."]},
        ),
        ({"after": [theirs], "after_type": "any"}, {"after": [f"No job {theirs}."]}),
        ({"after": [theirs], "after_type": "notok"}, {"after": [f"No job {theirs}."]}),
        ({"after": [999_999], "after_type": "notok"}, {"after": ["No job 999999."]}),
        (
            {"after": [succeeded], "after_type": "notok"},
            {"after": [f"Job {succeeded} succeeded, so this job (after_type notok) could never start."]},
        ),
        (
            {"after": [failed], "after_type": "ok"},
            {"after": [f"Job {failed} failed, so this job could never start."]},
        ),
    ]:
        refused = post(alice, "waits", **spec)
        assert refused.status_code == 400 and refused.json() == errors, (spec, refused.json())
    assert Job.objects.count() == before

    # What could still start is taken: afterany whatever its jobs did, afternotok after a failure.
    for spec in [
        {"after": [failed, succeeded], "after_type": "any"},
        {"after": [failed, succeeded], "after_type": "notok"},
    ]:
        made = post(alice, "waits", **spec)
        assert made.status_code == 201, made.json()
        job = made.json()
        assert (job["after"], job["after_type"]) == (sorted([failed, succeeded]), spec["after_type"])


def test_a_bulk_submission_checks_each_after_type_on_its_own(api_for: Any, paused_loop: Any) -> None:
    alice = api_for("alice")
    failed = post(alice, "broken").json()["id"]
    Node.objects.update(state="ready")
    run_cycle()
    end(failed, JobState.FAILED)
    base = {"vc": "vision", "flavor": "s-A100", "command": "true", "after": [failed]}
    made = alice.post(
        "/api/v1/jobs/bulk/",
        {"jobs": [{**base, "name": "notify", "after_type": "notok"}, {**base, "name": "next"}]},
        format="json",
    )
    assert made.status_code == 400
    assert made.json() == {"jobs": {"1": {"after": [f"Job {failed} failed, so this job could never start."]}}}

"""`POST /api/v1/jobs/dry-run/`: a job spec tested as a submission would be, answered with what the
next scheduling cycle would do with it (start now, or why it would wait, until when, and what
would help), with nothing stored; a spec a submission refuses is refused alike."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from portal.accounts.models import AuditEntry
from portal.cluster.models import Node, VirtualCluster
from portal.jobs.models import Allocation, Job, JobAttempt, JobEvent
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import submit
from tests.portal.test_submit_job import BAD_SPECS, NEVER_FITS

URL = "/api/v1/jobs/dry-run/"
SMALL = {"name": "small", "vc": "vision", "flavor": "s-A100", "command": "sleep 600"}
LARGE = {**SMALL, "name": "large", "flavor": "l-A100"}
VERDICT_KEYS = {
    "would_start_now",
    "reason",
    "message",
    "estimated_start",
    "queue_position",
    "placement",
    "borrowed_gpus",
    "hints",
    "scheduling_paused",
}


SCHEDULING_FIELDS = ("state", "pending_reason", "pending_message", "estimated_start_at", "whatif_hints")


def written() -> dict[str, Any]:
    """Everything a submission or a cycle would write: rows, the job id sequence, and each job's
    state and scheduling fields (a cycle records every waiting job's reason and estimate)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_value, is_called FROM jobs_job_id_seq")
        sequence = cursor.fetchone()
    return {
        "counts": [model.objects.count() for model in (Job, JobEvent, JobAttempt, Allocation, AuditEntry)],
        "sequence": sequence,
        "jobs": list(Job.objects.order_by("pk").values_list("pk", "version", *SCHEDULING_FIELDS)),
    }


def dry_run(client: Any, spec: dict[str, Any]) -> dict[str, Any]:
    response = client.post(URL, spec, format="json")
    assert response.status_code == 200, response.content
    verdict = response.json()
    assert set(verdict) == VERDICT_KEYS, verdict
    return verdict


def moment(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text)


@pytest.mark.django_db(transaction=True)
def test_a_job_that_fits_would_start_now_and_nothing_is_written(api_for: Any, paused_loop: Any) -> None:
    Node.objects.update(state="ready")
    alice = api_for("alice")
    waiting = submit(api_for("bob"), "bobs", flavor="s-A100")  # a cycle would start it, and say so
    before = written()

    verdict = dry_run(alice, SMALL)

    assert verdict["would_start_now"] is True, verdict
    assert verdict["reason"] is None and verdict["queue_position"] is None and verdict["hints"] == []
    node, gpus = verdict["placement"].split(":")
    assert node.startswith("a100-node-") and len(gpus.split(",")) == 2, verdict
    assert verdict["message"] == f"Would start now on {verdict['placement']}."
    assert verdict["borrowed_gpus"] == 0
    assert verdict["scheduling_paused"] is True  # by this test, so that no cycle runs beside it
    assert abs(moment(verdict["estimated_start"]) - timezone.now()) < timedelta(minutes=1)
    assert written() == before
    assert Job.objects.get(pk=waiting).pending_reason == "new"

    # And so it does, when submitted.
    job = submit(alice, "small", flavor="s-A100")
    run_cycle()
    assert Job.objects.get(pk=job).state == "scheduled"


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_the_verdict_says_whether_scheduling_is_paused(api_for: Any, live_stack: Any) -> None:
    from scheduler.tasks import set_loop_paused

    alice = api_for("alice")
    assert dry_run(alice, SMALL)["scheduling_paused"] is False  # a live test's loop runs
    set_loop_paused(True)
    try:
        assert dry_run(alice, SMALL)["scheduling_paused"] is True
    finally:
        set_loop_paused(False)


@pytest.mark.django_db(transaction=True)
def test_a_job_over_quota_hears_what_the_cycle_would_tell_it(api_for: Any, paused_loop: Any) -> None:
    Node.objects.update(state="ready")
    alice = api_for("alice")
    # vision may hold 8 + 8 borrowed A100: two 8-GPU jobs take all of it.
    running = [submit(alice, "a"), submit(alice, "b")]
    run_cycle()
    assert {Job.objects.get(pk=pk).state for pk in running} == {"scheduled"}
    before = written()

    verdict = dry_run(alice, LARGE)

    assert verdict["would_start_now"] is False and verdict["placement"] is None
    assert verdict["reason"] == "vc-quota"
    assert (
        verdict["message"]
        == "VC vision: 16 A100 in use, 8 guaranteed and 8 borrowed, borrow limit 8; job needs 8"
    )
    assert verdict["queue_position"] == 1
    # It waits for a running job's time limit (l-A100: 336 h) at the latest.
    estimate = moment(verdict["estimated_start"])
    assert timezone.now() < estimate < timezone.now() + timedelta(hours=337)
    other_model = {hint["kind"]: hint for hint in verdict["hints"]}["gpu-model"]
    assert other_model["flavor"] == "l-V100" and other_model["starts_now"] is True
    assert written() == before

    # The job, submitted, hears the same from the next cycle.
    job_id = submit(alice, "c")
    run_cycle()
    job = alice.get(f"/api/v1/jobs/{job_id}/").json()
    assert (job["pending_reason"], job["pending_message"]) == (verdict["reason"], verdict["message"])
    assert job["queue_position"] == verdict["queue_position"]
    assert abs(moment(job["estimated_start_at"]) - estimate) < timedelta(minutes=1)
    shape = ("kind", "replicas", "gpus_per_replica", "gpu_model", "flavor", "starts_now")
    stored = [[hint[key] for key in shape] for hint in job["whatif_hints"]]
    assert stored == [[hint[key] for key in shape] for hint in verdict["hints"]]


@pytest.mark.django_db(transaction=True)
def test_another_tenants_jobs_are_not_revealed_nor_touched(api_for: Any, paused_loop: Any) -> None:
    Node.objects.update(state="ready")
    carol = api_for("carol")
    # speech takes every A100 (8 guaranteed + 8 borrowed, of vision's guarantee).
    theirs = [submit(carol, "carols-a", vc="speech"), submit(carol, "carols-b", vc="speech")]
    run_cycle()
    assert {Job.objects.get(pk=pk).state for pk in theirs} == {"scheduled"}
    before = written()

    verdict = dry_run(api_for("alice"), LARGE)

    assert verdict["would_start_now"] is False, verdict
    text = json.dumps(verdict)
    for secret in ("speech", "carol", *(f"job {pk}" for pk in theirs)):
        assert secret not in text, (secret, verdict)
    # Whatever the core would do to carol's jobs for it (a reclaim), nothing is done.
    assert written() == before


@pytest.mark.django_db(transaction=True)
def test_a_job_after_an_unfinished_job_would_wait_for_it(api_for: Any, paused_loop: Any) -> None:
    alice = api_for("alice")
    first = submit(alice, "first", flavor="s-A100")
    verdict = dry_run(alice, {**SMALL, "after": [first]})
    assert verdict["would_start_now"] is False
    assert verdict["reason"] == "dependency"
    assert verdict["message"] == f"Waiting for job {first} (pending) to succeed."
    assert verdict["estimated_start"] is None and verdict["hints"] == []


REFUSED = [
    *[(change, field) for change, field in BAD_SPECS],
    *[(change, field) for change, field, _ in NEVER_FITS],
]


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "field"), REFUSED, ids=[f"{f}-{i}" for i, (_, f) in enumerate(REFUSED)])
def test_a_spec_a_submission_refuses_gets_the_same_400(api_for: Any, change: Any, field: str) -> None:
    spec = {**SMALL, **change}
    if "resources" in change:
        spec.pop("flavor")
    spec = {key: value for key, value in spec.items() if value is not None}
    alice = api_for("alice")
    before = written()
    dry = alice.post(URL, spec, format="json")
    assert written() == before
    submitted = alice.post("/api/v1/jobs/", spec, format="json")
    assert dry.status_code == submitted.status_code == 400
    assert dry.json() == submitted.json() and field in dry.json()
    assert Job.objects.count() == 0  # after a dry run the connection writes again (a real submit may)


@pytest.mark.django_db
def test_past_the_pending_limit_and_as_a_viewer_it_is_refused_like_a_submission(api_for: Any) -> None:
    VirtualCluster.objects.filter(name="vision").update(max_pending_jobs_per_user=1)
    alice = api_for("alice")
    submit(alice, "one", flavor="s-A100")
    dry, submitted = alice.post(URL, SMALL, format="json"), alice.post("/api/v1/jobs/", SMALL, format="json")
    assert (dry.status_code, dry.json()) == (submitted.status_code, submitted.json())
    assert "allows 1 per user" in dry.json()["vc"][0]

    victor = api_for("victor")
    audited = AuditEntry.objects.count()
    dry = victor.post(URL, SMALL, format="json")
    # A refused dry run is a refused read: no audit entry, unlike a refused submission.
    assert AuditEntry.objects.count() == audited
    submitted = victor.post("/api/v1/jobs/", SMALL, format="json")
    assert (dry.status_code, dry.json()) == (submitted.status_code, submitted.json())
    assert dry.status_code == 403
    assert AuditEntry.objects.filter(action__endswith=".denied").count() == 1


@pytest.mark.django_db
def test_dry_runs_are_throttled_on_their_own(api_for: Any, monkeypatch: Any) -> None:
    from tests.portal.test_security_headers import low_rate

    low_rate(monkeypatch, "dry-run", "2/min")
    alice = api_for("alice")
    assert [alice.post(URL, SMALL, format="json").status_code for _ in range(3)] == [200, 200, 429]
    assert api_for("bob").post(URL, SMALL, format="json").status_code == 200
    assert alice.post("/api/v1/jobs/", SMALL, format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_queue_places_count_only_the_jobs_of_ones_own_tenant(api_for: Any, paused_loop: Any) -> None:
    """With every node down, three speech jobs wait ahead of a vision one: vision learns its
    place among its own tenant's jobs, never how many other tenants have waiting."""
    carol, alice = api_for("carol"), api_for("alice")
    speech = {"vc": "speech", "flavor": "s-V100"}
    theirs = [submit(carol, f"speech-{i}", **speech) for i in range(3)]
    ours = submit(alice, "vision-0")
    run_cycle()
    assert [Job.objects.get(pk=pk).queue_position for pk in theirs] == [1, 2, 3]
    assert api_for("bob").get(f"/api/v1/jobs/{ours}/").json()["queue_position"] == 1
    assert dry_run(alice, SMALL)["queue_position"] == 2
    assert dry_run(carol, {**SMALL, **speech})["queue_position"] == 4

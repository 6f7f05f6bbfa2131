"""POST /api/v1/jobs/bulk/: job arrays, all or nothing, with the rules of a single submission."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.jobs.models import Job, JobEvent

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/bulk/"


def cycle_requests(callbacks: list[Any]) -> int:
    from scheduler.tasks import request_cycle

    return sum(callback is request_cycle for callback in callbacks)


def nothing_stored() -> bool:
    return not Job.objects.exists() and not JobEvent.objects.exists() and not AuditEntry.objects.exists()


def test_a_list_of_specs_is_queued_in_order_with_events_one_audit_entry_and_one_cycle_request(
    api_for, small_job, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    specs = [
        {**small_job, "name": "a"},
        {**small_job, "name": "b", "flavor": "s-V100", "priority": "dev"},
        {**small_job, "name": "c", "replicas": 2},
    ]
    with django_capture_on_commit_callbacks() as callbacks:
        response = api_for("alice").post(URL, {"jobs": specs}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["count"] == 3
    jobs = [Job.objects.get(pk=pk) for pk in body["ids"]]
    assert [j.name for j in jobs] == ["a", "b", "c"]
    assert [(j.gpu_model, j.replicas, j.priority_class.name) for j in jobs] == [
        ("A100", 1, "training"),
        ("V100", 1, "dev"),
        ("A100", 2, "training"),
    ]
    assert all(j.state == "pending" and j.owner.username == "alice" for j in jobs)
    for job in jobs:
        assert list(job.events.values_list("from_state", "to_state", "actor_label")) == [
            ("", "pending", "alice")
        ]
    audit = AuditEntry.objects.get()
    assert audit.action == "job.submit_bulk" and audit.tenant.name == "vision"
    assert all(str(pk) in audit.detail for pk in body["ids"])
    assert cycle_requests(callbacks) == 1


def test_an_array_queues_numbered_copies_with_their_index(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    response = api_for("bob").post(URL, {"job": small_job, "array": 5}, format="json")
    assert response.status_code == 201, response.json()
    jobs = Job.objects.filter(pk__in=response.json()["ids"]).order_by("id")
    assert [j.name for j in jobs] == [f"train-resnet-{i}" for i in range(5)]
    assert [j.spec["env"]["ARRAY_INDEX"] for j in jobs] == ["0", "1", "2", "3", "4"]
    assert {j.spec["command"][-1] for j in jobs} == {"python train.py"}


def test_a_bad_item_is_named_with_its_field_and_nothing_is_stored(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    specs = [small_job, {**small_job, "vc": "nope"}, small_job, {**small_job, "replicas": 0}]
    response = api_for("alice").post(URL, {"jobs": specs}, format="json")
    assert response.status_code == 400
    errors = response.json()["jobs"]
    assert set(errors) == {"1", "3"}
    assert "nope" in errors["1"]["vc"][0]
    assert errors["3"]["replicas"]
    assert nothing_stored()


def test_an_item_that_could_never_fit_is_named_and_nothing_is_stored(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    # vision may hold at most 16 A100; the third item asks for 24.
    specs = [small_job, small_job, {**small_job, "flavor": "l-A100", "replicas": 3}]
    response = api_for("alice").post(URL, {"jobs": specs}, format="json")
    assert response.status_code == 400
    assert list(response.json()["jobs"]) == ["2"]
    assert "may hold at most 16" in response.json()["jobs"]["2"]["replicas"][0]
    assert nothing_stored()


def test_an_array_of_a_bad_spec_names_the_spec(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    too_wide = {"gpus": 16, "gpu_model": "A100", "cpu": 8, "memory_gb": 8}
    spec = {key: value for key, value in small_job.items() if key != "flavor"}
    response = alice.post(URL, {"job": {**spec, "resources": too_wide}, "array": 3}, format="json")
    assert response.status_code == 400
    assert "largest node has 8" in response.json()["job"]["resources"][0]
    response = alice.post(URL, {"job": {**small_job, "env": {"ARRAY_INDEX": "7"}}, "array": 3}, format="json")
    assert response.status_code == 400 and response.json()["job"]["env"]
    assert nothing_stored()


def test_viewers_may_not_submit_arrays(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    response = api_for("victor").post(URL, {"jobs": [small_job, small_job]}, format="json")
    assert response.status_code == 403
    assert not Job.objects.exists() and not JobEvent.objects.exists()
    # The refusal itself is audited (S2), and nothing else is.
    assert list(AuditEntry.objects.values_list("action", "actor__username")) == [
        ("job.bulk.denied", "victor")
    ]


def test_another_tenants_vc_reads_as_one_that_does_not_exist(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    carol = api_for("carol")
    speech = {**small_job, "vc": "speech", "flavor": "s-V100"}
    foreign = carol.post(URL, {"jobs": [speech, small_job]}, format="json")
    missing = carol.post(URL, {"jobs": [speech, {**small_job, "vc": "nope"}]}, format="json")
    assert foreign.status_code == missing.status_code == 400
    assert list(foreign.json()["jobs"]) == ["1"]
    words = foreign.json()["jobs"]["1"]["vc"][0].replace("'vision'", "X")
    assert words == missing.json()["jobs"]["1"]["vc"][0].replace("'nope'", "X")
    assert nothing_stored()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "jobs"),
        ({"jobs": []}, "jobs"),
        ({"jobs": ["not a spec"]}, "jobs"),
        ({"jobs": "x"}, "jobs"),
        ({"job": {"name": "x"}}, "jobs"),  # no array size
        ({"array": 3}, "jobs"),
        ({"job": {"name": "x"}, "array": 0}, "array"),
        ({"job": {"name": "x"}, "array": 1001}, "array"),
        ({"jobs": [{}], "job": {}, "array": 2}, "jobs"),
    ],
)
def test_a_malformed_request_is_a_field_level_400(api_for, body, field) -> None:  # type: ignore[no-untyped-def]
    response = api_for("alice").post(URL, body, format="json")
    assert response.status_code == 400
    assert response.json()[field], response.json()
    assert nothing_stored()


def test_more_than_a_thousand_jobs_are_refused(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    response = api_for("alice").post(URL, {"jobs": [small_job] * 1001}, format="json")
    assert response.status_code == 400 and response.json()["jobs"]
    assert nothing_stored()


def test_bulk_and_single_submissions_share_the_submit_throttle(api_for, small_job, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from portal.lib.throttling import WriteThrottle

    monkeypatch.setattr(WriteThrottle, "THROTTLE_RATES", {**WriteThrottle.THROTTLE_RATES, "submit": "2/min"})
    alice = api_for("alice")
    assert alice.post("/api/v1/jobs/", small_job, format="json").status_code == 201
    assert alice.post(URL, {"job": small_job, "array": 2}, format="json").status_code == 201
    assert alice.post(URL, {"job": small_job, "array": 2}, format="json").status_code == 429
    assert Job.objects.count() == 3


def test_an_array_leaves_room_in_the_name_for_the_index(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    spec = {**small_job, "name": "n" * 97}
    response = api_for("alice").post(URL, {"job": spec, "array": 1000}, format="json")
    assert response.status_code == 400
    assert "at most 96 characters" in response.json()["job"]["name"][0]
    assert nothing_stored()

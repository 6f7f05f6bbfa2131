from __future__ import annotations

import pytest
import yaml

from portal.accounts.models import AuditEntry
from portal.jobs.models import Job, JobEvent

pytestmark = pytest.mark.django_db


def test_it_queues_a_valid_job_as_pending_with_a_reason(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    response = api_for("alice").post("/api/v1/jobs/", small_job, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "pending"
    assert body["pending_reason"] == "new"
    assert body["pending_message"]
    assert body["gpu_model"] == "A100" and body["gpus_per_replica"] == 2 and body["total_gpus"] == 2
    assert body["time_limit_s"] == 72 * 3600
    assert body["priority_class"] == "training"
    assert body["spec"]["command"] == ["sh", "-c", "python train.py"]
    job = Job.objects.get(pk=body["id"])
    assert job.tenant.name == "vision" and job.owner.username == "alice"
    assert list(job.events.values_list("to_state", flat=True)) == ["pending"]
    entry = AuditEntry.objects.get(action="job.submit")
    assert (entry.object_id, entry.object_repr) == (str(job.pk), str(job))


def test_it_accepts_yaml(api_for) -> None:  # type: ignore[no-untyped-def]
    spec = {
        "name": "yaml-job",
        "vc": "vision",
        "resources": {"gpus": 4, "gpu_model": "V100", "cpu": 16, "memory_gb": 64},
        "command": ["python", "train.py", "--epochs", "3"],
        "env": {"WANDB_MODE": "offline"},
        "replicas": 2,
        "priority": "dev",
        "retries": {"limit": 2, "permanent_exit_codes": [2]},
        "checkpoint": {"enabled": True, "grace_seconds": 60},
        "time_limit": "1d12h",
    }
    response = api_for("bob").post("/api/v1/jobs/", yaml.safe_dump(spec), content_type="application/yaml")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["replicas"], body["gpus_per_replica"], body["priority"]) == (2, 4, 100)
    assert body["time_limit_s"] == 36 * 3600
    assert body["retries_left"] == 2
    assert body["spec"]["checkpoint"] == {"enabled": True, "signal": "SIGUSR1", "grace_seconds": 60}


BAD_SPECS = [
    ({"name": ""}, "name"),
    ({"name": "bad name!"}, "name"),
    ({"vc": "speech"}, "vc"),  # another tenant's VC reads as nonexistent
    ({"vc": "no-such-vc"}, "vc"),
    ({"flavor": "xl-H100"}, "flavor"),
    ({"command": []}, "command"),
    ({"command": 42}, "command"),
    ({"replicas": 0}, "replicas"),
    ({"replicas": 1000}, "replicas"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
    ({"env": {"LD_PRELOAD": "/x.so"}}, "env"),
    ({"env": {"1BAD": "x"}}, "env"),
    ({"priority": "urgent"}, "priority"),
    ({"time_limit": "forever"}, "time_limit"),
    ({"time_limit": "100h"}, "time_limit"),  # s-A100 allows 72 h
    ({"mounts": [{"name": "datasets", "path": "/data"}]}, "mounts"),  # not allowed for the VC
    ({"mounts": [{"name": "datasets", "path": "relative"}]}, "mounts"),
    ({"retries": {"limit": 50}}, "retries"),
    ({"checkpoint": {"signal": "SIGKILL"}}, "checkpoint"),
    ({"flavor": None, "resources": {"gpus": 0, "gpu_model": "A100", "cpu": 1, "memory_gb": 1}}, "resources"),
]


@pytest.mark.parametrize(
    ("change", "field"), BAD_SPECS, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_SPECS)]
)
def test_a_bad_field_gets_a_field_level_400_and_nothing_is_stored(api_for, small_job, change, field) -> None:  # type: ignore[no-untyped-def]
    spec = {**small_job, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    response = api_for("alice").post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert response.json()[field]  # a message, not an empty list
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0


def test_a_time_limit_above_the_flavor_s_is_refused_in_durations(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """It said "360000 s is more than flavor s-A100 allows (72 h)" of a limit given as 100h."""
    response = api_for("alice").post("/api/v1/jobs/", {**small_job, "time_limit": "100h"}, format="json")
    assert response.json() == {"time_limit": ["A time limit of 4d4h is more than flavor s-A100 allows (3d)."]}


def test_an_empty_time_limit_says_what_to_give(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """YAML reads `time_limit:` with nothing after it as null, refused as "may not be null"."""
    response = api_for("alice").post("/api/v1/jobs/", {**small_job, "time_limit": None}, format="json")
    assert response.json() == {
        "time_limit": ["Give a duration such as 3600, '90m', '36h' or '2d', or leave the field out."]
    }


def test_an_unknown_field_is_refused_with_every_other_bad_field_at_once(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """An unknown field was refused alone, and the other bad fields came out only once the user
    had fixed it and submitted again; a submission, a dry run and a job array all answer with
    every field error in one 400, and store nothing."""
    alice = api_for("alice")
    spec = {**small_job, "bogus": 1, "replicas": -1, "flavor": "xl-H100"}
    submitted = alice.post("/api/v1/jobs/", spec, format="json")
    assert submitted.status_code == 400, submitted.content
    errors = submitted.json()
    assert set(errors) == {"bogus", "replicas", "flavor"}, errors
    assert errors["bogus"] == ["Unknown field."]
    assert errors["replicas"] == ["Ensure this value is greater than or equal to 1."]
    assert errors["flavor"][0].startswith("No flavor named 'xl-H100'.")
    dry_run = alice.post("/api/v1/jobs/dry-run/", spec, format="json")
    assert (dry_run.status_code, dry_run.json()) == (400, errors)
    array = alice.post("/api/v1/jobs/bulk/", {"job": spec, "array": 2}, format="json")
    assert (array.status_code, array.json()) == (400, {"job": errors})

    # In a part of the spec too, and an unknown field given a YAML date is still unknown.
    nested = (
        "name: train\nvc: vision\ncommand: echo\nreplicas: 0\ncreated: 2026-01-01\n"
        "resources: {gpus: 0, gpu_model: A100, cpu: 1, memory_gb: 1, devices: [/dev/mem]}\n"
    )
    response = alice.post("/api/v1/jobs/", nested, content_type="application/yaml")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert set(errors) == {"replicas", "created", "resources"}, errors
    assert errors["created"] == ["Unknown field."]
    assert set(errors["resources"]) == {"gpus", "devices"}
    assert errors["resources"]["devices"] == ["Unknown field."]
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0
    assert not AuditEntry.objects.filter(action__startswith="job.submit").exists()

    # Only the unknown field wrong: refused all the same, and nothing of the spec is used.
    only_unknown = alice.post("/api/v1/jobs/", {**small_job, "bogus": 1}, format="json")
    assert (only_unknown.status_code, only_unknown.json()) == (400, {"bogus": ["Unknown field."]})
    assert Job.objects.count() == 0


def test_env_values_that_yaml_reads_as_something_else_are_refused_by_name(api_for) -> None:  # type: ignore[no-untyped-def]
    """Unquoted, YAML reads 4.40 as 4.4, 0022 as 18 and 12:30 as 750: turned back into text the job
    would get values nobody wrote, so they are refused, each naming its variable and the fix."""
    spec = (
        "name: envtest\nvc: vision\nflavor: s-A100\ncommand: env\n"
        "env:\n  TRANSFORMERS_VERSION: 4.40\n  UMASK: 0022\n  START: 12:30\n  RUN_DATE: 2026-01-01\n"
        "  QUOTED: '4.40'\n"
        "secret_env:\n  PIN: 1234\n"
    )
    response = api_for("alice").post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert set(errors) == {"env", "secret_env"}
    assert set(errors["env"]) == {"TRANSFORMERS_VERSION", "UMASK", "START", "RUN_DATE"}
    [version] = errors["env"]["TRANSFORMERS_VERSION"]
    assert version.startswith("TRANSFORMERS_VERSION must be text, not the number 4.4")
    assert "in YAML put the value in quotes" in version
    assert errors["env"]["RUN_DATE"][0].startswith("RUN_DATE must be text, not the date 2026-01-01")
    assert "1234" not in errors["secret_env"]["PIN"][0]  # a secret's value is never repeated
    assert Job.objects.count() == 0

    # A JSON number is refused in the same words; quoted text goes through as written.
    as_json = api_for("alice").post(
        "/api/v1/jobs/",
        {"name": "envtest", "vc": "vision", "flavor": "s-A100", "command": "env", "env": {"EPOCHS": 3}},
        format="json",
    )
    assert as_json.status_code == 400
    assert as_json.json()["env"]["EPOCHS"][0].startswith("EPOCHS must be text, not the number 3")
    quoted = spec.replace("4.40\n", "'4.40'\n", 1).replace("0022", "'0022'").replace("12:30", "'12:30'")
    quoted = quoted.replace("2026-01-01", "'2026-01-01'").replace("PIN: 1234", "PIN: '1234'")
    accepted = api_for("alice").post("/api/v1/jobs/", quoted, content_type="application/yaml")
    assert accepted.status_code == 201, accepted.content
    assert Job.objects.get().spec["env"] == {
        "TRANSFORMERS_VERSION": "4.40",
        "UMASK": "0022",
        "START": "12:30",
        "RUN_DATE": "2026-01-01",
        "QUOTED": "4.40",
    }


def test_yaml_dates_are_refused_by_field_name(api_for) -> None:  # type: ignore[no-untyped-def]
    """No field of a job spec takes a date, and only YAML makes one (of an unquoted 2026-01-01):
    the error names the field and says what YAML did, in the spec and in its parts."""
    spec = (
        "name: 2026-01-01\nvc: vision\ncommand: env\n"
        "resources: {gpus: 1, gpu_model: 2026-01-01, cpu: 1, memory_gb: 1}\n"
    )
    response = api_for("alice").post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert set(errors) == {"name", "resources"}
    assert errors["name"] == [
        "name cannot be a date: YAML reads an unquoted 2026-01-01 as one; put the value in quotes."
    ]
    assert errors["resources"]["gpu_model"][0].startswith("gpu_model cannot be a date")
    assert Job.objects.count() == 0


def test_a_command_argument_that_is_not_text_is_named(api_for) -> None:  # type: ignore[no-untyped-def]
    spec = "name: cmd\nvc: vision\nflavor: s-A100\ncommand: [python, train.py, --epochs, 3]\n"
    response = api_for("alice").post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 400, response.content
    [message] = response.json()["command"]
    assert message.startswith("Argument 4 of the command must be text, not the number 3")
    assert "in YAML put the value in quotes" in message
    quoted = api_for("alice").post(
        "/api/v1/jobs/", spec.replace(" 3]", " '3']"), content_type="application/yaml"
    )
    assert quoted.status_code == 201, quoted.content
    assert Job.objects.get().spec["command"] == ["python", "train.py", "--epochs", "3"]


def test_every_reserved_or_malformed_variable_is_refused_under_its_own_name(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """As any other variable's error (env.RUN_DATE): all of them at once, each by name."""
    env = {"LD_PRELOAD": "x", "CUDA_VISIBLE_DEVICES": "0", "OK": "1", "1BAD": "x", "EPOCHS": 3}
    response = api_for("alice").post(
        "/api/v1/jobs/", {**small_job, "env": env, "secret_env": {"NVIDIA_X": "s"}}, format="json"
    )
    assert response.status_code == 400
    errors = response.json()
    assert errors["env"].pop("EPOCHS")[0].startswith("EPOCHS must be text, not the number 3")
    assert errors == {
        "env": {
            "LD_PRELOAD": ["LD_PRELOAD is reserved: the agent sets it."],
            "CUDA_VISIBLE_DEVICES": ["CUDA_VISIBLE_DEVICES is reserved: the agent sets it."],
            "1BAD": ["'1BAD' is not a valid variable name."],
        },
        "secret_env": {"NVIDIA_X": ["NVIDIA_X is reserved: the agent sets it."]},
    }
    assert Job.objects.count() == 0


def test_env_names_yaml_reads_as_other_values_are_refused(api_for) -> None:  # type: ignore[no-untyped-def]
    """Unquoted, YAML reads the names ON, YES and NULL as true and null: the job got variables
    named True and None. Refused, with the fix."""
    spec = "name: envtest\nvc: vision\nflavor: s-A100\ncommand: env\nenv:\n  ON: '1'\n  NULL: x\n"
    response = api_for("alice").post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 400, response.content
    errors = response.json()["env"]
    assert set(errors) == {"True", "None"}
    assert errors["True"][0].startswith("A variable name must be text, but YAML read this one as true")
    assert "put the name in quotes" in errors["None"][0]
    quoted = spec.replace("ON:", "'ON':").replace("NULL:", "'NULL':")
    accepted = api_for("alice").post("/api/v1/jobs/", quoted, content_type="application/yaml")
    assert accepted.status_code == 201, accepted.content
    assert Job.objects.get().spec["env"] == {"ON": "1", "NULL": "x"}


def test_flavor_and_resources_together_are_rejected(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    spec = {**small_job, "resources": {"gpus": 1, "gpu_model": "A100", "cpu": 1, "memory_gb": 1}}
    response = api_for("alice").post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400 and "resources" in response.json()


def test_malformed_yaml_is_a_400(api_for) -> None:  # type: ignore[no-untyped-def]
    response = api_for("alice").post("/api/v1/jobs/", "name: [unclosed", content_type="application/yaml")
    assert response.status_code == 400
    assert "YAML" in response.json()["detail"]


NEVER_FITS = [
    # vision may hold at most 8 + 8 A100
    ({"flavor": "l-A100", "replicas": 3}, "replicas", "may hold at most 16"),
    # no node has 16 A100
    (
        {"resources": {"gpus": 16, "gpu_model": "A100", "cpu": 8, "memory_gb": 8}},
        "resources",
        "largest node has 8",
    ),
    # 2 A100 nodes hold at most 2 replicas of 8
    (
        {"resources": {"gpus": 8, "gpu_model": "A100", "cpu": 8, "memory_gb": 8}, "replicas": 3},
        "replicas",
        "may hold",
    ),
    ({"resources": {"gpus": 1, "gpu_model": "H100", "cpu": 8, "memory_gb": 8}}, "vc", "no quota for H100"),
    (
        {"resources": {"gpus": 1, "gpu_model": "A100", "cpu": 500, "memory_gb": 8}},
        "resources",
        "largest node has 256",
    ),
]


@pytest.mark.parametrize(("change", "field", "words"), NEVER_FITS, ids=[w for _, _, w in NEVER_FITS])
def test_a_job_that_can_never_fit_is_rejected_with_why(api_for, small_job, change, field, words) -> None:  # type: ignore[no-untyped-def]
    spec = {**small_job, **change}
    if "resources" in change:
        spec.pop("flavor")
    response = api_for("alice").post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400, response.json()
    assert words in " ".join(response.json()[field])
    assert Job.objects.count() == 0


def test_a_flavor_wider_than_every_node_is_refused(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """An admin may define a flavor before the nodes that can run it exist."""
    from portal.cluster.models import Flavor

    Flavor.objects.create(name="x-A100", gpu_model="A100", gpus=16, cpu=8, memory_gb=8, max_runtime_hours=1)
    response = api_for("alice").post("/api/v1/jobs/", {**small_job, "flavor": "x-A100"}, format="json")
    assert response.status_code == 400, response.json()
    assert "largest node has 8" in " ".join(response.json()["resources"])
    assert Job.objects.count() == 0


def test_a_gang_that_the_cluster_cannot_hold_names_the_shape(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    from portal.cluster.models import Quota

    Quota.objects.filter(virtual_cluster__name="vision", gpu_model="A100").update(
        guaranteed=16, borrow_limit=16
    )
    spec = {**small_job, "flavor": "l-A100", "replicas": 3}
    response = api_for("alice").post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400
    assert response.json()["replicas"] == [
        "The gang needs 3 replicas of 8 A100; the cluster's nodes can hold at most 2 such replicas."
    ]


def test_viewers_cannot_submit(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    response = api_for("victor").post("/api/v1/jobs/", small_job, format="json")
    assert response.status_code == 403
    assert Job.objects.count() == 0


def test_list_filters_and_pagination(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    alice, bob = api_for("alice"), api_for("bob")
    for i in range(3):
        assert alice.post("/api/v1/jobs/", {**small_job, "name": f"a{i}"}, format="json").status_code == 201
    assert bob.post("/api/v1/jobs/", {**small_job, "name": "b0"}, format="json").status_code == 201
    mine = alice.get("/api/v1/jobs/?owner=me").json()
    assert mine["count"] == 3
    everyone = alice.get("/api/v1/jobs/?limit=2").json()
    assert everyone["count"] == 4 and len(everyone["results"]) == 2 and everyone["next"]
    assert alice.get("/api/v1/jobs/?owner=bob").json()["count"] == 1
    assert alice.get("/api/v1/jobs/?q=a1").json()["results"][0]["name"] == "a1"
    assert alice.get("/api/v1/jobs/?state=running").json()["count"] == 0
    assert alice.get("/api/v1/jobs/?state=pending&vc=vision").json()["count"] == 4
    assert alice.get("/api/v1/jobs/?state=bogus").status_code == 400


@pytest.mark.parametrize("text", ["²", "1" * 30, str(2**63), "9" * 5000])
def test_a_search_for_any_digits_answers(api_for, small_job, text) -> None:  # type: ignore[no-untyped-def]
    """Digits int() refuses ("²" is a digit to str.isdigit) and numbers past a bigint were a 500."""
    alice = api_for("alice")
    assert alice.post("/api/v1/jobs/", small_job, format="json").status_code == 201
    response = alice.get("/api/v1/jobs/", {"q": text})
    assert response.status_code == 200 and response.json()["count"] == 0


@pytest.mark.parametrize("ordering", ["priority", "queue_position"])
def test_pages_of_a_tied_ordering_list_every_job_once(api_for, ordering) -> None:  # type: ignore[no-untyped-def]
    """300 jobs of one priority, none placed yet: without a unique last key PostgreSQL ordered
    the ties differently on each page, so some jobs were listed twice and others never. Ties go
    newest first, as the list does without an ordering."""
    alice = api_for("alice")
    job = {"name": "arr", "vc": "vision", "flavor": "s-A100", "command": "true"}
    assert alice.post("/api/v1/jobs/bulk/", {"job": job, "array": 300}, format="json").status_code == 201
    seen: list[int] = []
    for offset in range(0, 300, 20):
        page = alice.get("/api/v1/jobs/", {"ordering": ordering, "limit": 20, "offset": offset}).json()
        seen += [j["id"] for j in page["results"]]
    assert seen == sorted(Job.objects.values_list("id", flat=True), reverse=True)


ORDERINGS = "queue_position, -queue_position, submitted_at, -submitted_at, priority, -priority, id, -id"


@pytest.mark.parametrize(
    ("ordering", "unknown"),
    [("nope", "nope"), ("-priority,nope", "nope"), ("name", "name"), ("owner__password", "owner__password")],
)
def test_an_ordering_the_list_does_not_offer_is_refused(api_for, small_job, ordering, unknown) -> None:  # type: ignore[no-untyped-def]
    """As a bad `limit` or `state`: ignored, it answered in another order than asked. The
    answer lists the choices, the same to everyone: it says nothing of the jobs."""
    assert api_for("alice").post("/api/v1/jobs/", small_job, format="json").status_code == 201
    expected = {
        "ordering": [f"Unknown field {unknown!r}: order by one or more of {ORDERINGS}, separated by commas."]
    }
    for user in ("alice", "carol"):
        response = api_for(user).get("/api/v1/jobs/", {"ordering": ordering})
        assert (response.status_code, response.json()) == (400, expected), user
    for offered in ("-priority", "id", "priority, -submitted_at", ""):
        assert api_for("alice").get("/api/v1/jobs/", {"ordering": offered}).status_code == 200, offered


def test_a_jobs_own_lists_and_actions_take_none_of_the_job_lists_parameters(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """Its events, output and telemetry are lists of their own (the schema offered them the job
    list's filters and ordering, which then looked for the job among the jobs filtered)."""
    alice = api_for("alice")
    job_id = alice.post("/api/v1/jobs/", small_job, format="json").json()["id"]
    for path in ("", "events/", "logs/", "telemetry/"):
        response = alice.get(f"/api/v1/jobs/{job_id}/{path}", {"ordering": "nope"})
        assert response.status_code == 200, (path, response.json())
    for path in ("events/", "logs/", "telemetry/"):
        response = alice.get(f"/api/v1/jobs/{job_id}/{path}", {"state": "running", "q": "other"})
        assert response.status_code == 200, (path, response.json())


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=abc", "limit"),
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("offset=-5", "offset"),
        ("offset=x", "offset"),
    ],
)
def test_a_bad_page_is_refused_by_name(api_for, small_job, query, field) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    alice.post("/api/v1/jobs/", small_job, format="json")
    response = alice.get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400, response.content
    assert response.json()[field], response.json()


def test_output_of_an_attempt_the_job_does_not_have_is_refused_by_name(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    from portal.jobs.models import JobAttempt, LogLine

    alice = api_for("alice")
    job_id = alice.post("/api/v1/jobs/", small_job, format="json").json()["id"]
    for path in ("logs", "telemetry"):
        response = alice.get(f"/api/v1/jobs/{job_id}/{path}/?attempt=1")
        assert response.status_code == 400
        assert response.json()["attempt"] == [f"Job {job_id} has no attempt 1; its attempts: none yet."]
    attempt = JobAttempt.objects.create(job_id=job_id, number=1)
    LogLine.objects.create(attempt=attempt, stream="stdout", seq=0, text="hello")
    assert [
        line["text"] for line in alice.get(f"/api/v1/jobs/{job_id}/logs/?attempt=1").json()["results"]
    ] == ["hello"]
    refused = alice.get(f"/api/v1/jobs/{job_id}/logs/?attempt=5")
    assert refused.json() == {"attempt": [f"Job {job_id} has no attempt 5; its attempts: 1."]}
    stream = alice.get(f"/api/v1/jobs/{job_id}/logs/?stream=stdin")
    assert stream.status_code == 400 and "stdout or stderr" in stream.json()["stream"][0]
    assert alice.get(f"/api/v1/jobs/{job_id}/logs/?stream=stderr").json()["count"] == 0


def test_one_page_holds_at_most_a_thousand_items(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    from portal.jobs.models import JobEvent

    alice = api_for("alice")
    job_id = alice.post("/api/v1/jobs/", small_job, format="json").json()["id"]
    JobEvent.objects.bulk_create(
        JobEvent(job_id=job_id, actor_label="portal", reason=f"note {i}") for i in range(1005)
    )
    page = alice.get(f"/api/v1/jobs/{job_id}/events/?limit=5000").json()
    assert page["count"] == 1006 and len(page["results"]) == 1000 and page["next"]
    rest = alice.get(page["next"]).json()
    assert len(rest["results"]) == 6 and rest["next"] is None
    assert len(alice.get(f"/api/v1/jobs/{job_id}/events/?limit=3&offset=1004").json()["results"]) == 2


def test_cancel_and_events(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    job_id = alice.post("/api/v1/jobs/", small_job, format="json").json()["id"]
    # bob (same tenant, member) may read but not cancel alice's job; the tenant admin may
    assert api_for("bob").post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 403
    response = alice.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert alice.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 409
    events = alice.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]
    assert [(e["from_state"], e["to_state"], e["actor_label"]) for e in events] == [
        ("", "pending", "alice"),
        ("pending", "cancelled", "alice"),
    ]
    other = alice.post("/api/v1/jobs/", small_job, format="json").json()["id"]
    assert api_for("vision-admin").post(f"/api/v1/jobs/{other}/cancel/").status_code == 200


def test_cancelling_a_running_job_frees_its_gpus(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    from django.db import transaction

    from portal.cluster.models import Gpu
    from portal.jobs.models import Allocation, JobAttempt
    from portal.jobs.services import transition_job

    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1)
    for gpu in Gpu.objects.filter(node__name="a100-node-1")[:2]:
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node)
    with transaction.atomic():
        transition_job(job, "scheduled", label="scheduler")
    assert api_for("alice").post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 200
    assert not Allocation.objects.filter(attempt__job=job, released_at__isnull=True).exists()
    attempt.refresh_from_db()
    assert attempt.state == "stopped" and attempt.ended_at is not None


def test_a_vcs_queue_lists_in_scheduler_order(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    ids = [
        api_for("alice").post("/api/v1/jobs/", {**small_job, "name": f"q{i}"}, format="json").json()["id"]
        for i in range(3)
    ]
    for position, job_id in zip([2, 3, 1], ids, strict=True):
        Job.objects.filter(pk=job_id).update(queue_position=position)
    queue = (
        api_for("bob").get("/api/v1/jobs/?vc=vision&state=pending&ordering=queue_position").json()["results"]
    )
    assert [j["id"] for j in queue] == [ids[2], ids[0], ids[1]]
    assert [j["queue_position"] for j in queue] == [1, 2, 3]


def test_job_detail_lists_its_checkpoints_newest_first(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    from portal.jobs.models import Checkpoint, JobAttempt

    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1)
    now = timezone.now()
    for step in (100, 200):
        Checkpoint.objects.create(
            job=job,
            attempt=attempt,
            path=f"step-{step}",
            size_bytes=step * 10,
            step=step,
            written_at=now + timedelta(seconds=step),
        )
    checkpoints = api_for("bob").get(f"/api/v1/jobs/{job.pk}/").json()["checkpoints"]
    assert [(c["step"], c["path"], c["attempt"]) for c in checkpoints] == [
        (200, "step-200", 1),
        (100, "step-100", 1),
    ]


def test_a_class_for_tenant_admins_is_refused_to_members_with_403(api_for, users) -> None:  # type: ignore[no-untyped-def]
    """reliability-security.md B6: a priority above the submitter's role is a 403, and nothing
    is stored; the tenant's admin and a cluster admin may use it, also in a job array."""
    body = {"name": "urgent", "vc": "vision", "flavor": "s-A100", "command": "true", "priority": "production"}
    refused = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 403
    assert "production is for admins of tenant vision" in refused.json()["detail"]
    bulk = api_for("alice").post(
        "/api/v1/jobs/bulk/", {"jobs": [{**body, "priority": "dev"}, body]}, format="json"
    )
    assert bulk.status_code == 403
    assert not Job.objects.exists()
    assert api_for("vision-admin").post("/api/v1/jobs/", body, format="json").status_code == 201
    assert api_for("admin").post("/api/v1/jobs/", body, format="json").status_code == 201
    classes = {c["name"]: c for c in api_for("alice").get("/api/v1/priority-classes/").json()["results"]}
    assert classes["production"]["tenant_admins_only"] and not classes["training"]["tenant_admins_only"]


def test_an_image_from_a_registry_outside_the_allowlist_is_a_400(api_for, settings) -> None:  # type: ignore[no-untyped-def]
    """reliability-security.md B3: the registry allowlist, checked at submission (and again by
    the agent, tests/agents/test_agent_config_and_versions.py)."""
    settings.ALLOWED_IMAGE_REGISTRIES = ["nvcr.io"]
    body = {"name": "x", "vc": "vision", "flavor": "s-A100", "command": "true", "image": "ubuntu:22.04"}
    refused = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["image"] == ["Registry docker.io is not allowed here (allowed: nvcr.io)."]
    assert not Job.objects.exists()
    allowed = {**body, "image": "nvcr.io/nvidia/pytorch:24.05-py3"}
    assert api_for("alice").post("/api/v1/jobs/", allowed, format="json").status_code == 201


def test_a_submission_takes_three_statements_and_answers_as_the_job_detail_does(  # type: ignore[no-untyped-def]
    api_for, small_job, django_assert_max_num_queries
) -> None:
    """What a submission costs is mostly its statements (docs/benchmarks.md): the spec's names
    in one, the rules (and the job's id) in one, then the job with its event and audit entry in
    one, with no transaction block around them. The answer reads nothing back."""
    alice = api_for("alice")
    with django_assert_max_num_queries(3):
        response = alice.post("/api/v1/jobs/", {**small_job, "priority": "dev"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json() == alice.get(f"/api/v1/jobs/{response.json()['id']}/").json()


@pytest.mark.django_db(transaction=True)
def test_a_submission_whose_audit_entry_cannot_be_written_stores_no_job_and_no_event(  # type: ignore[no-untyped-def]
    api_for, small_job, monkeypatch
) -> None:
    """The job, its first event and its audit entry are one statement in autocommit (no
    transaction block, and no test transaction around it here): when the last row fails, the
    first two are not left behind."""
    from django.db import DataError

    from portal.accounts.services import audit_entry
    from portal.jobs import services

    def too_long_action(*args, **kwargs):  # type: ignore[no-untyped-def]
        entry = audit_entry(*args, **kwargs)
        entry.action = "x" * 500
        return entry

    alice = api_for("alice")
    assert alice.post("/api/v1/jobs/", small_job, format="json").status_code == 201
    monkeypatch.setattr(services, "audit_entry", too_long_action)
    with pytest.raises(DataError):
        alice.post("/api/v1/jobs/", {**small_job, "name": "lost"}, format="json")
    assert list(Job.objects.values_list("name", flat=True)) == [small_job["name"]]
    assert JobEvent.objects.count() == 1
    assert not AuditEntry.objects.filter(action="job.submit", object_repr__contains="lost").exists()

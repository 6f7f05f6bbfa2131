"""Hostile and malformed job specs (reliability-security.md B1-B7): each gets a clear 4xx naming
the field, and nothing is stored. I1-I6 are checked after each test (conftest).

Covered elsewhere: field-level 400s for names, VCs, flavors, empty or mistyped commands,
replicas, reserved env names (LD_*, NVIDIA_*, CUDA_VISIBLE_DEVICES), mounts, retries, signals
and durations in tests/portal/test_submit_job.py (test_a_bad_field_gets_a_field_level_400_...);
jobs that can never fit and gangs larger than the cluster there too (B6); the agent's own checks
of images, environment and mounts in tests/agents/test_agent_config_and_versions.py; argv
without a shell in tests/agents/test_agent_process_runtime.py and the fixed container template in
tests/agents/test_agent_docker_runtime.py (B3, B4, B5, B7, S9 on the host side).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.jobs.models import Job, JobEvent

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


def assert_nothing_stored() -> None:
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0
    assert not AuditEntry.objects.filter(action="job.submit").exists()


def post_raw(client: Any, body: bytes, content_type: str = "application/json") -> Any:
    return client.generic("POST", JOBS, body, content_type=content_type)


def refused(response: Any, field: str | None = None) -> dict[str, Any]:
    """A 4xx with a JSON body that names `field` with a message."""
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    body = response.json()
    if field is not None:
        assert body.get(field), body
    return body


# B1: oversized specs.


def test_a_body_larger_than_the_upload_limit_is_refused(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({**small_job, "command": ["python", "-c", "x" * (20 * 1024 * 1024)]}).encode()
    response = post_raw(api_for("alice"), body)
    assert response.status_code == 413, response.content[:300]
    assert "too large" in response.json()["detail"]
    assert_nothing_stored()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"env": {f"VAR_{i}": "x" for i in range(100_000)}}, "env"),
        ({"command": "echo " + "x" * 1024 * 1024}, "command"),
        ({"command": ["echo", "x" * 1024 * 1024]}, "command"),
        ({"mounts": [{"name": f"v{i}", "path": f"/m/{i}"} for i in range(10_000)]}, "mounts"),
        ({"env": {"BIG": "x" * 1024 * 1024}}, "env"),
        ({"name": "n" * 4096}, "name"),
    ],
    ids=[
        "100k-env-vars",
        "1MB-command-string",
        "1MB-command-argument",
        "10k-mounts",
        "1MB-env-value",
        "4KB-name",
    ],
)
def test_oversized_fields_are_refused(api_for, small_job, change, field) -> None:  # type: ignore[no-untyped-def]
    refused(api_for("alice").post(JOBS, {**small_job, **change}, format="json"), field)
    assert_nothing_stored()


# B2: malformed or hostile JSON.


@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "x", "vc": ',  # truncated
        b"\xff\xfe{not utf-8}",
        b"[" * 100_000 + b"]" * 100_000,  # deep nesting
        b'{"name": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
        b"null",
        b"[]",
        b'"a string"',
        b"NaN",
    ],
    ids=["truncated", "invalid-utf-8", "nested-100k", "nested-field", "null", "list", "string", "nan"],
)
def test_malformed_json_is_a_400(api_for, body) -> None:  # type: ignore[no-untyped-def]
    response = post_raw(api_for("alice"), body)
    assert response.status_code == 400, response.content[:300]
    assert response.json()
    assert_nothing_stored()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"replicas": "two"}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"env": ["A=1"]}, "env"),
        ({"env": {"A": {"nested": 1}}}, "env"),
        ({"mounts": {"name": "x"}}, "mounts"),
        ({"retries": "lots"}, "retries"),
        ({"command": ["python", None]}, "command"),
        ({"command": ["python", "-c", "print(1)\x00"]}, "command"),
        ({"command": "echo \x00"}, "command"),
        ({"env": {"A": "b\x00c"}}, "env"),
        ({"env": {"A\x00B": "c"}}, "env"),
        ({"name": "a\x00b"}, "name"),
        ({"image": "ubuntu\x00"}, "image"),
        ({"privileged": True}, "privileged"),  # unknown fields are refused, not ignored (S9)
        (
            {
                "resources": {
                    "gpus": 1,
                    "gpu_model": "A100",
                    "cpu": 1,
                    "memory_gb": 1,
                    "devices": ["/dev/mem"],
                }
            },
            "resources",
        ),
    ],
    ids=[
        "replicas-text",
        "replicas-bool",
        "env-list",
        "env-nested",
        "mounts-object",
        "retries-text",
        "command-null-item",
        "command-nul-in-argument",
        "command-nul-in-string",
        "env-nul-in-value",
        "env-nul-in-name",
        "name-nul",
        "image-nul",
        "unknown-field",
        "unknown-nested-field",
    ],
)
def test_wrong_types_nul_bytes_and_unknown_fields_are_field_errors(api_for, small_job, change, field) -> None:  # type: ignore[no-untyped-def]
    spec = {**small_job, **change}
    if "resources" in change:
        spec.pop("flavor")
    refused(api_for("alice").post(JOBS, spec, format="json"), field)
    assert_nothing_stored()


def test_duplicate_keys_take_one_value_and_store_one_job(api_for) -> None:  # type: ignore[no-untyped-def]
    body = b'{"name": "first", "name": "second", "vc": "vision", "flavor": "s-A100", "command": "true"}'
    response = post_raw(api_for("alice"), body)
    assert response.status_code == 201, response.content[:300]
    assert list(Job.objects.values_list("name", flat=True)) == ["second"]


# B3: image references.


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu; rm -rf /",
        "--privileged",
        "$(id)",
        "Ubuntu:22.04",
        "ubuntu@sha256:not-a-digest",
        "a" * 4096,
        "ubuntu\nlatest",
        "../../etc/passwd",
    ],
    ids=["shell", "option", "substitution", "uppercase", "bad-digest", "4KB", "newline", "path"],
)
def test_bad_image_references_are_a_400(api_for, small_job, image) -> None:  # type: ignore[no-untyped-def]
    refused(api_for("alice").post(JOBS, {**small_job, "image": image}, format="json"), "image")
    assert_nothing_stored()


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "registry.example.org/ml/pytorch:24.10",
        "nvcr.io/nvidia/pytorch:24.10-py3",
        "localhost:5000/x/y@sha256:" + "a" * 64,
    ],
)
def test_plain_image_references_are_accepted(api_for, small_job, image) -> None:  # type: ignore[no-untyped-def]
    response = api_for("alice").post(JOBS, {**small_job, "image": image}, format="json")
    assert response.status_code == 201, response.content[:300]
    assert response.json()["spec"]["image"] == image


# B4: environment.


@pytest.mark.parametrize(
    "name",
    [
        "LD_LIBRARY_PATH",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "CUDA_VISIBLE_DEVICES",
        "GPUPORTAL_JOB_ID",
        "A=B",
        "A B",
        "",
    ],
)
def test_reserved_and_malformed_env_names_are_a_400(api_for, small_job, name) -> None:  # type: ignore[no-untyped-def]
    refused(api_for("alice").post(JOBS, {**small_job, "env": {name: "all"}}, format="json"), "env")
    assert_nothing_stored()


# B5: mount paths inside the job (the source is always an admin-defined volume).


@pytest.fixture
def vision_volume(demo: Any) -> None:
    from portal.cluster.models import VirtualCluster

    VirtualCluster.objects.filter(name="vision").update(
        allowed_mounts=[{"name": "datasets", "writable": False}]
    )


@pytest.mark.parametrize(
    "path",
    ["../../etc", "/data/../../etc", "relative/path", "", "/" + "a" * 300],
    ids=["dotdot", "absolute-dotdot", "relative", "empty", "too-long"],
)
def test_mount_paths_that_escape_or_are_not_absolute_are_a_400(
    api_for, small_job, vision_volume, path
) -> None:  # type: ignore[no-untyped-def]
    mounts = [{"name": "datasets", "path": path}]
    refused(api_for("alice").post(JOBS, {**small_job, "mounts": mounts}, format="json"), "mounts")
    assert_nothing_stored()


@pytest.mark.parametrize(
    "name", ["../datasets", "%2e%2e%2f", "/var/run/docker.sock", "datasets/../../", "other-tenants-volume"]
)
def test_only_volumes_an_admin_allowed_can_be_mounted(api_for, small_job, vision_volume, name) -> None:  # type: ignore[no-untyped-def]
    mounts = [{"name": name, "path": "/data"}]
    refused(api_for("alice").post(JOBS, {**small_job, "mounts": mounts}, format="json"), "mounts")
    assert_nothing_stored()


def test_a_writable_mount_of_a_read_only_volume_is_a_400(api_for, small_job, vision_volume) -> None:  # type: ignore[no-untyped-def]
    mounts = [{"name": "datasets", "path": "/data", "read_only": False}]
    refused(api_for("alice").post(JOBS, {**small_job, "mounts": mounts}, format="json"), "mounts")
    assert_nothing_stored()


# B6: resources and limits.


def resources(**change: Any) -> dict[str, Any]:
    return {"gpus": 1, "gpu_model": "A100", "cpu": 1, "memory_gb": 1, **change}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"resources": resources(gpus=-1)}, "resources"),
        ({"resources": resources(gpus=10**9)}, "resources"),
        ({"resources": resources(gpus=1.5)}, "resources"),
        ({"resources": resources(memory_gb="1e309")}, "resources"),
        ({"resources": resources(cpu=-4)}, "resources"),
        ({"time_limit": -60}, "time_limit"),
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": "1e309"}, "time_limit"),
        ({"replicas": -1}, "replicas"),
        ({"replicas": 10**18}, "replicas"),
    ],
    ids=[
        "gpus-negative",
        "gpus-1e9",
        "gpus-fraction",
        "memory-1e309",
        "cpu-negative",
        "walltime-negative",
        "walltime-zero",
        "walltime-1e309",
        "replicas-negative",
        "replicas-huge",
    ],
)
def test_invalid_resources_and_limits_are_a_400(api_for, small_job, change, field) -> None:  # type: ignore[no-untyped-def]
    spec = {**small_job, **change}
    if "resources" in change:
        spec.pop("flavor")
    refused(api_for("alice").post(JOBS, spec, format="json"), field)
    assert_nothing_stored()


# B7: commands are data, shown as given.


def test_shell_metacharacters_in_an_argv_are_kept_as_given(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    argv = [
        "python3",
        "-c",
        "print('hi')",
        "; rm -rf / #",
        "$(id)",
        "`id`",
        "a\nb",
        "<script>alert(1)</script>",
    ]
    response = api_for("alice").post(JOBS, {**small_job, "command": argv}, format="json")
    assert response.status_code == 201, response.content[:300]
    job_id = response.json()["id"]
    assert api_for("bob").get(f"{JOBS}{job_id}/").json()["spec"]["command"] == argv

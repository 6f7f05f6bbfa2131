"""`gpuportal submit SPEC --array N` against a real portal: N jobs in one request, each with its
index, and the sizes and specs the portal refuses, said before or after sending."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuportal import cli
from gpuportal.client import MAX_ARRAY_JOBS
from portal.accounts.services import create_api_token
from portal.jobs.api.serializers import MAX_BULK_JOBS
from portal.jobs.models import Job
from tests.conftest import free_port

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def alice_token(users: dict[str, Any]) -> str:
    return create_api_token(users["alice"], "cli array test")[1]


def spec_file(tmp_path: Path, *extra: str, name: str = "sweep", flavor: str = "s-A100") -> Path:
    """A job spec as a user writes it; no agent runs, so its jobs stay pending."""
    path = tmp_path / f"{name}.yaml"
    lines = [f"name: {name}", "vc: vision", f"flavor: {flavor}", "command: python train.py", *extra]
    path.write_text("\n".join(lines) + "\n")
    return path


def no_traceback(result: Any) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr


def test_the_cli_knows_the_portals_largest_array() -> None:
    assert MAX_ARRAY_JOBS == MAX_BULK_JOBS


def test_an_array_of_three_queues_three_jobs_with_their_index(run_cli, alice_token, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = spec_file(tmp_path, "env:", "  SEED: '7'")
    result = run_cli(alice_token, "submit", str(spec), "--array", "3")
    assert result.returncode == 0, result.stderr
    ids = [int(word) for word in result.stdout.split()]
    assert len(result.stdout.strip().splitlines()) == 1 and len(ids) == 3
    assert "job array of 3" in result.stderr
    jobs = [Job.objects.get(pk=job_id) for job_id in ids]
    assert [job.name for job in jobs] == ["sweep-0", "sweep-1", "sweep-2"]
    assert [job.spec["env"] for job in jobs] == [{"SEED": "7", "ARRAY_INDEX": str(i)} for i in range(3)]
    assert {job.state for job in jobs} == {"pending"}
    assert {job.owner.username for job in jobs} == {"alice"}

    as_json = run_cli(alice_token, "submit", str(spec), "--array", "2", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    json_ids = json.loads(as_json.stdout)
    assert isinstance(json_ids, list) and len(json_ids) == 2
    assert [Job.objects.get(pk=job_id).name for job_id in json_ids] == ["sweep-0", "sweep-1"]
    assert Job.objects.count() == 5
    no_traceback(result)
    no_traceback(as_json)


def test_an_array_size_out_of_range_is_refused_before_any_request(run_cli, alice_token, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Nothing listens there: a request would end in "cannot reach" (exit 5), not a usage error.
    nowhere = {"GPUPORTAL_URL": f"http://127.0.0.1:{free_port()}"}
    spec = spec_file(tmp_path)
    for size in ("0", str(MAX_ARRAY_JOBS + 1), "-1", "three"):
        result = run_cli(alice_token, "submit", str(spec), "--array", size, env=nowhere)
        assert result.returncode == cli.USAGE, (size, result.stderr)
        assert f"a job array has 1 to {MAX_ARRAY_JOBS} jobs" in result.stderr, result.stderr
        no_traceback(result)
    following = run_cli(alice_token, "submit", str(spec), "--array", "2", "--follow", env=nowhere)
    assert following.returncode == cli.USAGE and "not allowed with" in following.stderr
    assert not Job.objects.exists()


def test_a_spec_the_portal_refuses_is_printed_per_field(run_cli, alice_token, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad_flavor = spec_file(tmp_path, flavor="xl-A100")
    result = run_cli(alice_token, "submit", str(bad_flavor), "--array", "3")
    assert result.returncode == cli.USAGE, result.stderr
    assert f"the portal refused the job spec in {bad_flavor}" in result.stderr
    field_lines = [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]
    assert any(line.startswith("flavor: No flavor named 'xl-A100'") for line in field_lines), result.stderr

    # The portal sets ARRAY_INDEX itself: a spec that sets it is refused, on its env.
    own_index = spec_file(tmp_path, "env:", "  ARRAY_INDEX: '9'", name="indexed")
    result = run_cli(alice_token, "submit", str(own_index), "--array", "2")
    assert result.returncode == cli.USAGE, result.stderr
    field_lines = [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]
    assert "env: ARRAY_INDEX is set per job of the array." in field_lines, result.stderr

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    result = run_cli(alice_token, "submit", str(broken), "--array", "2")
    assert result.returncode == cli.USAGE and "YAML parse error" in result.stderr
    assert not Job.objects.exists()
    no_traceback(result)


def test_one_job_with_o_json_prints_the_job(run_cli, alice_token, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = spec_file(tmp_path, name="single")
    result = run_cli(alice_token, "submit", str(spec), "-o", "json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["name"] == "single" and job["state"] == "pending"
    assert Job.objects.get(pk=job["id"]).name == "single"
    nowhere = {"GPUPORTAL_URL": f"http://127.0.0.1:{free_port()}"}
    following = run_cli(alice_token, "submit", str(spec), "-o", "json", "--follow", env=nowhere)
    assert following.returncode == cli.USAGE and "leave out --follow" in following.stderr
    no_traceback(result)

"""`gpuportal submit SPEC --dry-run` against a real portal: the verdict in a line (where the job
would start, or why it would wait and until when) and a line per hint, exit 0 whenever the spec
is accepted, the usual exit codes when it is not, and no job stored either way."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuportal import cli
from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.jobs.models import Job, JobEvent
from scheduler.tasks import run_cycle
from tests.conftest import free_port
from tests.portal.store_helpers import submit

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tokens(users: dict[str, Any]) -> dict[str, str]:
    return {name: create_api_token(users[name], "dry-run test")[1] for name in ("alice", "victor")}


def spec_file(tmp_path: Path, flavor: str, name: str = "trial") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nvc: vision\nflavor: {flavor}\ncommand: python train.py\n")
    return path


def no_traceback(result: Any) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr


def test_a_job_that_fits_would_start_now(run_cli, tokens, tmp_path, paused_loop) -> None:  # type: ignore[no-untyped-def]
    Node.objects.update(state="ready")
    result = run_cli(tokens["alice"], "submit", str(spec_file(tmp_path, "s-A100")), "--dry-run")
    assert result.returncode == cli.OK, result.stderr
    assert re.fullmatch(r"would start now on a100-node-\d:\d,\d\n", result.stdout), result.stdout
    assert cli.PAUSED_NOTE in result.stderr, result.stderr  # this test's loop is paused
    assert not Job.objects.exists() and not JobEvent.objects.exists()
    no_traceback(result)


def test_no_pause_is_noted_while_scheduling_runs(run_cli, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The verdict itself may vary here: the running loop's housekeeping may find the nodes,
    # which no agent serves in this test, silent and not ready.
    result = run_cli(tokens["alice"], "submit", str(spec_file(tmp_path, "s-A100")), "--dry-run")
    assert result.returncode == cli.OK, result.stderr
    assert result.stdout.startswith("would "), result.stdout
    assert "paused" not in result.stderr, result.stderr


def test_a_job_over_quota_would_wait_and_hears_what_helps(
    run_cli, api_for, tokens, tmp_path, paused_loop
) -> None:  # type: ignore[no-untyped-def]
    Node.objects.update(state="ready")
    # vision may hold 8 + 8 borrowed A100: two 8-GPU jobs take all of it.
    alice = api_for("alice")
    submit(alice, "a")
    submit(alice, "b")
    run_cycle()
    stored = Job.objects.count()
    spec = str(spec_file(tmp_path, "l-A100"))

    result = run_cli(tokens["alice"], "submit", spec, "--dry-run")
    assert result.returncode == cli.OK, result.stderr
    verdict, *hints = result.stdout.splitlines()
    assert verdict.startswith(
        "would wait: vc-quota, VC vision: 16 A100 in use, 8 guaranteed and 8 borrowed, borrow limit 8; "
        "job needs 8; position 1; estimated start "
    ), verdict
    assert re.search(r"\(in \d+d\d+h\)$", verdict), verdict  # the l-A100 jobs' 336 h limit
    assert "  would help: on V100 instead of A100 (flavor l-V100) it starts now" in hints, hints

    quiet = run_cli(tokens["alice"], "submit", spec, "--dry-run", "-q")
    assert quiet.returncode == cli.OK and quiet.stdout.splitlines() == [verdict], quiet.stdout

    as_json = run_cli(tokens["alice"], "submit", spec, "--dry-run", "-o", "json")
    assert as_json.returncode == cli.OK, as_json.stderr
    data = json.loads(as_json.stdout)
    assert (data["would_start_now"], data["reason"], data["queue_position"]) == (False, "vc-quota", 1)
    assert data["estimated_start"] and any(hint["flavor"] == "l-V100" for hint in data["hints"])
    assert Job.objects.count() == stored
    no_traceback(result)


def test_a_refused_spec_exits_as_a_submission_would(run_cli, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = spec_file(tmp_path, "xl-A100", name="bad")
    result = run_cli(tokens["alice"], "submit", str(bad), "--dry-run")
    assert result.returncode == cli.USAGE, result.stderr
    assert f"the portal refused the job spec in {bad}" in result.stderr
    assert "  flavor: No flavor named 'xl-A100'." in result.stderr, result.stderr
    assert result.stdout == ""

    viewer = run_cli(tokens["victor"], "submit", str(spec_file(tmp_path, "s-A100")), "--dry-run")
    assert viewer.returncode == cli.AUTH, viewer.stderr
    assert "You may not submit jobs to VC vision." in viewer.stderr

    # Not with --follow or --array: refused before anything is sent.
    nowhere = {"GPUPORTAL_URL": f"http://127.0.0.1:{free_port()}"}
    for other in ("--follow", "--array=2"):
        both = run_cli(tokens["alice"], "submit", str(bad), "--dry-run", other, env=nowhere)
        assert both.returncode == cli.USAGE and "not allowed with" in both.stderr, both.stderr
    assert not Job.objects.exists()
    no_traceback(result)
    no_traceback(viewer)

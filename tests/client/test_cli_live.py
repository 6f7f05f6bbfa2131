"""The `gpuportal` command against a real portal (ASGI server, Celery, agents with the process
runtime): what a researcher sees, and the exit codes scripts rely on."""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuportal import cli
from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.jobs.models import Job
from tests.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tokens(users: dict[str, Any]) -> dict[str, str]:
    return {name: create_api_token(users[name], "cli test")[1] for name in ("alice", "bob", "carol")}


@pytest.fixture
def node_1(start_agent: Any) -> Any:
    agent = start_agent("a100-node-1")
    wait_for(lambda: Node.objects.get(name="a100-node-1").state == "ready", 30, "the agent to say hello")
    return agent


def python_job(tmp_path: Path, name: str, script: str, **extra: str) -> Path:
    """A job spec file, written as a user would (YAML); the job runs this interpreter."""
    lines = [
        f"name: {name}",
        "vc: vision",
        "flavor: s-A100",
        f"command: {json.dumps([sys.executable, '-c', script])}",
        *(f"{key}: {value}" for key, value in extra.items()),
    ]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def no_traceback(*results: Any) -> None:
    for result in results:
        assert "Traceback" not in result.stdout + result.stderr, result.stderr


def test_login_stores_a_private_token_and_wrong_passwords_exit_4(run_cli, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    wrong = run_cli(None, "login", "--username", "alice", "--password-stdin", input="nope\n")
    assert wrong.returncode == cli.AUTH
    assert "Wrong user name or password" in wrong.stderr

    login = run_cli(None, "login", "--username", "alice", "--password-stdin", input="alice-pass\n")
    assert login.returncode == 0, login.stderr
    assert "as alice" in login.stderr
    stored = tmp_path / "home" / ".config" / "gpuportal" / "config.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert (
        json.loads(stored.read_text())["token"].startswith("gpp_") or json.loads(stored.read_text())["token"]
    )

    # Later commands use the stored token (no GPUPORTAL_TOKEN in the environment).
    whoami = run_cli(None, "whoami")
    assert whoami.returncode == 0 and whoami.stdout.startswith("alice on ")

    # An existing token can be stored instead; a made-up one is refused and not stored.
    refused = run_cli(None, "login", "--token", "gpp_made_up")
    assert refused.returncode == cli.AUTH
    assert run_cli(None, "whoami").stdout.startswith("alice on ")
    assert run_cli(None, "login", "--token", tokens["bob"]).returncode == 0
    assert run_cli(None, "whoami").stdout.startswith("bob on ")
    assert run_cli(None, "logout").returncode == 0
    assert run_cli(None, "whoami").returncode == cli.AUTH
    no_traceback(wrong, login, whoami, refused)


def test_a_refused_sign_in_shows_the_portals_words(run_cli) -> None:  # type: ignore[no-untyped-def]
    """A sign-in refused on a field read "the portal refused the request"; an empty password
    is refused before anything is sent."""
    long = run_cli(None, "login", "--username", "alice", "--password-stdin", input="x" * 300 + "\n")
    assert long.returncode == cli.AUTH
    assert long.stderr == (
        "error: the portal refused the sign-in:"
        " password: Ensure this field has no more than 256 characters.\n"
    )
    empty = run_cli(None, "login", "--username", "alice", "--password-stdin", input="")
    assert empty.returncode == cli.USAGE
    assert empty.stderr == "error: no password on standard input\n"


def test_a_bad_field_is_printed_per_field_and_exits_2(run_cli, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad job name!\nvc: vision\nflavor: xl-A100\ncommand: echo hi\n")
    result = run_cli(tokens["alice"], "submit", str(spec))
    assert result.returncode == cli.USAGE
    field_lines = [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]
    assert any(line.startswith("flavor: ") for line in field_lines), result.stderr
    assert any(line.startswith("name: ") for line in field_lines), result.stderr
    assert not Job.objects.exists()

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    result = run_cli(tokens["alice"], "submit", str(broken))
    assert result.returncode == cli.USAGE and "YAML" in result.stderr
    no_traceback(result)


def test_submit_follow_streams_the_output_and_exits_with_the_outcome(
    run_cli, tokens, node_1, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    ok = python_job(tmp_path, "hello", "print('hello from the job', flush=True)")
    result = run_cli(tokens["alice"], "submit", str(ok), "--follow")
    assert result.returncode == 0, result.stderr
    assert "hello from the job" in result.stdout.splitlines()
    assert "running" in result.stderr and "succeeded" in result.stderr

    bad = python_job(tmp_path, "fails", "import sys; print('about to fail', flush=True); sys.exit(3)")
    result = run_cli(tokens["alice"], "submit", str(bad), "--follow")
    assert result.returncode == cli.JOB_FAILED, result.stderr
    assert "about to fail" in result.stdout
    assert "failed" in result.stderr and "exit code 3" in result.stderr

    # The output stays readable after the job ended.
    job_id = Job.objects.get(name="fails").pk
    logs = run_cli(tokens["alice"], "logs", str(job_id))
    assert logs.returncode == 0 and logs.stdout.splitlines() == ["about to fail"]
    no_traceback(result, logs)


def test_list_status_queue_cancel_and_nodes(run_cli, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # No agent runs, so every node is not ready and the job waits with a reason.
    spec = python_job(tmp_path, "waits", "print('never')", priority="dev")
    submitted = run_cli(tokens["alice"], "submit", str(spec), "-q")
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.strip())
    wait_for(lambda: Job.objects.get(pk=job_id).pending_reason not in ("", "new"), 60, "a pending reason")

    listing = run_cli(tokens["alice"], "list")
    assert listing.returncode == 0
    row = next(line for line in listing.stdout.splitlines() if line.startswith(str(job_id)))
    assert "waits" in row and "pending" in row and "2 A100" in row and "dev" in row
    assert run_cli(tokens["bob"], "list").stdout.count("waits") == 0, "default: only my jobs"
    assert "waits" in run_cli(tokens["bob"], "list", "--all").stdout
    assert "waits" not in run_cli(tokens["alice"], "list", "--state", "running").stdout
    as_json = json.loads(run_cli(tokens["alice"], "list", "-o", "json").stdout)
    assert [j["id"] for j in as_json] == [job_id]

    job = Job.objects.get(pk=job_id)
    queue = run_cli(tokens["alice"], "queue")
    assert queue.returncode == 0
    row = next(line for line in queue.stdout.splitlines() if line.startswith(str(job_id)))
    assert job.pending_reason in row
    # 80 columns cannot hold the message beside the other columns. Into a pipe each job stays
    # one line, whole, whatever COLUMNS says; on a terminal (rich's TTY_COMPATIBLE) the
    # messages go below the table, wrapped, by job id.
    assert len(job.pending_message) > 20
    piped = run_cli(tokens["alice"], "queue", env={"COLUMNS": "80"})
    row = next(line for line in piped.stdout.splitlines() if line.startswith(str(job_id)))
    assert job.pending_reason in row and row.rstrip().endswith(job.pending_message)
    narrow = run_cli(tokens["alice"], "queue", env={"COLUMNS": "80", "TTY_COMPATIBLE": "1"})
    lines = re.sub(r"\x1b\[[0-9;]*m", "", narrow.stdout).splitlines()  # the terminal's styles
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if line.startswith(str(job_id)) and job.pending_reason in line)
    assert "WHY" not in lines[0] and "WHY" in "".join(lines[1:])
    why = lines[lines.index(row) + 1 :]
    below = " ".join(line.strip() for line in why if line.strip() and not line.startswith("ID"))
    assert below.startswith(str(job_id)) and " ".join(job.pending_message.split()) in below
    queued = json.loads(run_cli(tokens["alice"], "queue", "-o", "json").stdout)
    assert queued[0]["pending_reason"] == job.pending_reason
    assert queued[0]["pending_message"] == job.pending_message

    status = run_cli(tokens["alice"], "status", str(job_id))
    assert status.returncode == 0
    assert "Why pending" in status.stdout and job.pending_reason in status.stdout
    assert "Events" in status.stdout
    assert "What would help" not in status.stdout
    # On a narrow terminal an event's time stays on one line (the long columns fold).
    narrow = run_cli(tokens["alice"], "status", str(job_id), env={"COLUMNS": "44", "TTY_COMPATIBLE": "1"})
    events = re.sub(r"\x1b\[[0-9;]*m", "", narrow.stdout).split("Events")[1]
    stamps = re.findall(r"^ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", events, flags=re.MULTILINE)
    assert len(stamps) == job.events.count() >= 1, events
    hint = {
        "kind": "fewer-gpus",
        "message": "as 1x1 A100 instead of 1x2 it starts now",
        "replicas": 1,
        "gpus_per_replica": 1,
        "gpu_model": "A100",
        "flavor": None,
        "time_limit_s": None,
        "starts_now": True,
        "estimated_start_at": None,
    }

    # The scheduling loop keeps running and writes the job's hints (none: no node is ready)
    # every cycle, so one may land between this write and the CLI's read: write again then.
    def shows_hint() -> bool:
        Job.objects.filter(pk=job_id).update(whatif_hints=[hint])
        hinted = run_cli(tokens["alice"], "status", str(job_id))
        return "What would help" in hinted.stdout and hint["message"] in hinted.stdout

    wait_for(shows_hint, 60, "the hint in `status`")

    nodes = run_cli(tokens["alice"], "nodes")
    assert nodes.returncode == 0
    assert all(name in nodes.stdout for name in ("a100-node-1", "a100-node-2", "v100-node-1"))
    row = next(line for line in nodes.stdout.splitlines() if line.startswith("a100-node-1"))
    assert "8/8" in row and "........" in row, "every GPU free"

    top = run_cli(tokens["alice"], "top", str(job_id))
    assert top.returncode == 0 and "goes before alice's other pending jobs in vision" in top.stderr
    assert Job.objects.get(pk=job_id).topped_at is not None
    assert run_cli(tokens["bob"], "top", str(job_id)).returncode == cli.AUTH  # not his job
    hold = run_cli(tokens["alice"], "hold", str(job_id))
    assert hold.returncode == 0 and "is held" in hold.stderr
    assert Job.objects.get(pk=job_id).on_hold
    assert run_cli(tokens["alice"], "hold", str(job_id)).returncode == cli.CONFLICT
    release = run_cli(tokens["alice"], "release", str(job_id))
    assert release.returncode == 0 and "is released" in release.stderr
    assert not Job.objects.get(pk=job_id).on_hold

    cancel = run_cli(tokens["alice"], "cancel", str(job_id))
    assert cancel.returncode == 0 and "cancelled" in cancel.stderr
    assert Job.objects.get(pk=job_id).state == "cancelled"
    again = run_cli(tokens["alice"], "cancel", str(job_id))
    assert again.returncode == cli.CONFLICT
    assert "You have no pending jobs" in run_cli(tokens["alice"], "queue").stderr
    no_traceback(listing, queue, status, nodes, cancel, again)


def test_another_tenants_job_is_not_found(run_cli, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    submitted = run_cli(tokens["alice"], "submit", str(python_job(tmp_path, "mine", "print(1)")), "-q")
    job_id = submitted.stdout.strip()
    for command in (
        ["status", job_id],
        ["logs", job_id],
        ["cancel", job_id],
        ["top", job_id],
        ["hold", job_id],
        ["release", job_id],
        ["time-limit", job_id, "1h"],
        ["logs", job_id, "-f"],
    ):
        result = run_cli(tokens["carol"], *command)
        assert result.returncode == cli.NOT_FOUND, (command, result.stderr)
        assert f"job {job_id} not found" in result.stderr
        no_traceback(result)
        # Word for word what a job that does not exist gets.
        made_up = run_cli(tokens["carol"], *[part if part != job_id else "999999" for part in command])
        assert made_up.returncode == cli.NOT_FOUND
        assert made_up.stderr.replace("999999", job_id) == result.stderr
    assert Job.objects.get(pk=int(job_id)).state == "pending"
    # Its owner lowers its time limit; raising it is a tenant admin's, and the portal says so.
    lowered = run_cli(tokens["alice"], "time-limit", job_id, "90m")
    assert lowered.returncode == cli.OK, lowered.stderr
    assert "its time limit is now 90m per attempt" in lowered.stderr
    assert Job.objects.get(pk=int(job_id)).time_limit_s == 5400
    refused = run_cli(tokens["alice"], "time-limit", job_id, "2h")
    assert refused.returncode == cli.AUTH
    assert "Only an admin of the job's tenant may raise its time limit" in refused.stderr
    # A revoked or made-up token is an authentication failure, not "not found".
    assert run_cli("gpp_made_up", "status", job_id).returncode == cli.AUTH

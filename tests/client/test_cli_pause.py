"""`gpuportal hold` on a running job pauses it, end to end: a real agent runs the example training
script, which saves when asked and exits; the job waits held, its GPU free, until `gpuportal
release`, and its next attempt continues from the step it saved. A job without checkpointing
is refused: pausing it would lose its work."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuportal import cli
from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.jobs.models import Job
from tests.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_counter.py"


def spec_file(tmp_path: Path, name: str, **fields: Any) -> Path:
    path = tmp_path / f"{name}.yaml"
    fields = {"name": name, "vc": "vision", "flavor": "s-A100", **fields}
    path.write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in fields.items()))
    return path


def submitted(run_cli: Any, token: str, spec: Path) -> int:
    result = run_cli(token, "submit", str(spec), "-q")
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def output(run_cli: Any, token: str, job_id: int, attempt: int) -> str:
    result = run_cli(token, "logs", str(job_id), "--attempt", str(attempt))
    assert result.returncode == 0, result.stderr
    return str(result.stdout)


def test_a_paused_job_is_held_after_its_checkpoint_and_resumes_from_it(
    run_cli: Any, users: dict[str, Any], start_agent: Any, tmp_path: Path
) -> None:
    start_agent("a100-node-1")
    wait_for(lambda: Node.objects.get(name="a100-node-1").state == "ready", 30, "the agent to say hello")
    token = create_api_token(users["alice"], "cli test")[1]
    command = [sys.executable, str(EXAMPLE), "--steps", "400", "--save-every", "50", "--step-seconds", "0.05"]
    training = submitted(
        run_cli,
        token,
        spec_file(
            tmp_path,
            "counter",
            command=command,
            env={"PYTHONPATH": str(REPO)},
            checkpoint={"enabled": True, "grace_seconds": 60},
        ),
    )
    plain = submitted(run_cli, token, spec_file(tmp_path, "plain", command=["sleep", "600"]))

    def both_running_and_saved() -> bool:
        states = set(Job.objects.filter(pk__in=[training, plain]).values_list("state", flat=True))
        return states == {"running"} and "saved step 50" in output(run_cli, token, training, 1)

    wait_for(both_running_and_saved, 120, "both jobs to run and the training job to save once", interval=1)

    refused = run_cli(token, "hold", str(plain))
    assert refused.returncode == cli.CONFLICT
    assert f"Job {plain} has no checkpointing; pausing it would lose its work." in refused.stderr
    assert Job.objects.get(pk=plain).state == "running"

    paused = run_cli(token, "hold", str(training))
    assert paused.returncode == 0, paused.stderr
    assert f"Job {training} counter is checkpointing; it will be held when it stops" in paused.stderr

    def held() -> bool:
        job = Job.objects.get(pk=training)
        return job.state == "pending" and job.on_hold

    wait_for(held, 90, "the paused job to checkpoint, stop and wait held", interval=0.5)

    # The last step it saved: when asked (or, should a periodic save land just after the
    # request, that one, which the agent takes as the checkpoint).
    # Its last lines may reach the portal after its end (log chunks and status reports are
    # separate messages), so wait for them rather than read once.
    def last_saved() -> int:
        text = output(run_cli, token, training, 1)
        saved = [int(step) for step in re.findall(r"(?:saved step|checkpoint requested at step) (\d+)", text)]
        return saved[-1] if saved else 0

    wait_for(lambda: last_saved() > 50, 30, "the paused job's last saved step in its output", interval=1)
    saved_step = last_saved()
    status = run_cli(token, "status", str(training))
    assert "held: Paused by alice: resumes from its checkpoint when released" in status.stdout
    time.sleep(3)  # cycles run meanwhile: a held job is not started however much room there is
    job = Job.objects.get(pk=training)
    assert (job.state, job.on_hold, job.attempts.count()) == ("pending", True, 1)

    released = run_cli(token, "release", str(training))
    assert released.returncode == 0 and "is released" in released.stderr
    followed = run_cli(token, "logs", str(training), "-f", timeout=180)
    assert followed.returncode == 0, followed.stderr + followed.stdout
    second = output(run_cli, token, training, 2)
    assert f"resumed from step {saved_step}" in second and "starting from step 0" not in second
    assert "done at step 400" in second
    assert run_cli(token, "cancel", str(plain)).returncode == 0

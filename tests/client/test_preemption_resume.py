"""The example training script as a real job, preempted by a production job and resumed.

Two simulated DGX-A100 agents (16 GPUs). The dev job takes both nodes (2 replicas of
l-A100: the vision VC's 8 guaranteed plus 8 borrowed A100s). A production job of l-A100 then
cannot fit, in quota or in GPUs, so the scheduler preempts the dev job: the agents send the
checkpoint signal, the script saves and exits, the job is requeued, and when the production
job is done a second attempt starts with GPUPORTAL_RESUME=1 and continues from the saved step.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.jobs.models import Job
from tests.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_counter.py"
STEPS = 600
SAVED = r"(?:saved step|checkpoint requested at step) (\d+)"
PERIODIC = r"^(?:\[\d\] )?saved step (\d+)$"


def spec_file(tmp_path: Path, name: str, **fields: Any) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "\n".join(f"{key}: {json.dumps(value)}" for key, value in {"name": name, **fields}.items())
    )
    return path


def lines_of(run_cli: Any, token: str, job_id: int, attempt: int) -> list[str]:
    result = run_cli(token, "logs", str(job_id), "--attempt", str(attempt))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def steps(lines: list[str], pattern: str) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.search(pattern, line))]


def by_replica(lines: list[str]) -> dict[int, list[str]]:
    """`[1] step 10 loss ...` -> {1: ["step 10 loss ..."]}: the CLI prefixes the replica."""
    out: dict[int, list[str]] = {}
    for line in lines:
        match = re.match(r"\[(\d+)\] (.*)", line)
        assert match, line
        out.setdefault(int(match.group(1)), []).append(match.group(2))
    return out


@dataclass
class Outcome:
    job: dict[str, Any]  # `gpuportal status -o json` of the training job, with its events
    production: dict[str, Any]
    logs: dict[int, list[str]]  # attempt number -> output lines of both replicas


def preempt_and_resume(run_cli: Any, users: dict[str, Any], start_agent: Any, tmp_path: Path) -> Outcome:
    """Runs the scenario through the CLI and returns what the API and the logs say."""
    for node in ("a100-node-1", "a100-node-2"):
        start_agent(node)
    wait_for(
        lambda: Node.objects.filter(name__in=["a100-node-1", "a100-node-2"], state="ready").count() == 2,
        30,
        "both agents to say hello",
    )
    token = create_api_token(users["alice"], "cli test")[1]
    command = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--save-every", "50"]
    training = spec_file(
        tmp_path,
        "counter",
        vc="vision",
        flavor="l-A100",
        replicas=2,
        priority="dev",
        command=[*command, "--step-seconds", "0.05"],
        env={"PYTHONPATH": str(REPO)},  # the job sees only what the agent sets, not our environment
        checkpoint={"enabled": True, "signal": "SIGUSR1", "grace_seconds": 60},
    )
    submitted = run_cli(token, "submit", str(training), "-q")
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout)

    def saved_once() -> bool:
        running = Job.objects.get(pk=job_id).state == "running"
        return running and any("saved step 50" in line for line in lines_of(run_cli, token, job_id, 1))

    wait_for(saved_once, 120, "the training job to run and save once", interval=1)

    urgent = spec_file(
        tmp_path,
        "urgent",
        vc="vision",
        flavor="l-A100",
        priority="production",
        command=[sys.executable, "-c", "import time; print('production work', flush=True); time.sleep(2)"],
    )
    # Production is for tenant admins: vision's admin submits it.
    admin_token = create_api_token(users["vision-admin"], "cli test")[1]
    production = run_cli(admin_token, "submit", str(urgent), "--follow", "-q", timeout=300)
    assert production.returncode == 0, production.stderr
    assert "production work" in production.stdout
    production_id = int(production.stdout.splitlines()[0])

    # Follow the training job to its end through the CLI: its exit status is the job's.
    followed = run_cli(token, "logs", str(job_id), "-f", timeout=300)
    assert followed.returncode == 0, followed.stderr + followed.stdout
    assert Job.objects.get(pk=job_id).state == "succeeded"

    job = json.loads(run_cli(token, "status", str(job_id), "-o", "json", "--events", "0").stdout)
    logs = {a["number"]: lines_of(run_cli, token, job_id, a["number"]) for a in job["attempts"]}
    other = json.loads(run_cli(token, "status", str(production_id), "-o", "json").stdout)
    return Outcome(job=job, production=other, logs=logs)


def describe(outcome: Outcome) -> str:
    attempts = [(a["number"], a["state"], a["resume"], a["end_reason"]) for a in outcome.job["attempts"]]
    events = [(e["to_state"], e["actor_label"], e["reason"]) for e in outcome.job["events"]]
    return f"attempts {attempts}; events {events}"


def test_the_example_is_preempted_checkpoints_and_resumes_without_losing_steps(
    run_cli: Any, users: dict[str, Any], start_agent: Any, tmp_path: Path
) -> None:
    outcome = preempt_and_resume(run_cli, users, start_agent, tmp_path)
    job, logs = outcome.job, outcome.logs
    assert outcome.production["state"] == "succeeded"
    states = [event["to_state"] for event in job["events"]]
    assert "checkpointing" in states and "preempted" in states, describe(outcome)
    checkpointing = next(e for e in job["events"] if e["to_state"] == "checkpointing")
    assert f"preempted for job {outcome.production['id']}: priority" in checkpointing["reason"]
    attempts = job["attempts"]
    assert len(attempts) >= 2 and attempts[0]["resume"] is False, describe(outcome)
    assert all(a["resume"] for a in attempts[1:]) and attempts[-1]["state"] == "succeeded"

    first = logs[1]
    assert sum("starting from step 0" in line for line in first) == 2
    # The replicas saved when the portal asked, after at least one periodic save. A periodic
    # save that lands between the signal and the replica's next step is a complete checkpoint
    # written after the request: the agent takes it and stops the replica, which then never
    # prints the request (the checks below still hold it to resuming from a saved step).
    asked = {r: steps(own, r"checkpoint requested at step (\d+)") for r, own in by_replica(first).items()}
    assert asked and all(len(a) <= 1 for a in asked.values()), asked
    assert any(asked.values()) and min(a[0] for a in asked.values() if a) > 50, asked

    # Every later attempt continues from a step that was saved, never from step 0, and from no
    # earlier than the last periodic save before it started. (The toy's replicas do not step
    # in lockstep as real data-parallel ranks do, and they share one checkpoint directory, so a
    # replica that starts later may resume from a step its sibling saved meanwhile. An attempt
    # stopped before it printed anything leaves no lines.)
    saved_so_far = steps(first, SAVED)
    periodic_so_far = steps(first, PERIODIC)
    for number in range(2, len(attempts) + 1):
        lines = logs[number]
        assert not any("starting from step 0" in line for line in lines), (number, lines[:4])
        for replica, own in by_replica(lines).items():
            resumed = steps(own, r"resumed from step (\d+)")
            assert len(resumed) == 1, (number, replica, own[:3])
            assert resumed[0] in saved_so_far + steps(lines, SAVED), (number, replica, resumed)
            assert resumed[0] >= max(periodic_so_far), (number, replica, resumed, periodic_so_far)
            reported = steps(own, r"^step (\d+) loss")
            assert not reported or min(reported) > resumed[0], "no step is done twice after resuming"
        saved_so_far += steps(lines, SAVED)
        periodic_so_far += steps(lines, PERIODIC)
    assert len(by_replica(logs[len(attempts)])) == 2
    assert sum(f"done at step {STEPS}" in line for line in logs[len(attempts)]) == 2


def test_the_production_job_runs_before_the_preempted_job_resumes(
    run_cli: Any, users: dict[str, Any], start_agent: Any, tmp_path: Path
) -> None:
    outcome = preempt_and_resume(run_cli, users, start_agent, tmp_path)
    attempts = outcome.job["attempts"]
    assert len(attempts) == 2, describe(outcome)
    production_started = outcome.production["started_at"]
    assert production_started is not None
    resumed_at = datetime.fromisoformat(attempts[1]["created_at"])
    assert resumed_at > datetime.fromisoformat(production_started)

"""`gpuportal status` and `--follow` say what the agents report of the current attempt's replicas
while they start (an image pull's progress), against a portal faked at the HTTP level."""

from __future__ import annotations

import io
import re
from typing import Any

import httpx
from rich.console import Console

from gpuportal import cli
from gpuportal.client import PortalClient
from gpuportal.models import JobDetail

PULLING = "pulling registry.example.org/ml/pytorch:24.10: 312 of 1,024 MiB"


def replica(
    number: int, state: str | None, message: str = "", exit_code: int | None = None
) -> dict[str, Any]:
    return {
        "replica": number,
        "node": f"a100-node-{number + 1}",
        "state": state,
        "message": message,
        "exit_code": exit_code,
    }


def job(state: str, replicas: list[dict[str, Any]], attempt_state: str = "starting") -> dict[str, Any]:
    attempts = [
        {"number": 1, "state": "failed", "replicas_status": [replica(0, "exited", "old news", 1)]},
        {"number": 2, "state": attempt_state, "replicas_status": replicas},
    ]
    return {"id": 7, "name": "pull", "vc": "vision", "owner": "alice", "state": state, "attempts": attempts}


def fake_portal(answers: list[dict[str, Any]]) -> PortalClient:
    """Answers the job with each of `answers` in turn (the last one from then on), no events or output."""
    reads = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal reads
        path = request.url.path
        if path == "/api/v1/jobs/7/":
            reads += 1
            return httpx.Response(200, json=answers[min(reads, len(answers)) - 1])
        assert path in ("/api/v1/jobs/7/events/", "/api/v1/jobs/7/logs/"), path
        return httpx.Response(200, json={"count": 0, "next": None, "results": []})

    return PortalClient("http://portal.test", "gpp_t", transport=httpx.MockTransport(handler))


def status_of(answer: dict[str, Any]) -> str:
    ctx = cli.Context(cli.build_parser().parse_args(["status", "7"]))
    ctx.out = Console(file=io.StringIO(), width=200, highlight=False, soft_wrap=False)
    ctx._client = fake_portal([answer])
    assert cli.cmd_status(ctx) == cli.OK
    ctx.close()
    output = ctx.out.file.getvalue()
    assert isinstance(output, str)
    return output


def replica_rows(output: str) -> list[list[str]]:
    """The cells of the replicas table's rows (cells are set apart by two spaces or more)."""
    table = output.split("Replicas of attempt 2")[1].split("\n\n")[0].splitlines()[1:]
    assert re.split(r"\s{2,}", table[0].strip()) == ["#", "NODE", "STATE", "EXIT", "MESSAGE"]
    return [re.split(r"\s{2,}", line.strip()) for line in table[1:]]


def test_status_shows_the_replicas_of_the_current_attempt_while_they_start() -> None:
    output = status_of(job("starting", [replica(0, "starting", PULLING), replica(1, None)]))
    assert replica_rows(output) == [
        ["0", "a100-node-1", "starting", "-", PULLING],
        ["1", "a100-node-2", "not reported", "-"],
    ]
    assert "old news" not in output  # an earlier attempt's replicas are its own


def test_status_shows_why_a_replica_could_not_start_and_nothing_for_quiet_ones() -> None:
    failed = status_of(
        job("failed", [replica(0, "exited", "cannot pull x:1: unauthorized", 125)], attempt_state="failed")
    )
    assert replica_rows(failed) == [["0", "a100-node-1", "exited", "125", "cannot pull x:1: unauthorized"]]
    running = status_of(
        job("running", [replica(0, "running"), replica(1, "running")], attempt_state="running")
    )
    assert "Replicas" not in running
    # An ended job whose replicas never reported (cancelled while it was placed) waits for nothing.
    cancelled = status_of(job("cancelled", [replica(0, None)], attempt_state="stopped"))
    assert "Replicas" not in cancelled


def test_follow_hears_each_new_progress_message_and_its_spinner_shows_it() -> None:
    answers = [
        job("starting", [replica(0, "starting", "pulling registry.example.org/ml/pytorch:24.10")]),
        job("starting", [replica(0, "starting", PULLING)]),
        job("starting", [replica(0, "starting", PULLING)]),
        job("succeeded", [replica(0, "exited", "", 0)], attempt_state="succeeded"),
    ]
    with fake_portal(answers) as client:
        seen = [item for item in client.follow_logs(7, poll_s=0, events=True) if isinstance(item, JobDetail)]
    assert [cli.start_progress(item) for item in seen] == [
        "replica 0 on a100-node-1: pulling registry.example.org/ml/pytorch:24.10",
        f"replica 0 on a100-node-1: {PULLING}",
        "",
    ]
    many = JobDetail.model_validate(
        job("starting", [replica(0, "starting", PULLING), replica(1, "starting", PULLING)])
    )
    assert cli.start_progress(many) == f"replica 0 on a100-node-1: {PULLING} (and 1 more)"

"""End to end: REST -> scheduling loop (Celery) -> agent websocket -> a real process on the GPUs
it was given -> logs and exit back in the portal. Two simulated DGX-A100 agents, process runtime."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobAttempt
from tests.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

PRINT_AND_EXIT = (
    "import os, sys\n"
    "print('devices=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
    "print('job=' + os.environ['GPUPORTAL_JOB_ID'], flush=True)\n"
    "print('to stderr', file=sys.stderr, flush=True)\n"
    "sys.exit(int(os.environ.get('EXIT_WITH', '0')))\n"
)

COUNT_SLOWLY = "import time\nfor i in range(60):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.25)\n"


@pytest.fixture
def two_agents(start_agent: Any) -> list[Any]:
    agents = [start_agent("a100-node-1"), start_agent("a100-node-2")]
    wait_for(
        lambda: Node.objects.filter(name__in=["a100-node-1", "a100-node-2"], state="ready").count() == 2,
        30,
        "both agents to say hello",
    )
    return agents


def submit(api: httpx.Client, name: str, script: str, **extra: Any) -> int:
    spec = {"name": name, "vc": "vision", "flavor": "s-A100", "command": ["python3", "-c", script], **extra}
    response = api.post("/api/v1/jobs/", json=spec)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def job_state(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def log_text(api: httpx.Client, job_id: int) -> list[str]:
    return [
        line["text"]
        for line in api.get(f"/api/v1/jobs/{job_id}/logs/", params={"limit": 500}).json()["results"]
    ]


def test_a_job_runs_on_its_gpus_streams_logs_and_ends_with_its_exit_code(alice_api, two_agents) -> None:  # type: ignore[no-untyped-def]
    ok = submit(alice_api, "prints", PRINT_AND_EXIT)
    bad = submit(alice_api, "fails", PRINT_AND_EXIT, env={"EXIT_WITH": "3"})
    wait_for(lambda: job_state(ok) == "succeeded" and job_state(bad) == "failed", 60, "both jobs to end")

    detail = alice_api.get(f"/api/v1/jobs/{ok}/").json()
    (attempt,) = detail["attempts"]
    allocated = [a["gpu_uuid"] for a in sorted(attempt["allocations"], key=lambda a: a["gpu_index"])]
    assert len(allocated) == 2 and len({a["node"] for a in attempt["allocations"]}) == 1
    lines = log_text(alice_api, ok)
    # The job sees exactly the GPUs it was given (by uuid, as CUDA_VISIBLE_DEVICES allows).
    assert f"devices={','.join(allocated)}" in lines
    assert f"job={ok}" in lines and "to stderr" in lines
    assert detail["exit_code"] == 0
    states = [e["to_state"] for e in alice_api.get(f"/api/v1/jobs/{ok}/events/").json()["results"]]
    assert states[0] == "pending" and states[1] == "scheduled" and states[-2:] == ["running", "succeeded"]

    failed = alice_api.get(f"/api/v1/jobs/{bad}/").json()
    assert failed["exit_code"] == 3 and "exited with code 3" in failed["end_reason"]
    # Both ended jobs gave their GPUs back.
    assert not Allocation.objects.filter(released_at__isnull=True).exists()


def test_an_agent_killed_mid_job_reattaches_without_restarting_it(alice_api, two_agents) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(alice_api, "counts", COUNT_SLOWLY)
    wait_for(lambda: job_state(job_id) == "running", 60, "the job to run")
    wait_for(lambda: len(log_text(alice_api, job_id)) >= 4, 30, "the first log lines")
    node = Allocation.objects.filter(attempt__job_id=job_id).values_list("node__name", flat=True).first()
    agent = next(a for a in two_agents if a.node == node)

    agent.kill()
    seen_while_down = len(log_text(alice_api, job_id))
    agent.start()
    wait_for(lambda: job_state(job_id) == "succeeded", 60, "the job to finish after the agent restart")

    assert JobAttempt.objects.filter(job_id=job_id).count() == 1  # same attempt, never restarted
    lines = log_text(alice_api, job_id)
    assert lines == [f"tick {i}" for i in range(60)], "every line exactly once, in order"
    assert seen_while_down < 60
    events = [e["to_state"] for e in alice_api.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]]
    assert events.count("running") == 1

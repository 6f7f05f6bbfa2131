"""The scheduling loop end to end: REST, the Celery worker and beat, real agents running real
processes on simulated GPUs. Every test ends with the invariants checked."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobAttempt
from tests.conftest import wait_for
from tests.integration.invariants import assert_invariants

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SLEEP = "import time\nprint('started', flush=True)\ntime.sleep({seconds})\n"
EXIT_WITH = "import sys\nprint('exiting', flush=True)\nsys.exit({code})\n"
# Ignores the checkpoint signal, so a checkpoint request can only end by the grace period.
STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: print('ignoring', flush=True))\n"
    "print('started', flush=True)\ntime.sleep(300)\n"
)


@pytest.fixture
def api(live_stack: dict[str, Any], users: dict[str, Any]) -> Any:
    clients: dict[str, httpx.Client] = {}

    def client(username: str) -> httpx.Client:
        if username not in clients:
            _, token = create_api_token(users[username], "loop")
            clients[username] = httpx.Client(
                base_url=live_stack["http"], headers={"Authorization": f"Bearer {token}"}, timeout=10
            )
        return clients[username]

    return client


@pytest.fixture
def a100_agents(start_agent: Any) -> list[Any]:
    agents = [start_agent("a100-node-1"), start_agent("a100-node-2")]
    wait_for(lambda: Node.objects.filter(name__startswith="a100", state="ready").count() == 2, 30, "agents")
    return agents


def submit(client: httpx.Client, name: str, script: str, **spec: Any) -> int:
    body = {"name": name, "vc": "vision", "flavor": "s-A100", "command": ["python3", "-c", script], **spec}
    response = client.post("/api/v1/jobs/", json=body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def state(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def events(job_id: int) -> list[str]:
    return list(Job.objects.get(pk=job_id).events.exclude(to_state="").values_list("to_state", flat=True))


def test_a_gang_starts_whole_or_not_at_all(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    alice = api("alice")
    small = submit(alice, "small", SLEEP.format(seconds=4))
    wait_for(lambda: state(small) == "running", 60, "the small job to run")
    gang = submit(alice, "gang", SLEEP.format(seconds=1), flavor="l-A100", replicas=2)
    wait_for(lambda: Job.objects.get(pk=gang).pending_reason not in ("", "new"), 30, "a reason for the gang")
    assert state(gang) == "pending"
    assert not Allocation.objects.filter(attempt__job_id=gang).exists()  # no partial hold
    assert Job.objects.get(pk=gang).pending_message
    assert_invariants()
    wait_for(lambda: state(gang) in ("running", "succeeded"), 60, "the gang to start after the small job")
    nodes = set(Allocation.objects.filter(attempt__job_id=gang).values_list("node__name", flat=True))
    assert nodes == {"a100-node-1", "a100-node-2"}
    assert_invariants()
    wait_for(lambda: state(gang) == "succeeded", 60, "the gang to finish")
    assert_invariants()


def test_retries_with_backoff_then_a_permanent_failure(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    alice = api("alice")
    flaky = submit(alice, "flaky", EXIT_WITH.format(code=1), retries={"limit": 1, "backoff_seconds": 1})
    permanent = submit(
        alice, "permanent", EXIT_WITH.format(code=2), retries={"limit": 3, "permanent_exit_codes": [2]}
    )
    wait_for(
        lambda: state(flaky) == "failed" and state(permanent) == "failed", 90, "both jobs to fail for good"
    )
    assert JobAttempt.objects.filter(job_id=flaky).count() == 2
    assert events(flaky).count("pending") == 2 and events(flaky)[-1] == "failed"  # submitted, then one retry
    assert JobAttempt.objects.filter(job_id=permanent).count() == 1
    assert "permanent" in Job.objects.get(pk=permanent).end_reason
    assert_invariants()


def test_a_job_is_stopped_at_its_time_limit(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    # 10 s: longer than the 5 s between checks, so one of them sees it before its limit and warns.
    job = submit(api("alice"), "too-long", SLEEP.format(seconds=300), time_limit=10)
    wait_for(lambda: state(job) == "timed-out", 60, "the job to time out")
    reasons = list(Job.objects.get(pk=job).events.values_list("reason", flat=True))
    assert any("time limit reached in" in r for r in reasons)  # the warning
    assert any("reached: stopping" in r for r in reasons)
    assert not Allocation.objects.filter(attempt__job_id=job, released_at__isnull=True).exists()
    assert_invariants()


def test_a_lost_node_s_job_is_requeued_and_the_returning_agent_stops_it(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    job = submit(api("alice"), "survivor", SLEEP.format(seconds=40))
    wait_for(lambda: state(job) == "running", 60, "the job to run")
    first_node = Allocation.objects.filter(attempt__job_id=job).values_list("node__name", flat=True).first()
    lost_agent = next(a for a in a100_agents if a.node == first_node)
    lost_agent.kill()
    wait_for(lambda: JobAttempt.objects.filter(job_id=job).count() == 2, 60, "a second attempt elsewhere")
    wait_for(lambda: state(job) == "running", 60, "the second attempt to run")
    second = JobAttempt.objects.get(job_id=job, number=2)
    assert set(second.allocations.values_list("node__name", flat=True)) == {
        a.node for a in a100_agents if a is not lost_agent
    }
    assert JobAttempt.objects.get(job_id=job, number=1).state == "lost"
    assert "lost" in events(job)
    assert_invariants()
    # The agent comes back: the first attempt's process is no longer desired and is stopped.
    lost_agent.start()
    wait_for(
        lambda: (
            JobAttempt.objects.get(job_id=job, number=1).replica_states["0"]["state"]
            in ("exited", "vanished")
        ),
        60,
        "the returning agent to stop the old attempt",
    )
    assert state(job) == "running" and JobAttempt.objects.filter(job_id=job).count() == 2
    assert_invariants()


def test_priority_preemption_and_cancel_during_the_checkpoint(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    alice = api("alice")
    stubborn = submit(
        alice,
        "stubborn",
        STUBBORN,
        flavor="l-A100",
        replicas=2,
        priority="dev",
        checkpoint={"enabled": True, "grace_seconds": 60},
    )
    wait_for(lambda: state(stubborn) == "running", 60, "the dev gang to run")
    urgent = submit(alice, "urgent", SLEEP.format(seconds=1), flavor="l-A100", priority="production")
    wait_for(lambda: state(stubborn) == "checkpointing", 60, "the dev job to be asked to checkpoint")
    assert state(urgent) == "pending"
    assert_invariants()
    assert alice.post(f"/api/v1/jobs/{stubborn}/cancel/").json()["state"] == "cancelled"
    wait_for(lambda: state(urgent) == "succeeded", 60, "the production job to run once the GPUs are free")
    assert "checkpointing" in events(stubborn) and events(stubborn)[-1] == "cancelled"
    assert_invariants()


def test_a_vc_reclaims_its_guarantee_from_a_borrower(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    carol = api("carol")
    borrower = submit(
        carol,
        "borrower",
        SLEEP.format(seconds=300),
        vc="speech",
        flavor="l-A100",
        replicas=2,
        checkpoint={"enabled": False, "grace_seconds": 2},
    )
    wait_for(lambda: state(borrower) == "running", 60, "speech to borrow all 16 A100")
    owner = submit(api("alice"), "owner", SLEEP.format(seconds=1), flavor="l-A100")
    wait_for(lambda: state(owner) == "succeeded", 120, "vision to get its guaranteed GPUs back and finish")
    assert "checkpointing" in events(borrower) and "preempted" in events(borrower)
    assert_invariants()
    Job.objects.filter(pk=borrower)  # still queued or running again; never above its quota

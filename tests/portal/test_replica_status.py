"""What the agents report of each replica (its state, and while it starts the progress of its image
pull) reaches the job's viewers: in the job detail's `replicas_status`, and live on the job's page,
which hears of a message that changed even though the job did not move."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.utils import timezone

from agents.protocol import AttemptState, AttemptStatus, ExitReason
from portal.agentgw.desired import agent_attempt_id
from portal.cluster.models import Node
from portal.jobs.models import JobAttempt
from portal.jobs.services import record_attempt_status
from portal.live.hub import channel_for
from portal.live.publish import ALL_JOBS_GROUP, job_group, tenant_group
from scheduler.tasks import run_cycle
from tests.portal.hint_helpers import HintListener

pytestmark = pytest.mark.django_db(transaction=True)

PULLING = "pulling registry.example.org/ml/pytorch:24.10: 312 of 1,024 MiB"
generations = itertools.count(1)


def placed_job(client: Any, **spec: Any) -> tuple[int, JobAttempt]:
    """A job submitted and placed on a100-node-1 (the only ready node), with no report yet."""
    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    Node.objects.filter(name="a100-node-1").update(state="ready")
    body = {"name": "pull-me", "vc": "vision", "flavor": "s-A100", "command": "sleep 600", **spec}
    job_id = client.post("/api/v1/jobs/", body, format="json").json()["id"]
    assert run_cycle()["started"] == 1
    return job_id, JobAttempt.objects.get(job_id=job_id)


def report(attempt: JobAttempt, replica: int, state: AttemptState, message: str = "", **extra: Any) -> bool:
    status = AttemptStatus(
        attempt_id=agent_attempt_id(attempt, replica),
        job_id=str(attempt.job_id),
        state=state,
        generation=next(generations),
        time=timezone.now(),
        message=message,
        **extra,
    )
    return record_attempt_status(Node.objects.get(name="a100-node-1"), status)


def test_the_job_detail_shows_each_replica_as_its_agent_reported_it(api_for: Any, paused_loop: Any) -> None:
    alice = api_for("alice")
    job_id, attempt = placed_job(alice, replicas=2)
    # Replica 1 reports first; replica 0 has not been heard of yet, yet it is listed, in order.
    assert report(attempt, 1, AttemptState.STARTING, PULLING)
    detail = alice.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["state"] == "starting"
    assert detail["attempts"][0]["replicas_status"] == [
        {"replica": 0, "node": "a100-node-1", "state": None, "message": "", "exit_code": None},
        {"replica": 1, "node": "a100-node-1", "state": "starting", "message": PULLING, "exit_code": None},
    ]

    # Running clears the message; an exit carries its code (the generation and the agent's exit
    # reason stay the portal's).
    assert report(attempt, 0, AttemptState.RUNNING)
    assert report(attempt, 1, AttemptState.EXITED, "", exit_code=3, reason=ExitReason.FAILED)
    replicas = alice.get(f"/api/v1/jobs/{job_id}/").json()["attempts"][0]["replicas_status"]
    assert [(r["state"], r["message"], r["exit_code"]) for r in replicas] == [
        ("running", "", None),
        ("exited", "", 3),
    ]
    assert all(set(r) == {"replica", "node", "state", "message", "exit_code"} for r in replicas)


def test_viewers_of_the_job_see_its_replicas_and_other_tenants_nothing(
    api_for: Any, paused_loop: Any
) -> None:
    """Like the rest of the job detail: its tenant's members and viewers, nobody else (the job
    answers another tenant exactly like a job that does not exist, tests/portal/test_tenant_isolation.py)."""
    job_id, attempt = placed_job(api_for("alice"))
    assert report(attempt, 0, AttemptState.STARTING, PULLING)
    for name in ("alice", "bob", "victor"):
        replicas = api_for(name).get(f"/api/v1/jobs/{job_id}/").json()["attempts"][0]["replicas_status"]
        assert replicas[0]["message"] == PULLING, name

    carol = api_for("carol")
    foreign = carol.get(f"/api/v1/jobs/{job_id}/")
    assert (foreign.status_code, foreign.json()) == (404, {"detail": f"No job {job_id}."})
    for path in ("/api/v1/jobs/", "/api/v1/nodes/", "/api/v1/nodes/a100-node-1/", "/api/v1/usage/"):
        answer = carol.get(path)
        assert answer.status_code == 200 and "pulling" not in answer.content.decode(), path


def test_a_changed_message_reaches_the_job_page_and_a_repeat_does_not(api_for: Any, paused_loop: Any) -> None:
    """An image pull reports its progress about once a second while the job stays starting: each
    new message is a hint on the job's topic only (job lists have nothing to redraw); a report that
    changes nothing a viewer sees, and a late one, publish nothing."""
    alice = api_for("alice")
    job_id, attempt = placed_job(alice)
    tenant_id = attempt.job.tenant_id
    job_topic = channel_for(job_group(job_id))
    topics = [job_topic, channel_for(tenant_group(tenant_id)), channel_for(ALL_JOBS_GROUP)]
    # The submission's and the placement's hints, and any still queued by earlier tests, are
    # dropped once subscribed.
    with HintListener(*topics) as listener:
        # The first report moves the job to starting: that move is told everywhere, once.
        assert report(attempt, 0, AttemptState.STARTING, "pulling registry.example.org/ml/pytorch:24.10")
        first = listener.hints()
        assert sorted(channel for channel, _ in first) == sorted(
            [job_topic, channel_for(tenant_group(tenant_id)), channel_for(ALL_JOBS_GROUP)]
        )
        assert all(hint["state"] == "starting" for _, hint in first)

        # Progress: the job does not move, its page hears of it.
        assert report(attempt, 0, AttemptState.STARTING, PULLING)
        progress = listener.hints()
        assert [channel for channel, _ in progress] == [job_topic]
        assert progress[0][1]["kind"] == "job" and progress[0][1]["job"] == job_id
        assert progress[0][1]["state"] == "starting"

        # The same message again (a new generation, as after an agent's reconnect): nothing.
        assert report(attempt, 0, AttemptState.STARTING, PULLING)
        assert listener.hints() == []
        # A late report (an older generation) is refused and publishes nothing either.
        late = AttemptStatus(
            attempt_id=agent_attempt_id(attempt, 0),
            job_id=str(job_id),
            state=AttemptState.STARTING,
            generation=0,
            time=timezone.now(),
            message="pulling registry.example.org/ml/pytorch:24.10: 1 of 1,024 MiB",
        )
        assert not record_attempt_status(Node.objects.get(name="a100-node-1"), late)
        assert listener.hints() == []

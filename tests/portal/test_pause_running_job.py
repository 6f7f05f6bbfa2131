"""Holding a job that holds GPUs (Determined's pause): a running job with checkpointing is asked
to checkpoint and stop, as a preemption would, and comes back pending and held, its GPUs free
for others, until it is released; it then resumes from its checkpoint. Without checkpointing
it is refused, since its work would be lost. A scheduled or starting job is stopped and held at
once; one already checkpointing is held once it has stopped."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from agents.protocol import CheckpointDone, CheckpointRequest, ExitReason, decode
from portal.accounts.models import AuditEntry
from portal.agentgw.desired import agent_attempt_id, desired_set_for
from portal.cluster.models import Node
from portal.jobs import services
from portal.jobs.choices import AttemptState, JobState
from portal.jobs.models import Allocation, Job, JobAttempt
from scheduler import core, store
from scheduler.tasks import run_cycle
from tests.integration.scripted_agents import ScriptedAgents

pytestmark = pytest.mark.django_db(transaction=True)

CHECKPOINT = {"enabled": True, "grace_seconds": 45}
PAUSED = "Paused by alice: resumes from its checkpoint when released"


@pytest.fixture
def node(paused_loop: Any) -> Node:
    """a100-node-1, the only node jobs are placed on."""
    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    Node.objects.filter(name="a100-node-1").update(state="ready")
    return Node.objects.get(name="a100-node-1")


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, Any]]:
    """The requests sent to agents (node id, message), as the scheduler's preemption sends them."""
    requests: list[tuple[int, Any]] = []
    monkeypatch.setattr(store, "send_request", lambda node_id, text: requests.append((node_id, decode(text))))
    return requests


def submit(api_for: Any, user: str = "alice", **spec: Any) -> Job:
    """A whole A100 node's job of `user`'s, so that no other job fits beside it."""
    body = {"name": "train", "vc": "vision", "flavor": "l-A100", "command": "sleep 600", **spec}
    response = api_for(user).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return Job.objects.get(pk=response.json()["id"])


def running(api_for: Any, agents: ScriptedAgents, **spec: Any) -> Job:
    job = submit(api_for, **spec)
    assert run_cycle()["started"] == 1
    agents.converge()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def checkpoint_at(node: Node, job: Job, step: int) -> None:
    """The agent reports a committed checkpoint of the job's current attempt."""
    manifest = f"step-{step}/manifest.json"
    services.record_checkpoint(
        node,
        CheckpointDone(
            attempt_id=agent_attempt_id(job.current_attempt(), 0),
            path=f"step-{step}",
            size_bytes=1024,
            step=step,
            time=timezone.now(),
            manifest_path=manifest,
            manifest_sha256=hashlib.sha256(manifest.encode()).hexdigest(),
        ),
    )


def its_turn_is_up(job: Job) -> core.Suspend:
    return core.Suspend(core.JobId(str(job.pk)), core.JobId(""), "its turn is up", 1.0)


def hold(job: Job, user: Any) -> Job:
    services.hold_job(job, user)
    job.refresh_from_db()
    return job


def release(job: Job, user: Any) -> Job:
    services.release_job(job, user)
    job.refresh_from_db()
    return job


def test_a_paused_job_checkpoints_waits_held_and_resumes_from_its_checkpoint(
    api_for: Any, users: dict[str, Any], node: Node, sent: list[tuple[int, Any]]
) -> None:
    agents = ScriptedAgents()
    job = running(api_for, agents, checkpoint=CHECKPOINT)
    first = job.current_attempt()
    colleague = submit(api_for, "bob")
    assert run_cycle()["started"] == 0  # the node is alice's

    job = hold(job, users["alice"])
    assert (job.state, job.on_hold, job.pending_reason, job.pending_message) == (
        JobState.CHECKPOINTING,
        True,
        "held",
        PAUSED,
    )
    # The preemption's path: a checkpoint request within the job's own grace, and the desired
    # set says checkpoint_and_stop.
    requests = [(node_id, type(m), m.attempt_id, m.grace_period_s) for node_id, m in sent]
    assert requests == [(node.pk, CheckpointRequest, agent_attempt_id(first, 0), 45.0)]
    (desired,) = desired_set_for(node).attempts
    assert desired.checkpoint_and_stop
    event = job.events.get(to_state=JobState.CHECKPOINTING)
    assert (event.actor, event.actor_label, event.data) == (users["alice"], "alice", {"preemption": "pause"})
    assert AuditEntry.objects.filter(
        action="job.hold", object_id=str(job.pk), detail="held while running"
    ).exists()

    checkpoint_at(node, job, 300)
    agents.converge()  # the replica checkpointed and exited
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_reason, job.pending_message) == (
        JobState.PENDING,
        True,
        "held",
        PAUSED,
    )
    assert JobAttempt.objects.get(pk=first.pk).state == AttemptState.STOPPED
    assert not Allocation.objects.filter(attempt=first, released_at__isnull=True).exists()
    requeued = job.events.get(to_state=JobState.PENDING, from_state=JobState.PREEMPTED)
    assert requeued.reason == "requeued after it was paused; held until released"

    # Its GPUs go to the colleague's job; the paused one is not ranked while held.
    assert run_cycle()["started"] == 1
    colleague.refresh_from_db()
    assert colleague.state == JobState.SCHEDULED
    job.refresh_from_db()
    assert (job.state, job.pending_reason, job.pending_message) == (JobState.PENDING, "held", PAUSED)
    agents.converge()
    agents.end(colleague, ExitReason.SUCCEEDED, 0)

    job = release(job, users["alice"])
    assert (job.on_hold, job.stop_reason, job.pending_reason) == (False, "", "new")
    assert job.events.filter(reason="released: it may start again, from its checkpoint at step 300").exists()
    assert AuditEntry.objects.filter(action="job.release", object_id=str(job.pk)).exists()
    assert run_cycle()["started"] == 1
    second = job.current_attempt()
    assert second.number == 2 and second.resume and second.resume_from.step == 300
    (desired,) = desired_set_for(node).attempts
    assert desired.resume and desired.resume_from is not None and desired.resume_from.step == 300
    assert not desired.checkpoint_and_stop


def test_a_running_job_without_checkpointing_is_not_paused(
    api_for: Any, users: dict[str, Any], node: Node, sent: list[tuple[int, Any]]
) -> None:
    job = running(api_for, ScriptedAgents())
    version = job.version
    with pytest.raises(services.InvalidTransition) as refused:
        services.hold_job(job, users["alice"])
    assert str(refused.value) == (
        f"Job {job.pk} has no checkpointing; pausing it would lose its work. "
        "Cancel it or resubmit with checkpoint.enabled"
    )
    job.refresh_from_db()
    assert (job.state, job.version, job.on_hold, job.pending_reason) == (JobState.RUNNING, version, False, "")
    assert sent == []
    assert not AuditEntry.objects.filter(action="job.hold").exists()


def test_a_job_stopping_at_its_time_limit_is_not_paused(
    api_for: Any, users: dict[str, Any], node: Node
) -> None:
    job = running(api_for, ScriptedAgents(), checkpoint=CHECKPOINT)
    Job.objects.filter(pk=job.pk).update(stop_reason="time-limit")
    with pytest.raises(services.InvalidTransition, match="being stopped"):
        services.hold_job(job, users["alice"])
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_paused_job_is_not_paused_twice(api_for: Any, users: dict[str, Any], node: Node) -> None:
    job = hold(running(api_for, ScriptedAgents(), checkpoint=CHECKPOINT), users["alice"])
    with pytest.raises(services.InvalidTransition, match=f"Job {job.pk} is already held"):
        services.hold_job(job, users["alice"])


@pytest.mark.parametrize("state", [JobState.SCHEDULED, JobState.STARTING])
def test_a_scheduled_or_starting_job_is_stopped_and_held_at_once(
    api_for: Any, users: dict[str, Any], node: Node, state: str
) -> None:
    job = submit(api_for)
    assert run_cycle()["started"] == 1
    job.refresh_from_db()
    if state == JobState.STARTING:
        assert services.transition_job(job, JobState.STARTING, label="test")
    attempt = job.current_attempt()

    job = hold(job, users["alice"])
    assert (job.state, job.on_hold, job.pending_reason, job.pending_message) == (
        JobState.PENDING,
        True,
        "held",
        "Held by alice: it does not start until released.",
    )
    assert not services.is_paused(job)
    assert JobAttempt.objects.get(pk=attempt.pk).state == AttemptState.STOPPED
    assert desired_set_for(node).attempts == []  # the agent stops it
    assert job.events.filter(
        from_state=state,
        to_state=JobState.PENDING,
        reason=f"held while {state}: stopped; it does not start until released",
    ).exists()
    assert run_cycle()["started"] == 0

    release(job, users["alice"])
    assert run_cycle()["started"] == 1
    assert Job.objects.get(pk=job.pk).current_attempt().number == 2


@pytest.mark.parametrize("checkpointable", [True, False])
def test_a_preempted_job_held_while_it_stops_comes_back_held(
    api_for: Any, users: dict[str, Any], node: Node, checkpointable: bool
) -> None:
    agents = ScriptedAgents()
    job = running(api_for, agents, **({"checkpoint": CHECKPOINT} if checkpointable else {}))
    now = time.time()
    with transaction.atomic():
        loaded = store.load_snapshot(now)
        preemption = core.Preemption(core.JobId(str(job.pk)), "priority", "preempted", 30.0, core.JobId(""))
        assert store.apply_plan(core.Plan(preemptions=(preemption,)), loaded, now)["preempted"] == 1

    job = hold(job, users["alice"])
    message = PAUSED if checkpointable else "Held by alice: it does not start until released."
    assert (job.state, job.on_hold, job.pending_message) == (JobState.CHECKPOINTING, True, message)
    assert services.is_paused(job) is checkpointable
    if checkpointable:
        checkpoint_at(node, job, 120)
    agents.converge()
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_reason, job.pending_message) == (
        JobState.PENDING,
        True,
        "held",
        message,
    )
    assert run_cycle()["started"] == 0


def test_a_suspended_job_is_paused_from_where_it_was_parked(
    api_for: Any, users: dict[str, Any], node: Node, sent: list[tuple[int, Any]]
) -> None:
    agents = ScriptedAgents()
    job = running(api_for, agents, checkpoint=CHECKPOINT, time_sliceable=True)
    assert store.suspend_job(
        job, core.Suspend(core.JobId(str(job.pk)), core.JobId(""), "its turn is up", 1.0)
    )
    job.refresh_from_db()
    assert job.state == JobState.SUSPENDED

    job = hold(job, users["alice"])
    assert (job.state, job.pending_message) == (JobState.CHECKPOINTING, PAUSED)
    assert [type(message) for _, message in sent] == [CheckpointRequest]
    (desired,) = desired_set_for(node).attempts
    assert desired.checkpoint_and_stop and desired.run_state == "running"
    agents.converge()
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_reason) == (JobState.PENDING, True, "held")


def test_a_suspended_job_without_checkpointing_is_not_paused(
    api_for: Any, users: dict[str, Any], node: Node
) -> None:
    job = running(api_for, ScriptedAgents(), time_sliceable=True)
    assert store.suspend_job(
        job, core.Suspend(core.JobId(str(job.pk)), core.JobId(""), "its turn is up", 1.0)
    )
    with pytest.raises(services.InvalidTransition, match="has no checkpointing"):
        services.hold_job(job, users["alice"])
    assert Job.objects.get(pk=job.pk).state == JobState.SUSPENDED


def test_a_pause_released_before_the_job_stopped_requeues_it_as_a_preemption(
    api_for: Any, users: dict[str, Any], node: Node
) -> None:
    agents = ScriptedAgents()
    job = hold(running(api_for, agents, checkpoint=CHECKPOINT), users["alice"])
    job = release(job, users["alice"])
    assert (job.state, job.on_hold, job.stop_reason, job.pending_message) == (
        JobState.CHECKPOINTING,
        False,
        "",
        "",
    )
    assert job.events.filter(reason="released before it stopped: it is requeued once it has").exists()
    checkpoint_at(node, job, 50)
    agents.converge()
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_reason) == (JobState.PENDING, False, "requeued")
    assert run_cycle()["started"] == 1
    assert Job.objects.get(pk=job.pk).current_attempt().resume_from.step == 50


def test_a_pause_that_saved_no_checkpoint_says_the_job_starts_over(
    api_for: Any, users: dict[str, Any], node: Node
) -> None:
    agents = ScriptedAgents()
    job = hold(running(api_for, agents, checkpoint=CHECKPOINT), users["alice"])
    agents.converge()  # it stopped without a committed checkpoint
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_message) == (
        JobState.PENDING,
        True,
        "Paused by alice: it saved no checkpoint, so it starts over when released",
    )
    assert job.events.filter(reason__startswith="checkpoint failed (pause)").exists()
    job = release(job, users["alice"])
    assert job.events.filter(reason="released: it may start again, from the start").exists()


@pytest.mark.parametrize("paused_while", ["running", "stopping"])
def test_who_paused_the_job_is_told_from_its_events_not_from_the_message(
    api_for: Any, users: dict[str, Any], node: Node, paused_while: str
) -> None:
    """The hold message is worded for people: a row that says it otherwise (worded by an
    earlier portal) still names who paused the job once it is known to start over."""
    agents = ScriptedAgents()
    job = running(api_for, agents, checkpoint=CHECKPOINT)
    if paused_while == "stopping":  # already checkpointing for a preemption when it is held
        with transaction.atomic():
            now = time.time()
            preemption = core.Preemption(
                core.JobId(str(job.pk)), "priority", "preempted", 30.0, core.JobId("")
            )
            loaded = store.load_snapshot(now)
            assert store.apply_plan(core.Plan(preemptions=(preemption,)), loaded, now)["preempted"] == 1
    job = hold(job, users["vision-admin"])
    assert services.is_paused(job)
    Job.objects.filter(pk=job.pk).update(pending_message="Pausiert von vision-admin: macht weiter")
    agents.converge()  # it stopped without a committed checkpoint
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_message) == (
        JobState.PENDING,
        True,
        "Paused by vision-admin: it saved no checkpoint, so it starts over when released",
    )


def test_a_paused_job_whose_node_is_lost_stays_held(api_for: Any, users: dict[str, Any], node: Node) -> None:
    job = hold(running(api_for, ScriptedAgents(), checkpoint=CHECKPOINT), users["alice"])
    assert services.requeue_jobs_of_lost_node(node) == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_reason) == (JobState.PENDING, True, "held")
    assert run_cycle()["started"] == 0


def test_a_hold_made_while_a_cycle_decides_keeps_that_cycle_from_starting_the_job(
    api_for: Any, users: Any, node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cycle reads the job pending, the owner holds it (committed in another connection),
    then the cycle applies its plan: the start is not made, since the job changed."""
    import threading

    from django.db import connections

    job = submit(api_for, checkpoint={"enabled": True})
    decide = core.decide

    def decide_then_hold(*args: Any, **kwargs: Any) -> Any:
        plan = decide(*args, **kwargs)

        def hold() -> None:
            try:
                services.hold_job(Job.objects.get(pk=job.pk), users["alice"])
            finally:
                connections.close_all()

        holder = threading.Thread(target=hold)
        holder.start()
        holder.join()
        return plan

    monkeypatch.setattr(core, "decide", decide_then_hold)
    run_cycle()
    job.refresh_from_db()
    assert (job.state, job.on_hold, job.pending_reason) == (JobState.PENDING, True, "held")


def preempted(job: Job) -> Job:
    """The scheduler preempts the running job: it checkpoints and stops, then queues again."""
    now = time.time()
    with transaction.atomic():
        loaded = store.load_snapshot(now)
        preemption = core.Preemption(core.JobId(str(job.pk)), "priority", "preempted", 30.0, core.JobId(""))
        assert store.apply_plan(core.Plan(preemptions=(preemption,)), loaded, now)["preempted"] == 1
    job.refresh_from_db()
    return job


@pytest.mark.parametrize("stopped_by", ["preemption", "pause"])
def test_a_job_that_finishes_while_it_is_being_stopped_succeeds_and_is_not_run_again(
    api_for: Any, users: dict[str, Any], node: Node, stopped_by: str
) -> None:
    """Its command exited 0 on its own before the agent acted on the checkpoint request (the
    agent then reports 'succeeded'; once it acts, every exit is 'stopped' or 'checkpointed').
    It used to be requeued as preempted and run again from its last checkpoint."""
    agents = ScriptedAgents()
    job = running(api_for, agents, checkpoint=CHECKPOINT)
    job = preempted(job) if stopped_by == "preemption" else hold(job, users["alice"])
    assert job.state == JobState.CHECKPOINTING

    agents.end(job, ExitReason.SUCCEEDED, 0)
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.on_hold) == (JobState.SUCCEEDED, 0, False)
    assert job.events.filter(from_state=JobState.CHECKPOINTING, to_state=JobState.SUCCEEDED).exists()
    assert not job.events.filter(to_state=JobState.PREEMPTED).exists()
    assert JobAttempt.objects.get(job=job).state == AttemptState.SUCCEEDED
    assert not Allocation.objects.filter(attempt__job=job, released_at__isnull=True).exists()
    assert run_cycle()["started"] == 0 and job.attempts.count() == 1
    with pytest.raises(services.InvalidTransition, match="has already ended"):
        services.release_job(job, users["alice"])


@pytest.mark.parametrize("stopped_by", ["preemption", "pause"])
def test_a_job_that_fails_on_its_own_while_it_is_being_stopped_counts_the_failure(
    api_for: Any, users: dict[str, Any], node: Node, stopped_by: str
) -> None:
    """A failure of its own, like a success, is no preemption: it takes a retry (a paused job
    still waits held for its release), instead of being rerun for free as preempted."""
    agents = ScriptedAgents()
    job = running(api_for, agents, checkpoint=CHECKPOINT, retries={"limit": 1, "backoff_seconds": 60})
    job = preempted(job) if stopped_by == "preemption" else hold(job, users["alice"])

    agents.end(job, ExitReason.FAILED, 3)
    job.refresh_from_db()
    assert (job.state, job.retries_left) == (JobState.PENDING, 0)
    assert job.pending_reason == ("backoff" if stopped_by == "preemption" else "held")
    assert job.on_hold is (stopped_by == "pause")
    retried = job.events.get(from_state=JobState.CHECKPOINTING)
    assert (retried.to_state, retried.reason) == (
        JobState.PENDING,
        "replica on a100-node-1 exited with code 3; retry 1 of 1 in 60 s",
    )
    assert JobAttempt.objects.get(job=job).state == AttemptState.FAILED

    # Its last attempt fails the same way: the job fails.
    if stopped_by == "pause":
        job = release(job, users["alice"])
    Job.objects.filter(pk=job.pk).update(not_before=None)
    assert run_cycle()["started"] == 1
    agents.converge()
    job = preempted(Job.objects.get(pk=job.pk))
    agents.end(job, ExitReason.FAILED, 3)
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.on_hold) == (JobState.FAILED, 3, False)


def test_a_pause_with_a_long_grace_is_not_ended_before_that_grace(
    api_for: Any, users: dict[str, Any], node: Node, sent: list[Any]
) -> None:
    """The sweep that ends stops no agent confirmed allows the grace the agent was given: a pause
    gives the job's own (here ten minutes), longer than the profile's 30 s."""
    from datetime import timedelta

    job = hold(
        running(api_for, ScriptedAgents(), checkpoint={"enabled": True, "grace_seconds": 600}), users["alice"]
    )
    assert job.state == JobState.CHECKPOINTING
    (request,) = [message for _, message in sent]
    assert request.grace_period_s == 600.0
    asked = timezone.now()
    assert store.end_overdue_stops(asked + timedelta(seconds=300), 120, 30.0) == []
    assert Allocation.objects.filter(attempt__job=job, released_at__isnull=True).exists()
    assert store.end_overdue_stops(asked + timedelta(seconds=600 + 120 + 5), 120, 30.0) == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.on_hold) == (JobState.PENDING, True)

"""A preempted job's events name the job it was preempted for only when that job is of its own
tenant: nobody learns that another tenant's job exists. A stop ends: one without a checkpoint is
in the desired set (the attempt leaves it), and one the agents never confirm is ended by beat.
A job already told to stop is not preempted again."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agents.protocol import AttemptState, AttemptStatus, ExitReason
from agents.reconcile import LocalAttempt, Stop, reconcile
from portal.agentgw.desired import agent_attempt_id, desired_set_for
from portal.cluster.models import Node
from portal.cluster.services import set_node_state
from portal.jobs.models import Allocation, Job, JobAttempt
from portal.jobs.services import enforce_time_limits, record_attempt_status, transition_job
from scheduler import core
from scheduler.store import apply_plan, end_overdue_stops, load_snapshot
from scheduler.tasks import CYCLE_LOCK, load_profile, run_cycle, schedule_cycle
from tests.portal.store_helpers import placed_attempt, run

pytestmark = pytest.mark.django_db(transaction=True)
generations = itertools.count(1)


def report(node: Node, attempt: JobAttempt, state: AttemptState, reason: ExitReason | None = None) -> None:
    """Replica 0's report, as its agent would send it."""
    record_attempt_status(
        node,
        AttemptStatus(
            attempt_id=agent_attempt_id(attempt, 0),
            job_id=str(attempt.job_id),
            state=state,
            generation=next(generations),
            time=timezone.now(),
            reason=reason,
        ),
    )


def drained(api_for: Any, **spec: Any) -> tuple[Node, JobAttempt]:
    """A running one-GPU job on a node an admin drains: the cycle tells it to stop."""
    node, attempt = placed_attempt(api_for)
    if spec:
        Job.objects.filter(pk=attempt.job_id).update(spec={**Job.objects.get(pk=attempt.job_id).spec, **spec})
    run(attempt.job_id)
    set_node_state(node, "drain", None)
    assert run_cycle()["preempted"] == 1
    assert Job.objects.get(pk=attempt.job_id).state == "checkpointing"
    return node, attempt


def submit(client: Any, name: str, vc: str) -> int:
    body = {"name": name, "vc": vc, "flavor": "s-A100", "command": "sleep 600"}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


CASES = [("bob", "vision", True), ("carol", "speech", False)]


@pytest.mark.parametrize(("user", "vc", "named"), CASES)
def test_the_preemptor_is_named_only_within_the_tenant(api_for, paused_loop, user, vc, named) -> None:  # type: ignore[no-untyped-def]
    Node.objects.update(state="ready")
    victim = submit(api_for("alice"), "victim", "vision")
    run_cycle(load_profile())
    assert transition_job(Job.objects.get(pk=victim), "running", label="test")
    preemptor = submit(api_for(user), "preemptor", vc)
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        preemption = core.Preemption(
            core.JobId(str(victim)), "priority", "preempted", 30.0, core.JobId(str(preemptor))
        )
        assert apply_plan(core.Plan(preemptions=(preemption,)), loaded, now)["preempted"] == 1
    shown = api_for("alice").get(f"/api/v1/jobs/{victim}/events/").json()["results"]
    (event,) = [e for e in shown if e["to_state"] == "checkpointing"]
    assert event["data"]["preemption"] == "priority"
    assert event["data"].get("for_job") == (str(preemptor) if named else None)


def test_a_stop_without_a_checkpoint_is_in_the_desired_set(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """The one-shot StopRequest may reach no socket: the desired set leaves the attempt out, which
    an agent that reconnects reads as "stop it", so the job ends preempted and is requeued."""
    node, attempt = drained(api_for)  # s-A100, no checkpoint in the spec
    assert desired_set_for(node).attempts == []
    actions = reconcile([], [LocalAttempt(agent_attempt_id(attempt, 0), AttemptState.RUNNING, 30.0)])
    assert actions == [Stop(agent_attempt_id(attempt, 0), 30.0)]
    report(node, attempt, AttemptState.EXITED, ExitReason.STOPPED)
    assert Job.objects.get(pk=attempt.job_id).state == "pending"
    assert not Allocation.objects.filter(attempt=attempt, released_at__isnull=True).exists()


def test_a_checkpointing_job_stays_in_the_desired_set_with_checkpoint_and_stop(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    node, attempt = drained(api_for, checkpoint={"enabled": True, "grace_seconds": 20})
    [desired] = desired_set_for(node).attempts
    assert desired.attempt_id == agent_attempt_id(attempt, 0) and desired.checkpoint_and_stop


@pytest.mark.parametrize("checkpoint", [None, {"enabled": True, "grace_seconds": 20}])
def test_a_stop_the_agents_never_confirm_ends_after_its_grace_and_the_force_delay(
    api_for, paused_loop, checkpoint
) -> None:  # type: ignore[no-untyped-def]
    node, attempt = drained(api_for, **({"checkpoint": checkpoint} if checkpoint else {}))
    job_id = attempt.job_id
    asked = Job.objects.get(pk=job_id).events.get(to_state="checkpointing")
    profile_grace = load_profile().cycle.grace_period_s
    # The grace the stop was asked with, recorded with it: the job's own, capped by the profile's
    # (without checkpointing the spec's default of 120 s, so the profile's 30 s).
    grace = 20.0 if checkpoint else profile_grace
    assert Job.objects.get(pk=job_id).stop_grace_s == grace
    deadline = asked.created_at + timedelta(seconds=grace + 120)

    assert end_overdue_stops(deadline - timedelta(seconds=1), 120, profile_grace) == []
    assert Job.objects.get(pk=job_id).state == "checkpointing"
    assert end_overdue_stops(deadline, 120, profile_grace) == [job_id]

    job = Job.objects.get(pk=job_id)
    assert job.state == "pending" and job.pending_reason == "requeued"
    moves = list(job.events.exclude(to_state="").order_by("pk").values_list("to_state", "reason"))
    assert moves[-2:] == [
        ("preempted", f"the agents did not confirm the stop within {grace:g} + 120 s"),
        (
            "pending",
            f"requeued after its node was drained: it starts again elsewhere (the agents did not "
            f"confirm the stop within {grace:g} + 120 s)",
        ),
    ]
    assert job.events.filter(data__checkpoint="failed").exists() == bool(checkpoint)
    ended = JobAttempt.objects.get(pk=attempt.pk)
    assert ended.state == "stopped" and ended.ended_at is not None
    assert not Allocation.objects.filter(attempt=attempt, released_at__isnull=True).exists()
    assert end_overdue_stops(deadline + timedelta(hours=1), 120, profile_grace) == []  # once
    # The agent that never answered is told to stop: the attempt is in no desired set.
    assert desired_set_for(node).attempts == []


def test_a_job_stopped_at_its_time_limit_is_not_preempted_again(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    node, attempt = placed_attempt(api_for)
    job_id = attempt.job_id
    run(job_id)
    limit = Job.objects.get(pk=job_id).time_limit_s
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now() - timedelta(seconds=limit + 1))
    assert enforce_time_limits(timezone.now(), 300, 120)["stopping"] == 1
    [seen] = [r for r in load_snapshot(time.time()).snapshot.running if r.id == str(job_id)]
    assert seen.stopping
    set_node_state(node, "drain", None)
    assert run_cycle()["preempted"] == 0  # told to stop already
    assert Job.objects.get(pk=job_id).state == "running"
    report(node, attempt, AttemptState.EXITED, ExitReason.STOPPED)
    assert Job.objects.get(pk=job_id).state == "timed-out"


def test_a_cycle_that_read_the_job_before_its_time_limit_stop_does_not_preempt_it(
    api_for, paused_loop
) -> None:  # type: ignore[no-untyped-def]
    """The stop at the limit moves the job's version, so a plan made from a snapshot read just
    before it cannot preempt the job as well (its requeue would have cleared the stop)."""
    from django.db import transaction

    from scheduler import core
    from scheduler.store import apply_plan
    from scheduler.tasks import load_profile

    node, attempt = placed_attempt(api_for)
    job_id = attempt.job_id
    run(job_id)
    limit = Job.objects.get(pk=job_id).time_limit_s
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now() - timedelta(seconds=limit + 1))
    now = time.time()
    loaded = load_snapshot(now)  # read before the stop
    set_node_state(node, "drain", None)
    plan = core.decide(load_snapshot(now).snapshot, load_profile(), now)
    assert [p.job_id for p in plan.preemptions] == [str(job_id)]
    assert enforce_time_limits(timezone.now(), 300, 120)["stopping"] == 1
    with transaction.atomic():
        assert apply_plan(plan, loaded, now)["preempted"] == 0
    report(node, attempt, AttemptState.EXITED, ExitReason.STOPPED)
    assert Job.objects.get(pk=job_id).state == "timed-out"


def test_beats_cycle_expires_and_never_waits_for_one_in_progress(paused_loop, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Beat's safety-net cycles used to queue behind a slow cycle, one more every 5 s, each
    holding a worker. Beat's entry now expires within its period and its cycle returns at once
    while another holds the lock; a requested cycle still waits, so it sees its change."""
    entry = settings.CELERY_BEAT_SCHEDULE["schedule-cycle"]
    assert entry["kwargs"] == {"from_beat": True}
    assert 0 < entry["options"]["expires"] <= entry["schedule"]
    monkeypatch.setattr("scheduler.tasks.loop_paused", lambda: False)  # this process only
    holder = connection.get_new_connection(connection.get_connection_params())
    try:
        holder.autocommit = True
        holder.cursor().execute("SELECT pg_advisory_lock(%s)", [CYCLE_LOCK])  # a slow cycle runs
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # should it wait, it fails instead of hanging
        started = time.monotonic()
        assert schedule_cycle(from_beat=True) is None
        assert time.monotonic() - started < 2
        waited: list[Any] = []

        def requested() -> None:
            try:
                waited.append(schedule_cycle())
            finally:
                connection.close()

        thread = threading.Thread(target=requested)
        thread.start()
        thread.join(timeout=1)
        assert thread.is_alive()  # a requested cycle waits for the lock
        holder.cursor().execute("SELECT pg_advisory_unlock(%s)", [CYCLE_LOCK])
        thread.join(timeout=30)
        assert waited and waited[0]["started"] == 0
    finally:
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert schedule_cycle(from_beat=True)["started"] == 0  # with the lock free, it runs

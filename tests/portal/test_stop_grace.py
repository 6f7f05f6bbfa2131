"""One grace per stop: the grace a stop is asked with is recorded with the ask, and the request,
the desired set and the sweeps that end a stop no agent confirmed all read that record. An
agent that missed the request (it was not connected) stops the job from the desired set, so the
two must not disagree; and while the job runs, the desired set gives what a preemption would."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from agents.protocol import CheckpointRequest, StopRequest, decode
from portal.agentgw import outbox
from portal.agentgw.desired import desired_set_for
from portal.cluster.models import Node
from portal.jobs import services
from portal.jobs.choices import JobState
from portal.jobs.models import Job, JobAttempt
from scheduler import core, store
from scheduler.core.profile import PROFILES_DIR
from tests.portal.store_helpers import placed_attempt, run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The requests sent to agents, by the scheduler's preemption and by the time-limit check."""
    requests: list[Any] = []
    monkeypatch.setattr(store, "send_request", lambda node_id, text: requests.append(decode(text)))
    monkeypatch.setattr(outbox, "send_request", lambda node_id, text: requests.append(decode(text)))
    return requests


@pytest.fixture
def profile_grace_90(settings: Any, tmp_path: Path) -> float:
    """The portal's scheduler profile, with a 90 s grace for preemptions."""
    profile = json.loads((PROFILES_DIR / "default.json").read_text())
    profile["cycle"]["grace_period_s"] = 90
    path = tmp_path / "grace-90.json"
    path.write_text(json.dumps(profile))
    settings.SCHEDULER_PROFILE = str(path)
    return 90.0


def running(api_for: Any, checkpoint: dict[str, Any] | None) -> tuple[Node, Job]:
    """A running job of alice's on a100-node-1 with `checkpoint` as its spec's (None: a spec
    without one, so the job has no grace of its own)."""
    node, attempt = placed_attempt(api_for)
    job = Job.objects.get(pk=attempt.job_id)
    spec = {key: value for key, value in job.spec.items() if key != "checkpoint"}
    Job.objects.filter(pk=job.pk).update(spec={**spec, **({"checkpoint": checkpoint} if checkpoint else {})})
    run(job.pk)
    return node, Job.objects.get(pk=job.pk)


def preempt(job: Job, grace_s: float) -> None:
    preemption = core.Preemption(core.JobId(str(job.pk)), "priority", "preempted", grace_s, core.JobId(""))
    with transaction.atomic():
        assert store.preempt_job(job, preemption)


def desired_grace(node: Node) -> float:
    (desired,) = desired_set_for(node).attempts
    return desired.grace_period_s


@pytest.mark.parametrize(
    ("checkpoint", "grace"),
    [
        pytest.param({"enabled": True}, 90.0, id="no-grace-of-its-own"),
        pytest.param({"enabled": True, "grace_seconds": 300}, 90.0, id="its-own-capped"),
        pytest.param({"enabled": True, "grace_seconds": 20}, 20.0, id="its-own-shorter"),
    ],
)
def test_a_preemption_and_the_desired_set_give_the_same_grace(
    api_for: Any, paused_loop: Any, sent: list[Any], profile_grace_90: float, checkpoint: Any, grace: float
) -> None:
    node, job = running(api_for, checkpoint)
    # Running: what a preemption would give it, for a stop its agent makes from the set alone.
    assert desired_grace(node) == grace

    preempt(job, profile_grace_90)
    (request,) = sent
    assert isinstance(request, CheckpointRequest) and request.grace_period_s == grace
    assert Job.objects.get(pk=job.pk).stop_grace_s == grace
    (desired,) = desired_set_for(node).attempts
    assert desired.checkpoint_and_stop and desired.grace_period_s == grace


@pytest.mark.parametrize(
    ("checkpoint", "grace"),
    [
        pytest.param({"enabled": True}, 120.0, id="no-grace-of-its-own"),
        pytest.param({"enabled": True, "grace_seconds": 600}, 600.0, id="its-own"),
    ],
)
def test_a_pause_and_the_desired_set_give_the_pauses_grace(
    api_for: Any,
    users: dict[str, Any],
    paused_loop: Any,
    sent: list[Any],
    profile_grace_90: float,
    checkpoint: Any,
    grace: float,
) -> None:
    """A pause gives the job its own grace (else 120 s), not capped by the profile's."""
    node, job = running(api_for, checkpoint)
    assert desired_grace(node) == 90.0

    services.hold_job(job, users["alice"])
    (request,) = sent
    assert request.grace_period_s == grace
    assert Job.objects.get(pk=job.pk).state == JobState.CHECKPOINTING
    assert desired_grace(node) == grace


@pytest.mark.parametrize(
    ("ask", "grace"),
    [
        # The profile (30 s) caps the job's own 300 s: not ended after 30 + 120 s.
        pytest.param("preempt", 30.0, id="preemption"),
        # A pause of a job without its own grace gives 120 s: not ended after the profile's 30 s.
        pytest.param("pause", 120.0, id="pause"),
    ],
)
def test_an_unconfirmed_stop_is_ended_after_the_grace_it_was_asked_with(
    api_for: Any, users: dict[str, Any], paused_loop: Any, sent: list[Any], ask: str, grace: float
) -> None:
    own = {"grace_seconds": 300} if ask == "preempt" else {}
    _, job = running(api_for, {"enabled": True, **own})
    if ask == "preempt":
        preempt(job, 30.0)
    else:
        services.hold_job(job, users["alice"])
    (request,) = sent
    assert request.grace_period_s == grace
    asked = Job.objects.get(pk=job.pk).events.get(to_state=JobState.CHECKPOINTING).created_at
    deadline = asked + timedelta(seconds=grace + 120)

    assert store.end_overdue_stops(deadline - timedelta(seconds=1), 120, 30.0) == []
    assert store.end_overdue_stops(deadline, 120, 30.0) == [job.pk]
    moved = Job.objects.get(pk=job.pk).events.get(to_state=JobState.PREEMPTED)
    assert moved.reason == f"the agents did not confirm the stop within {grace:g} + 120 s"


def test_a_stop_asked_before_its_grace_was_recorded_waits_the_longest_grace_given_then(
    api_for: Any, paused_loop: Any, sent: list[Any]
) -> None:
    _, job = running(api_for, {"enabled": True, "grace_seconds": 300})
    preempt(job, 30.0)
    Job.objects.filter(pk=job.pk).update(stop_grace_s=None)
    asked = Job.objects.get(pk=job.pk).events.get(to_state=JobState.CHECKPOINTING).created_at

    assert store.end_overdue_stops(asked + timedelta(seconds=300 + 119), 120, 30.0) == []
    assert store.end_overdue_stops(asked + timedelta(seconds=300 + 120), 120, 30.0) == [job.pk]


def test_a_time_limit_stop_records_its_grace_and_is_forced_only_after_it(
    api_for: Any, paused_loop: Any, sent: list[Any]
) -> None:
    node, job = running(api_for, {"enabled": True, "grace_seconds": 600})
    assert desired_grace(node) == 30.0  # what a preemption would give it
    attempt = job.current_attempt()
    started = timezone.now() - timedelta(seconds=job.time_limit_s + 1)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=started)
    limit = started + timedelta(seconds=job.time_limit_s)

    assert services.enforce_time_limits(timezone.now(), 300, 120)["stopping"] == 1
    (request,) = sent
    assert isinstance(request, StopRequest) and request.grace_period_s == 600.0
    job = Job.objects.get(pk=job.pk)
    assert (job.stop_reason, job.stop_grace_s) == ("time-limit", 600.0)
    assert desired_grace(node) == 600.0

    # The agents have its whole grace, and the margin, before the portal ends it anyway.
    assert services.enforce_time_limits(limit + timedelta(seconds=600 + 119), 300, 120)["forced"] == 0
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert services.enforce_time_limits(limit + timedelta(seconds=600 + 121), 300, 120)["forced"] == 1
    assert Job.objects.get(pk=job.pk).state == JobState.TIMED_OUT

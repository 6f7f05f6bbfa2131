from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from portal.jobs.choices import ALLOWED_TRANSITIONS, TERMINAL_STATES, JobState, can_transition
from portal.jobs.models import Allocation, Job, JobAttempt
from portal.jobs.services import InvalidTransition, retry_backoff_s, submit_job, transition_job
from portal.jobs.spec import JobSpecSerializer

EXPECTED_PATHS = [
    ("pending", "scheduled", True),
    ("scheduled", "starting", True),
    ("starting", "running", True),
    ("running", "succeeded", True),
    ("running", "suspended", True),
    ("suspended", "running", True),
    ("running", "checkpointing", True),
    ("checkpointing", "preempted", True),
    ("preempted", "pending", True),
    ("running", "lost", True),
    ("lost", "pending", True),
    ("running", "timed-out", True),
    ("pending", "running", False),
    ("pending", "succeeded", False),
    ("succeeded", "pending", False),
    ("cancelled", "running", False),
    ("preempted", "running", False),
    ("running", "pending", True),
    # A suspended job's program may still end (it exited as it was frozen, or was killed while
    # frozen): its attempt ends as a running one's would. Before, the report raised.
    ("suspended", "succeeded", True),
    ("suspended", "failed", True),
    ("suspended", "pending", True),
    ("suspended", "scheduled", False),
    # A job that failed on its own while being preempted is retried, not preempted.
    ("checkpointing", "pending", True),
    ("checkpointing", "succeeded", True),
]


@pytest.mark.parametrize(
    ("src", "dst", "allowed"), EXPECTED_PATHS, ids=[f"{a}->{b}" for a, b, _ in EXPECTED_PATHS]
)
def test_transition_table(src: str, dst: str, allowed: bool) -> None:
    assert can_transition(src, dst) is allowed


def test_every_state_has_a_row_and_terminal_states_lead_nowhere() -> None:
    assert set(ALLOWED_TRANSITIONS) == set(JobState.values)
    for state in TERMINAL_STATES:
        assert ALLOWED_TRANSITIONS[state] == frozenset()
    for targets in ALLOWED_TRANSITIONS.values():
        assert targets <= set(JobState.values)
    # every non-terminal state can end in cancellation
    for state in set(JobState.values) - TERMINAL_STATES:
        assert can_transition(state, JobState.CANCELLED), state


def make_job(users, request_factory, **overrides) -> Job:  # type: ignore[no-untyped-def]
    from rest_framework.request import Request

    request = Request(request_factory.post("/"))
    request.user = users["alice"]
    spec = JobSpecSerializer(
        data={"name": "j", "vc": "vision", "flavor": "s-A100", "command": "true", **overrides},
        context={"request": request},
    )
    spec.is_valid(raise_exception=True)
    return submit_job(users["alice"], spec.validated_data)


@pytest.mark.django_db
def test_transition_is_compare_and_set_and_leaves_an_event(users, rf) -> None:  # type: ignore[no-untyped-def]
    job = make_job(users, rf)
    stale = Job.objects.get(pk=job.pk)
    with transaction.atomic():
        assert transition_job(job, JobState.SCHEDULED, label="scheduler", reason="placed")
    # A writer holding the old version loses and changes nothing.
    with transaction.atomic():
        assert transition_job(stale, JobState.CANCELLED, actor=users["alice"]) is False
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert job.version == 1
    events = list(job.events.values_list("from_state", "to_state", "actor_label", "reason"))
    assert events == [("", "pending", "alice", "submitted"), ("pending", "scheduled", "scheduler", "placed")]


@pytest.mark.django_db
def test_a_disallowed_transition_raises_and_changes_nothing(users, rf) -> None:  # type: ignore[no-untyped-def]
    job = make_job(users, rf)
    with pytest.raises(InvalidTransition), transaction.atomic():
        transition_job(job, JobState.SUCCEEDED, label="agent")
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.events.count() == 1


@pytest.mark.django_db
def test_the_database_forbids_two_live_allocations_of_one_gpu(users, rf) -> None:  # type: ignore[no-untyped-def]
    from django.utils import timezone

    from portal.cluster.models import Gpu

    gpu = Gpu.objects.filter(model="A100").first()
    first = JobAttempt.objects.create(job=make_job(users, rf), number=1)
    second = JobAttempt.objects.create(job=make_job(users, rf), number=1)
    Allocation.objects.create(attempt=first, gpu=gpu, node=gpu.node)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(attempt=second, gpu=gpu, node=gpu.node)
    # Once released, the GPU can be allocated again.
    Allocation.objects.filter(attempt=first).update(released_at=timezone.now())
    Allocation.objects.create(attempt=second, gpu=gpu, node=gpu.node)
    assert Allocation.objects.filter(gpu=gpu, released_at__isnull=True).count() == 1


@pytest.mark.parametrize(
    ("retries", "used", "wait_s"),
    [
        ({}, 0, 60),  # the default backoff
        ({"backoff_seconds": 30}, 0, 30),
        ({"backoff_seconds": 30}, 1, 60),
        ({"backoff_seconds": 30}, 3, 240),
        ({"backoff_seconds": 0}, 9, 0),
        ({"backoff_seconds": 86400}, 0, 86400),
        ({"backoff_seconds": 86400}, 9, 86400),  # doubled 9 times it would be 512 days
        ({"backoff_seconds": 3600}, 5, 86400),  # 32 hours, held to a day
    ],
)
def test_the_wait_before_a_retry_doubles_up_to_a_day(retries: dict[str, int], used: int, wait_s: int) -> None:
    assert retry_backoff_s(retries, used) == wait_s

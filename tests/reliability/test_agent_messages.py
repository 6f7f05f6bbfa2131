"""Duplicated, reordered and late agent messages (reliability-security.md F12) over the real
agent gateway (Channels, Redis channel layer, PostgreSQL).

Messages on one socket are handled in order, so each test ends its burst with a log line of the
current attempt and waits for that line: by then every message before it was handled.

Covered elsewhere: a late 'starting', a duplicate 'running', a report after the end and a report
about another node's replica in tests/portal/agentgw/test_agent_consumer.py
(test_reports_move_the_job_and_duplicates_late_and_foreign_ones_change_nothing); the order of
attempt states as a property (any delivery order with duplicates ends at the same report) in
tests/agents/test_agent_attempt_states.py.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agents.protocol import AttemptState, ExitReason, LogChunk, decode_from_portal, encode
from portal.jobs.models import Job, JobAttempt, LogLine
from tests.portal.agentgw.test_agent_consumer import greet, place_a_job, status

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def handled(socket: WebsocketCommunicator, attempt_id: str, marker: str) -> None:
    """Sends a log line after what was sent before, and waits until the portal stored it."""
    await socket.send_to(
        text_data=encode(LogChunk(attempt_id=attempt_id, stream="stdout", seq=1000, text=marker))
    )
    for _ in range(200):
        if await LogLine.objects.filter(text=marker).aexists():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the portal did not handle the messages before {marker!r}")


async def events(job: Job) -> list[str]:
    return [
        e
        async for e in (await Job.objects.aget(pk=job.pk))
        .events.exclude(to_state="")
        .values_list("to_state", flat=True)
    ]


async def test_duplicated_and_reordered_reports_end_with_the_right_exit_code(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """An 'exited' that overtakes 'running', each sent three times, then the late 'running':
    the job fails once, with the replica's exit code, and never runs again."""
    one, _ = await greet("a100-node-1")
    two, _ = await greet("a100-node-2")
    job = await sync_to_async(place_a_job)(users["alice"])
    (replica_one,) = decode_from_portal(await one.receive_from(timeout=10)).attempts
    decode_from_portal(await two.receive_from(timeout=10))  # its replica, which never reports

    exited = status(
        replica_one.attempt_id, job, AttemptState.EXITED, 2, exit_code=3, reason=ExitReason.FAILED
    )
    running = status(replica_one.attempt_id, job, AttemptState.RUNNING, 1)
    for message in (exited, exited, exited, running, running, running):
        await one.send_to(text_data=message)
    await handled(one, replica_one.attempt_id, "after the burst")

    stored = await Job.objects.aget(pk=job.pk)
    assert (stored.state, stored.exit_code) == ("failed", 3)
    assert "exited with code 3" in stored.end_reason
    # The other replica of the gang is told to stop.
    assert decode_from_portal(await two.receive_from(timeout=10)).attempts == []
    attempt = await JobAttempt.objects.aget(job=job)
    assert attempt.state == "failed" and attempt.replica_states["0"]["state"] == "exited"
    assert await events(job) == ["pending", "scheduled", "starting", "failed"]
    await one.disconnect()
    await two.disconnect()


async def test_reports_of_an_older_attempt_change_nothing_of_the_new_one(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """Attempt 1 was lost and the job placed again as attempt 2: whatever attempt 1's agent
    says afterwards (running, exited with an error) leaves attempt 2 and the job alone."""
    from portal.jobs.models import Allocation
    from portal.jobs.services import requeue_jobs_holding
    from scheduler.tasks import run_cycle

    one, _ = await greet("a100-node-1")
    two, _ = await greet("a100-node-2")
    job = await sync_to_async(place_a_job)(users["alice"])
    (old_one,) = decode_from_portal(await one.receive_from(timeout=10)).attempts
    decode_from_portal(await two.receive_from(timeout=10))
    await one.send_to(text_data=status(old_one.attempt_id, job, AttemptState.RUNNING, 1))

    def lose_and_place_again() -> None:
        requeue_jobs_holding(Allocation.objects.filter(attempt__job=job, released_at__isnull=True), "test")
        assert run_cycle()["started"] == 1

    await sync_to_async(lose_and_place_again)()
    new_one = None
    while new_one is None:  # desired sets: first without attempt 1, then with attempt 2
        attempts = decode_from_portal(await one.receive_from(timeout=10)).attempts
        new_one = next((a for a in attempts if a.attempt_id != old_one.attempt_id), None)
    await one.send_to(text_data=status(new_one.attempt_id, job, AttemptState.RUNNING, 1))
    for message in (
        status(old_one.attempt_id, job, AttemptState.RUNNING, 5),
        status(old_one.attempt_id, job, AttemptState.EXITED, 6, exit_code=1, reason=ExitReason.FAILED),
        status(old_one.attempt_id, job, AttemptState.RUNNING, 7),
    ):
        await one.send_to(text_data=message)
    await handled(one, new_one.attempt_id, "after the stale reports")

    stored = await Job.objects.aget(pk=job.pk)
    assert stored.state == "starting" and stored.exit_code is None  # replica two has not reported
    attempts = [(a.number, a.state) async for a in JobAttempt.objects.filter(job=job).order_by("number")]
    assert attempts == [(1, "lost"), (2, "starting")]
    new = await JobAttempt.objects.aget(job=job, number=2)
    assert new.replica_states["0"]["state"] == "running"
    assert "failed" not in await events(job)
    await one.disconnect()
    await two.disconnect()

"""An attempt keeps at most LOG_MAX_BYTES_PER_ATTEMPT bytes of output: the lines before the cap
stay, the rest are dropped, and the job's events say so once, whatever the agents send after."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from agents.protocol import LogChunk
from portal.agentgw.desired import agent_attempt_id
from portal.jobs.models import Job, JobAttempt, JobEvent, LogLine
from portal.jobs.services import record_log_chunk
from tests.conftest import wait_for
from tests.portal.store_helpers import placed_attempt
from tests.portal.test_report_lock_order import waiting_for_a_lock

TRUNCATED = "output beyond 20 bytes of attempt 1 was not kept"


def chunk(attempt: JobAttempt, stream: str, seq: int, text: str) -> LogChunk:
    return LogChunk(attempt_id=agent_attempt_id(attempt, 0), stream=stream, seq=seq, text=text)


def stored(attempt: JobAttempt) -> list[tuple[str, int, str]]:
    return list(LogLine.objects.filter(attempt=attempt).order_by("id").values_list("stream", "seq", "text"))


def truncation_events(attempt: JobAttempt) -> list[str]:
    return list(
        JobEvent.objects.filter(job_id=attempt.job_id, data__log="truncated").values_list("reason", flat=True)
    )


@pytest.mark.django_db
def test_lines_past_the_cap_are_dropped_with_one_event(api_for, paused_loop, settings) -> None:  # type: ignore[no-untyped-def]
    settings.LOG_MAX_BYTES_PER_ATTEMPT = 20
    node, attempt = placed_attempt(api_for, command="yes")
    # 8 bytes (each line with its newline); sent twice, as an agent does after a reconnect: the
    # copy adds no line and counts no byte.
    assert record_log_chunk(node, chunk(attempt, "stdout", 0, "one\ntwo\n")) == 2
    assert record_log_chunk(node, chunk(attempt, "stdout", 0, "one\ntwo\n")) == 0
    assert JobAttempt.objects.get(pk=attempt.pk).log_bytes == 8
    # stderr counts with stdout: 6 + 5 bytes fit (19), "five" would make 24.
    assert record_log_chunk(node, chunk(attempt, "stderr", 0, "three\nfour\nfive\nsix\n")) == 2
    kept = [("stdout", 0, "one"), ("stdout", 1, "two"), ("stderr", 0, "three"), ("stderr", 1, "four")]
    assert stored(attempt) == kept
    assert truncation_events(attempt) == [TRUNCATED]

    # Later chunks, a line that would still fit, and the truncated chunk sent again: nothing
    # more is stored and the event stays one.
    assert record_log_chunk(node, chunk(attempt, "stdout", 2, "seven\neight\n")) == 0
    assert record_log_chunk(node, chunk(attempt, "stdout", 4, "9\n")) == 0
    assert record_log_chunk(node, chunk(attempt, "stderr", 0, "three\nfour\nfive\nsix\n")) == 0
    assert stored(attempt) == kept
    assert truncation_events(attempt) == [TRUNCATED]
    attempt.refresh_from_db()
    assert (attempt.log_bytes, attempt.log_truncated) == (19, True)

    # The API shows the kept lines, and the attempt says the rest was not kept.
    alice = api_for("alice")
    lines = alice.get(f"/api/v1/jobs/{attempt.job_id}/logs/").json()["results"]
    assert [line["text"] for line in lines] == ["one", "two", "three", "four"]
    assert alice.get(f"/api/v1/jobs/{attempt.job_id}/").json()["attempts"][0]["log_truncated"] is True


@pytest.mark.django_db(transaction=True)
def test_chunks_reaching_the_cap_at_once_write_one_event_and_take_the_job_first(
    api_for, paused_loop, settings
) -> None:  # type: ignore[no-untyped-def]
    """Two chunks that each cross the cap arrive while another writer holds the job and then
    touches the attempt (a status report, a cancel). Had a chunk locked the attempt before the
    job, that writer and the chunk would deadlock; had the chunks not taken turns on the
    attempt, each would have found it unmarked and written an event."""
    settings.LOG_MAX_BYTES_PER_ATTEMPT = 20
    node, attempt = placed_attempt(api_for, command="yes")
    results: dict[str, Any] = {}

    def send(stream: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            results[f"{stream} pid"] = cursor.fetchone()[0]
        try:
            results[stream] = record_log_chunk(node, chunk(attempt, stream, 0, "0123456789\n" * 3))
        except Exception as error:  # the test reports whatever broke it
            results[stream] = error
        finally:
            connection.close()

    senders = [threading.Thread(target=send, args=(stream,)) for stream in ("stdout", "stderr")]
    with transaction.atomic():
        Job.objects.select_for_update().get(pk=attempt.job_id)
        for sender in senders:
            sender.start()
        for stream in ("stdout", "stderr"):
            wait_for(lambda s=stream: f"{s} pid" in results, 10, f"the {stream} chunk's connection")
            wait_for(
                lambda s=stream: waiting_for_a_lock(results[f"{s} pid"]), 10, f"the {stream} chunk to wait"
            )
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        JobAttempt.objects.filter(pk=attempt.pk).update(end_reason="touched by the other writer")
    for sender in senders:
        sender.join(timeout=30)

    # One chunk stored its first line (11 bytes) and found the second past the cap; the other
    # came second and stored nothing.
    assert {results["stdout"], results["stderr"]} == {0, 1}, results
    assert len(stored(attempt)) == 1
    assert truncation_events(attempt) == [TRUNCATED]
    attempt.refresh_from_db()
    assert (attempt.log_bytes, attempt.log_truncated) == (11, True)

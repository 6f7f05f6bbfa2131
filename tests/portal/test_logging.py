from __future__ import annotations

import json
import logging

import pytest

from portal.lib.logging import JsonFormatter, request_id
from tests.conftest import database_url_of_tests

pytestmark = pytest.mark.django_db


def test_json_lines_carry_the_request_id_and_the_job(client) -> None:  # type: ignore[no-untyped-def]
    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(JsonFormatter().format(record))

    handler = Capture()
    logger = logging.getLogger("portal.test")
    logger.addHandler(handler)
    try:
        token = request_id.set("req-123")
        logger.warning("attempt %s stopped", "7.0", extra={"job_id": 7, "attempt_id": "7.0"})
        request_id.reset(token)
    finally:
        logger.removeHandler(handler)
    entry = json.loads(records[0])
    assert entry["message"] == "attempt 7.0 stopped"
    assert (entry["request_id"], entry["job_id"], entry["attempt_id"], entry["level"]) == (
        "req-123",
        7,
        "7.0",
        "WARNING",
    )


def test_every_response_names_its_request(client) -> None:  # type: ignore[no-untyped-def]
    assert len(client.get("/healthz")["X-Request-ID"]) == 32
    assert client.get("/healthz", HTTP_X_REQUEST_ID="from-the-proxy")["X-Request-ID"] == "from-the-proxy"


def test_the_celery_worker_logs_json_lines_with_the_task_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real worker on a queue of its own (so that no other worker takes the task) logs through
    Django's LOGGING, not in Celery's format; a task's lines carry its id."""
    import os
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    from portal.celery import app

    queue = f"log-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url_of_tests(),
        "LOG_FORMAT": "json",
    }
    out_path = tmp_path / "worker.log"
    celery = str(Path(sys.executable).parent / "celery")
    with open(out_path, "wb") as out:
        worker = subprocess.Popen(
            [celery, "-A", "portal", "--quiet", "worker", "-P", "solo", "-Q", queue, "-n", f"{queue}@%h"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        result = app.send_task("celery.accumulate", args=[1, 2], queue=queue)
        result.get(timeout=60)
    except Exception:
        print(out_path.read_text())
        raise
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    lines = out_path.read_text().splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    # What is not JSON is Celery's own prints (the shutdown notice), never a log line in its format.
    assert not [line for line in lines if "INFO/MainProcess]" in line or "INFO/ForkPoolWorker" in line]
    assert any(e.get("task_id") == result.id and "succeeded" in e["message"] for e in entries), lines
    assert any(e["logger"].startswith("celery") and "ready" in e["message"] for e in entries), lines

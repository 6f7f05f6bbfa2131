from __future__ import annotations

import json
import logging

import pytest

from portal.lib.logging import JsonFormatter, request_id

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

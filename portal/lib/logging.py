"""Structured logs: one JSON object a line, with the request, task, job and attempt they concern.

A request id comes from the X-Request-ID header or is made up; it is returned in the response
and added to every log line written while the request is served.
"""

from __future__ import annotations

import contextvars
import json
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

CONTEXT_FIELDS = ("job_id", "attempt_id", "node")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if rid := request_id.get():
            entry["request_id"] = rid
        task_id = _celery_task_id()
        if task_id:
            entry["task_id"] = task_id
        for name in CONTEXT_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _celery_task_id() -> str | None:
    try:
        from celery import current_task
    except ImportError:  # pragma: no cover - celery is a dependency of the portal
        return None
    request = getattr(current_task, "request", None)
    return getattr(request, "id", None) if request is not None else None


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        incoming = request.headers.get("X-Request-ID", "")
        rid = incoming if 0 < len(incoming) <= 64 and incoming.isprintable() else uuid.uuid4().hex
        token = request_id.set(rid)
        try:
            response = self.get_response(request)
        finally:
            request_id.reset(token)
        response["X-Request-ID"] = rid
        return response

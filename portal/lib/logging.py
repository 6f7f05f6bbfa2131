"""Structured logs: one JSON object a line, with the request, task, job and attempt they concern.

A request id comes from the X-Request-ID header or is made up; it is returned in the response
and added to every log line written while the request is served.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import Callable
from typing import Any

from agents.logs import JsonFormatter as AgentJsonFormatter

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


class JsonFormatter(AgentJsonFormatter):
    """The agent's line shape plus the request and Celery task being served."""

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        entry = super().fields(record)
        if rid := request_id.get():
            entry["request_id"] = rid
        if task_id := _celery_task_id():
            entry["task_id"] = task_id
        return entry


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

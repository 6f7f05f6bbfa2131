"""Structured logs: one JSON object a line. The portal's formatter extends this one with the
request and task it serves, so agent and portal lines share one shape for a log shipper."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# Set with `extra=` on a log call: they become fields of their own.
CONTEXT_FIELDS = ("job_id", "attempt_id", "node")


class JsonFormatter(logging.Formatter):
    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for name in CONTEXT_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return entry

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record), default=str)

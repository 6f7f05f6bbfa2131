"""A database that is restarting or unreachable is a temporary condition, not a server bug."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import JsonResponse

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5


class DatabaseUnavailableMiddleware:
    """Answers 503 with Retry-After when a view loses its database connection (a PostgreSQL
    restart or failover). Nothing was stored: the transaction died with the connection, so the
    client may simply retry. Clients and load balancers treat a 503 as retryable, a 500 as not."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)

    def process_exception(self, request: Any, exception: Exception) -> JsonResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        log.warning("database unavailable while serving %s %s: %s", request.method, request.path, exception)
        response = JsonResponse(
            {"detail": "The database is unavailable for a moment; nothing was changed. Retry shortly."},
            status=503,
        )
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response

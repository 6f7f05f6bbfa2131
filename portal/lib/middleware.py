"""Two failures Django would answer with a bare error page, answered as the API answers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5


class ErrorResponsesMiddleware:
    """A database that went away (a PostgreSQL restart or failover) is a 503 with Retry-After:
    the transaction died with the connection, so nothing was stored and the client may retry;
    clients and load balancers retry a 503, never a 500. A body above
    DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 that says the limit, not a blank 400."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)

    def process_exception(self, request: Any, exception: Exception) -> JsonResponse | None:
        if isinstance(exception, OperationalError | InterfaceError):
            log.warning("database unavailable for %s %s: %s", request.method, request.path, exception)
            response = JsonResponse(
                {"detail": "The database is unavailable for a moment; nothing was changed. Retry shortly."},
                status=503,
            )
            response["Retry-After"] = str(RETRY_AFTER_S)
            return response
        if isinstance(exception, RequestDataTooBig):
            limit_mib = settings.DATA_UPLOAD_MAX_MEMORY_SIZE / (1024 * 1024)
            return JsonResponse(
                {"detail": f"The request body is too large (at most {limit_mib:g} MiB)."}, status=413
            )
        return None

"""Rate limits for the endpoints worth guessing at or flooding: sign-in, token creation, submission."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import ScopedRateThrottle


class WriteThrottle(ScopedRateThrottle):
    """Counts only requests that change something: reading a job list is never throttled.

    Counts live in Django's cache, per web process; behind N replicas the limit is N times higher.
    """

    def allow_request(self, request: Any, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return True
        return super().allow_request(request, view)

"""Rate limits for the endpoints worth guessing at or flooding: sign-in (API and admin), the
admin's second factor, token creation, submission, and its dry run (a whole scheduling cycle's
work per request)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import ScopedRateThrottle


class WriteThrottle(ScopedRateThrottle):
    """Counts only POSTs and other unsafe methods: reading a job list is never throttled, a dry
    run (a POST that changes nothing but costs a cycle) is, in its own scope.

    Counts live in Django's cache, per web process; behind N replicas the limit is N times higher.
    """

    def allow_request(self, request: Any, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return True
        return super().allow_request(request, view)


def form_post_allowed(request: Any, scope: str) -> bool:
    """The same per-user (per-address when anonymous) limits for plain Django form views: the
    admin's sign-in and second-factor forms and the browsable API's sign-in page count against
    `scope` like the API does, in the same counters. An anonymous caller's address is DRF's
    `get_ident`, so it honours NUM_PROXIES as the API does: a client-made X-Forwarded-For
    counts for nothing unless a trusted proxy is declared."""
    return WriteThrottle().allow_request(request, SimpleNamespace(throttle_scope=scope))

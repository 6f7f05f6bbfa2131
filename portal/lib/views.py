from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import JsonResponse

from portal.lib.redis import get_redis


def healthz(request: Any) -> JsonResponse:
    """For load balancers and container health checks: 200 when PostgreSQL and Redis answer."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        get_redis().ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}"
    healthy = all(v == "ok" for v in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", **checks}, status=200 if healthy else 503
    )

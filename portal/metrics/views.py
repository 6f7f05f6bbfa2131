from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from portal.metrics.collector import PortalCollector

registry = CollectorRegistry(auto_describe=False)
registry.register(PortalCollector())


def allowed(request: Any) -> bool:
    """A scraper shows the metrics token, or comes from an allowed address."""
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(header, f"Bearer {token}"):
        return True
    return request.META.get("REMOTE_ADDR") in settings.METRICS_ALLOWED_IPS


def metrics(request: Any) -> HttpResponse:
    if not allowed(request):
        return HttpResponse(
            "Forbidden: give the metrics token or scrape from an allowed address.\n", status=403
        )
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

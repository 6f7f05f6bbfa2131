"""The health check and the Prometheus scrape, answered before host validation and the TLS redirect.

Both are called by the deployment itself, by names the public ALLOWED_HOSTS does not list: the
web container's health check asks http://127.0.0.1:8000/healthz and Prometheus scrapes
http://web:8000/metrics, over plain HTTP inside the compose network. Through the whole
middleware stack a production setting (ALLOWED_HOSTS=portal.example.org, SECURE_SSL_REDIRECT)
answers them 400 or a redirect to https, so the web container never turned healthy and no metric
was ever scraped. Neither view builds a URL or a page from the Host header, and /metrics checks its
own token or address, so skipping host validation for these two exact paths exposes nothing;
every other path keeps Django's checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from portal.lib.views import healthz
from portal.metrics.views import metrics

PROBES: dict[str, Callable[[Any], Any]] = {"/healthz": healthz, "/metrics": metrics}


class ProbesMiddleware:
    """Answers GET and HEAD of /healthz and /metrics directly, whatever the Host header; placed
    before SecurityMiddleware and CommonMiddleware, which validate the host."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        view = PROBES.get(request.path_info)
        if view is not None and request.method in ("GET", "HEAD"):
            return view(request)
        return self.get_response(request)

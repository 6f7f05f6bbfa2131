"""Serves the single-page app built from frontend/ (its assets are static files under /static/)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.csrf import ensure_csrf_cookie

NOT_BUILT = """<!doctype html><title>GPU Portal</title>
<p>The web app is not built. Run <code>make up</code>, or use the <a href="/api/v1/docs/">API</a>
and the <a href="/admin/">admin</a>.</p>"""


@ensure_csrf_cookie
def spa(request: Any, path: str = "") -> HttpResponse:
    """Every browser route of the app answers with the same index.html; the app routes itself."""
    index = settings.FRONTEND_DIST / "index.html"
    if not index.exists():
        return HttpResponse(NOT_BUILT, status=503)
    response = HttpResponse(index.read_bytes(), content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    return response

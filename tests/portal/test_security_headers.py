from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_pages_carry_a_content_security_policy(users) -> None:  # type: ignore[no-untyped-def]
    response = Client().get("/api/v1/docs/")
    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    # The docs page is served from this site: no CDN, so it works where the internet does not.
    # (Its inline script carries a random token, so a bare "cdn" may turn up by chance: the
    # check is on what the page loads.)
    page = response.content.decode()
    loaded = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page)
    assert loaded, "the page should load its scripts and styles"
    assert not [url for url in loaded if re.match(r"(?:[a-z]+:)?//", url, re.IGNORECASE)]
    assert not re.search(r"(?:cdn\.jsdelivr|unpkg\.com|cdnjs\.)", page, re.IGNORECASE)
    assert response["X-Frame-Options"] == "DENY"


def low_rate(monkeypatch, scope: str, rate: str) -> None:  # type: ignore[no-untyped-def]
    """DRF reads the rates once, into the throttle class; this lowers one for a test."""
    from portal.lib.throttling import WriteThrottle

    monkeypatch.setattr(WriteThrottle, "THROTTLE_RATES", {**WriteThrottle.THROTTLE_RATES, scope: rate})


def test_sign_in_is_throttled_but_reading_the_session_is_not(users, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    low_rate(monkeypatch, "sign-in", "3/min")
    client = APIClient()
    codes = [
        client.post("/api/v1/session/", {"username": "alice", "password": "wrong"}).status_code
        for _ in range(4)
    ]
    assert codes == [400, 400, 400, 429]
    assert all(client.get("/api/v1/session/").status_code == 401 for _ in range(5))


def test_submissions_are_throttled_per_user(api_for, small_job, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    low_rate(monkeypatch, "submit", "2/min")
    alice, bob = api_for("alice"), api_for("bob")
    codes = [alice.post("/api/v1/jobs/", small_job, format="json").status_code for _ in range(3)]
    assert codes == [201, 201, 429]
    assert bob.post("/api/v1/jobs/", small_job, format="json").status_code == 201
    assert alice.get("/api/v1/jobs/").status_code == 200

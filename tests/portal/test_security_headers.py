from __future__ import annotations

import re
from typing import Any

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
    assert all(client.get("/api/v1/session/").status_code == 204 for _ in range(5))


def test_submissions_are_throttled_per_user(api_for, small_job, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    low_rate(monkeypatch, "submit", "2/min")
    alice, bob = api_for("alice"), api_for("bob")
    codes = [alice.post("/api/v1/jobs/", small_job, format="json").status_code for _ in range(3)]
    assert codes == [201, 201, 429]
    assert bob.post("/api/v1/jobs/", small_job, format="json").status_code == 201
    assert alice.get("/api/v1/jobs/").status_code == 200


WRONG = {"username": "alice", "password": "wrong"}


@pytest.mark.parametrize("url", ["/api/v1/session/", "/admin/login/", "/api-auth/login/"])
def test_sign_in_limits_count_an_address_the_client_cannot_choose(
    users: dict[str, Any], monkeypatch: pytest.MonkeyPatch, settings: Any, url: str
) -> None:
    """Every password form counts signed-out callers by the connection's address: a made-up
    X-Forwarded-For per guess gains nothing. Behind a trusted proxy (NUM_PROXIES=1) it is the
    address that proxy appended, not what the client wrote before it."""
    low_rate(monkeypatch, "sign-in", "3/min")
    forged = [Client().post(url, WRONG, HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").status_code for i in range(4)]
    assert 429 not in forged[:3] and forged[3] == 429, forged

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}

    def behind_the_proxy(client_address: str, written_by_client: str) -> int:
        forwarded = f"{written_by_client}, {client_address}"
        return Client().post(url, WRONG, HTTP_X_FORWARDED_FOR=forwarded, REMOTE_ADDR="10.0.0.2").status_code

    proxied = [behind_the_proxy("203.0.113.7", f"198.51.100.{i}") for i in range(4)]
    assert 429 not in proxied[:3] and proxied[3] == 429, proxied
    assert behind_the_proxy("203.0.113.8", "198.51.100.1") != 429  # another person, same proxy


def test_the_browsable_api_sign_in_page_shares_the_sign_in_limit(
    users: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    users["alice"].set_password("alice-pass")
    users["alice"].save()
    low_rate(monkeypatch, "sign-in", "3/min")
    signed_in = Client().post("/api-auth/login/", {"username": "alice", "password": "alice-pass"})
    assert signed_in.status_code == 302  # the page still signs people in
    client = Client()
    assert client.post("/api/v1/session/", WRONG).status_code == 400
    assert client.post("/admin/login/", WRONG).status_code == 200  # the form again, with its error
    refused = client.post("/api-auth/login/", {"username": "alice", "password": "alice-pass"})
    assert refused.status_code == 429 and b"Too many sign-in attempts" in refused.content

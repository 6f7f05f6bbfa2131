from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounts.models import ApiToken, AuditEntry, hash_secret

pytestmark = pytest.mark.django_db


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_token_is_shown_once_stored_hashed_and_works(api_for) -> None:  # type: ignore[no-untyped-def]
    created = api_for("alice").post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()
    raw = created["token"]
    assert raw.startswith("gpp_") and len(raw) > 40
    stored = ApiToken.objects.get(pk=created["id"])
    assert stored.token_hash == hash_secret(raw) and raw not in stored.token_hash
    listed = api_for("alice").get("/api/v1/tokens/").json()["results"]
    assert "token" not in listed[0] and listed[0]["prefix"] == raw[:12]
    assert bearer(raw).get("/api/v1/me/").json()["username"] == "alice"
    assert AuditEntry.objects.filter(action="api_token.create", object_id=str(stored.pk)).exists()


def test_revoked_expired_and_unknown_tokens_are_refused(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    first = alice.post("/api/v1/tokens/", {"name": "a"}, format="json").json()
    second = alice.post("/api/v1/tokens/", {"name": "b", "expires_in_days": 1}, format="json").json()
    assert alice.delete(f"/api/v1/tokens/{first['id']}/").json()["revoked_at"]
    assert bearer(first["token"]).get("/api/v1/me/").status_code == 401
    assert bearer(second["token"]).get("/api/v1/me/").status_code == 200
    ApiToken.objects.filter(pk=second["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(second["token"]).get("/api/v1/me/").status_code == 401
    assert bearer("gpp_not-a-real-token").get("/api/v1/me/").status_code == 401
    assert bearer("something-else").get("/api/v1/me/").status_code == 401


def test_a_token_with_no_expiry_and_bad_input(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    forever = alice.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 0}, format="json").json()
    assert forever["expires_at"] is None
    bad = alice.post("/api/v1/tokens/", {"name": "", "expires_in_days": -1}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"name", "expires_in_days"}
    assert ApiToken.objects.count() == 1


def test_a_token_cannot_create_tokens(api_for: Any) -> None:
    """Else a leaked or short-lived token could mint a never-expiring one that outlives its own
    expiry and revocation."""
    raw = api_for("alice").post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 1}, format="json").json()
    refused = bearer(raw["token"]).post(
        "/api/v1/tokens/", {"name": "persist", "expires_in_days": 0}, format="json"
    )
    assert refused.status_code == 403
    assert "gpuportal login" in refused.json()["detail"]
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["ci"]
    assert AuditEntry.objects.filter(action="apitoken.create.denied").count() == 1  # a refused write
    # Reading and revoking its user's tokens still work with one.
    assert bearer(raw["token"]).get("/api/v1/tokens/").json()["count"] == 1
    assert bearer(raw["token"]).delete(f"/api/v1/tokens/{raw['id']}/").json()["revoked_at"]


def test_a_token_submits_and_cancels_for_its_user(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    raw = api_for("bob").post("/api/v1/tokens/", {"name": "script"}, format="json").json()["token"]
    client = bearer(raw)
    job = client.post("/api/v1/jobs/", small_job, format="json").json()
    assert job["owner"] == "bob"
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel/").json()["state"] == "cancelled"

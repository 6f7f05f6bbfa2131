"""S13: Django admin only for cluster admins (staff) who passed a second factor in this session.

The second factor is a TOTP code (RFC 6238, +-1 step, each code once, tries throttled); a staff
user without an authenticator is sent to enroll one, and nobody else ever gets past the sign-in
page. Tenant admins and researchers reach no admin model and change no role or quota through any
API route (the route sweep at the end).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from portal.accounts import totp
from portal.accounts.models import AuditEntry, Membership, Tenant, TotpDevice
from portal.cluster.models import Flavor, PriorityClass, Quota, VirtualCluster
from tests.conftest import pass_admin_second_factor
from tests.portal.test_tenant_isolation import api_routes

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def frozen_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Codes change every 30 s, and a test crossing a step boundary would see its "replayed" code
    become a new one. The portal reads the time step through totp.step_at; here it stands still."""
    real = totp.step_at
    now = real()
    monkeypatch.setattr(totp, "step_at", lambda unix_time=None: now if unix_time is None else real(unix_time))


def code(device: TotpDevice, offset: int = 0) -> str:
    return totp.code_at_step(device.secret, totp.step_at() + offset)


def sign_in(username: str, next_url: str = "/admin/cluster/quota/") -> tuple[Client, Any]:
    """The admin sign-in page with the demo password; returns the client and the answer."""
    client = Client()
    response = client.post(
        "/admin/login/", {"username": username, "password": f"{username}-pass", "next": next_url}
    )
    return client, response


@pytest.mark.parametrize(
    ("unix_time", "expected"),
    [(59, "94287082"), (1111111109, "07081804"), (1234567890, "89005924"), (20000000000, "65353130")],
)
def test_codes_match_the_rfc_6238_test_vectors(unix_time: int, expected: str) -> None:
    secret = base64.b32encode(b"12345678901234567890").decode()
    assert totp.code_at_step(secret, totp.step_at(unix_time), digits=8) == expected
    assert totp.code_at_step(secret, totp.step_at(unix_time)) == expected[-6:]


def test_the_password_alone_does_not_open_admin(users: dict[str, Any]) -> None:
    client, response = sign_in("admin")
    assert response.status_code == 302 and response["Location"].startswith("/admin/mfa/?next=")
    for url in ("/admin/", "/admin/cluster/quota/", "/admin/auth/user/"):
        answer = client.get(url)
        assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/"), url
        assert client.get(answer["Location"])["Location"].startswith("/admin/mfa/")
    device = users["admin"].totp_device
    passed = client.post("/admin/mfa/", {"code": code(device), "next": "/admin/cluster/quota/"})
    assert (passed.status_code, passed["Location"]) == (302, "/admin/cluster/quota/")
    assert client.get("/admin/cluster/quota/").status_code == 200
    client.post("/admin/logout/")
    assert client.get("/admin/cluster/quota/").status_code == 302  # a new sign-in needs a new code


def test_a_staff_user_without_an_authenticator_enrolls_one_first(users: dict[str, Any]) -> None:
    ops = User.objects.create_user("ops", password="ops-pass", is_staff=True)
    client, response = sign_in("ops", next_url="/admin/")
    assert response["Location"].startswith("/admin/mfa/enroll/")
    assert client.get("/admin/mfa/")["Location"].startswith("/admin/mfa/enroll/")
    page = client.get(response["Location"]).content.decode()
    device = TotpDevice.objects.get(user=ops)
    assert device.confirmed_at is None
    assert device.secret in page and f"otpauth://totp/GPU%20Portal%3Aops?secret={device.secret}" in page
    with connection.cursor() as cursor:  # the key is encrypted at rest like secret variables
        cursor.execute("SELECT secret FROM accounts_totpdevice WHERE id = %s", [device.pk])
        assert device.secret not in cursor.fetchone()[0]

    wrong = client.post("/admin/mfa/enroll/", {"code": "000000" if code(device) != "000000" else "111111"})
    assert wrong.status_code == 200 and "not valid" in wrong.content.decode()
    assert client.get("/admin/").status_code == 302
    confirmed = client.post("/admin/mfa/enroll/", {"code": code(device), "next": "/admin/"})
    assert (confirmed.status_code, confirmed["Location"]) == (302, "/admin/")
    assert client.get("/admin/").status_code == 200
    device.refresh_from_db()
    assert device.confirmed_at is not None
    assert client.get("/admin/mfa/enroll/")["Location"].startswith("/admin/mfa/")  # no second enrollment
    assert AuditEntry.objects.filter(action="admin.mfa-enroll", actor=ops).exists()


def test_a_code_is_accepted_once_and_within_one_step(users: dict[str, Any]) -> None:
    device = users["admin"].totp_device
    first, _ = sign_in("admin")
    assert first.post("/admin/mfa/", {"code": code(device)}).status_code == 302
    second, _ = sign_in("admin")  # the same code, replayed in another session
    replay = second.post("/admin/mfa/", {"code": code(device)})
    assert replay.status_code == 200 and "used already" in replay.content.decode()
    for stale in (-2, 2):  # outside the window
        assert second.post("/admin/mfa/", {"code": code(device, stale)}).status_code == 200
    assert second.get("/admin/").status_code == 302
    assert second.post("/admin/mfa/", {"code": code(device, 1)}).status_code == 302  # one step ahead
    assert second.get("/admin/").status_code == 200
    assert AuditEntry.objects.filter(action="admin.mfa-failed", actor=users["admin"]).count() == 3


def test_failed_codes_are_throttled(users: dict[str, Any], settings: Any) -> None:
    device = users["admin"].totp_device
    client, _ = sign_in("admin")
    good = code(device)
    bad = "000000" if good != "000000" else "111111"
    for _ in range(5):  # THROTTLE_ADMIN_MFA: 5/min
        assert client.post("/admin/mfa/", {"code": bad}).status_code == 200
    refused = client.post("/admin/mfa/", {"code": good})
    assert refused.status_code == 429 and "Too many codes" in refused.content.decode()
    assert client.get("/admin/").status_code == 302
    device.refresh_from_db()
    assert device.last_used_step == 0  # the right code was not even looked at


def test_resetting_an_authenticator_ends_its_admin_sessions(users: dict[str, Any]) -> None:
    client = Client()
    client.force_login(users["admin"])
    pass_admin_second_factor(client, users["admin"])
    assert client.get("/admin/").status_code == 200
    TotpDevice.objects.filter(user=users["admin"]).delete()
    assert client.get("/admin/").status_code == 302
    pass_admin_second_factor(client, users["admin"])  # enrolls again
    assert client.get("/admin/").status_code == 200


def test_a_portal_session_of_a_staff_user_is_no_admin_session(users: dict[str, Any]) -> None:
    client = Client()
    signed_in = client.post(
        "/api/v1/session/", {"username": "admin", "password": "admin-pass"}, content_type="application/json"
    )
    assert signed_in.status_code == 200
    assert client.get("/admin/").status_code == 302
    assert client.get("/admin/cluster/quota/")["Location"].startswith("/admin/login/")


# --- nobody but a cluster admin past the second factor reaches admin models ---------------------


def admin_urls() -> list[str]:
    """Every registered model's list, add, change, delete and history page (first object)."""
    urls = []
    for model in admin.site._registry:
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        urls += [base, base + "add/"]
        obj = model.objects.order_by("pk").first()
        if obj is not None:
            urls += [f"{base}{obj.pk}/change/", f"{base}{obj.pk}/delete/", f"{base}{obj.pk}/history/"]
    return urls


def roles_and_quotas() -> dict[str, list[Any]]:
    """What no one but a cluster admin may change, read straight from the tables."""
    return {
        "memberships": list(Membership.objects.order_by("pk").values()),
        "quotas": list(Quota.objects.order_by("pk").values()),
        "vcs": list(VirtualCluster.objects.order_by("pk").values()),
        "tenants": list(Tenant.objects.order_by("pk").values()),
        "users": list(
            User.objects.order_by("pk").values(
                "username", "is_staff", "is_superuser", "is_active", "password"
            )
        ),
        "flavors": list(Flavor.objects.order_by("pk").values()),
        "priority_classes": list(PriorityClass.objects.order_by("pk").values()),
        "devices": list(TotpDevice.objects.order_by("pk").values("pk", "user_id", "confirmed_at")),
    }


ESCALATION = {
    "role": "admin",
    "is_staff": True,
    "is_superuser": True,
    "tenant": "speech",
    "virtual_cluster": "speech",
    "guaranteed": 999,
    "borrow_limit": 999,
    "quotas": [{"gpu_model": "A100", "guaranteed": 999, "borrow_limit": 999}],
    "memberships": [{"tenant": "speech", "role": "admin"}],
    "user": "alice",
    "username": "alice",
    "action": "delete_selected",
    "_selected_action": ["1", "2", "3"],
}


@pytest.mark.parametrize("who", ["vision-admin", "alice", "staff-without-second-factor"])
def test_admin_models_are_out_of_reach_without_staff_and_second_factor(
    users: dict[str, Any], who: str
) -> None:
    client = Client()
    client.force_login(users["admin" if who == "staff-without-second-factor" else who])
    before = roles_and_quotas()
    urls = [*admin_urls(), "/admin/", "/admin/accounts/", "/admin/password_change/"]
    assert len(urls) > 40
    for url in urls:
        for method in ("get", "post"):
            response = getattr(client, method)(url, ESCALATION if method == "post" else None)
            assert response.status_code == 302, (method, url, response.status_code)
            assert response["Location"].startswith("/admin/login/"), (method, url)
    if who != "staff-without-second-factor":
        for url in ("/admin/mfa/", "/admin/mfa/enroll/"):
            assert client.get(url)["Location"].startswith("/admin/login/")
            assert client.post(url, {"code": "123456"})["Location"].startswith("/admin/login/")
        page = client.get("/admin/login/")
        assert page.status_code == 200 and b"not authorized" in page.content
        assert not TotpDevice.objects.filter(user=users[who]).exists()
    assert roles_and_quotas() == before


@pytest.mark.parametrize("who", ["vision-admin", "alice"])
def test_no_api_route_changes_roles_or_quotas(
    api_for: Any, users: dict[str, Any], who: str, small_job: dict[str, Any], invariants_checked: set[int]
) -> None:
    """Every API route, every writing method, with a body that asks for more power, as a tenant
    admin and as a researcher: roles, memberships, quotas, VCs and staff flags stay as they are."""
    import re

    job = api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"]
    invariants_checked.add(job)
    ids = [
        "vision",
        "speech",
        "a100-node-1",
        str(job),
        str(Quota.objects.get(virtual_cluster__name="speech", gpu_model="A100").pk),
        str(Membership.objects.get(user__username="speech-admin").pk),
        str(users["speech-admin"].pk),
    ]
    client = api_for(who)
    before = roles_and_quotas()
    for route in sorted(api_routes()):
        pattern = route.replace("^", "").replace("$", "")
        params = re.findall(r"\(\?P<[^>]+>[^)]*\)|<[^>]+>", pattern)
        candidates = ids if params else [None]
        for value in candidates:
            url = "/" + re.sub(r"\(\?P<[^>]+>[^)]*\)|<[^>]+>", value or "", pattern)
            for method in ("post", "put", "patch", "delete"):
                response = getattr(client, method)(url, ESCALATION, format="json")
                assert response.status_code < 500, (method, url, response.content[:200])
    assert roles_and_quotas() == before

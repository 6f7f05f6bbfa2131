"""Tenant admins manage their tenant's members through the API: any member lists them, only
admins change them, a tenant always keeps an admin, every change is audited, and a tenant the
caller does not belong to answers exactly like one that does not exist.

The cast (tests/conftest.py): vision has vision-admin (admin), alice and bob (members) and
victor (viewer); speech has speech-admin, carol and dave; admin is the cluster admin."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from portal.accounts.choices import Role
from portal.accounts.models import AuditEntry, Membership, Tenant

pytestmark = pytest.mark.django_db

MEMBERS = "/api/v1/tenants/vision/members/"


def member(username: str) -> str:
    return f"{MEMBERS}{username}/"


def role_of(username: str, tenant: str = "vision") -> str | None:
    membership = Membership.objects.filter(user__username=username, tenant__name=tenant).first()
    return membership.role if membership is not None else None


def member_changes() -> list[tuple[str, str]]:
    return list(
        AuditEntry.objects.filter(action__startswith="member.").order_by("id").values_list("action", "detail")
    )


def test_each_user_lists_the_tenants_they_belong_to_with_their_role(api_for, users) -> None:  # type: ignore[no-untyped-def]
    Membership.objects.create(user=users["alice"], tenant=Tenant.objects.get(name="speech"), role=Role.VIEWER)
    tenants = api_for("alice").get("/api/v1/tenants/").json()
    assert tenants["results"] == [
        {"name": "speech", "display_name": "Speech", "role": "viewer", "role_label": "Viewer"},
        {"name": "vision", "display_name": "Vision", "role": "member", "role_label": "Member"},
    ]
    admin_of_vision = api_for("vision-admin").get("/api/v1/tenants/").json()["results"]
    assert [(t["name"], t["role"], t["role_label"]) for t in admin_of_vision] == [
        ("vision", "admin", "Tenant admin")
    ]
    # A cluster admin sees here only the tenants they belong to (none in the demo), not all.
    assert api_for("admin").get("/api/v1/tenants/").json()["count"] == 0
    assert api_for("nobody").get("/api/v1/tenants/").json()["count"] == 0
    assert api_for(None).get("/api/v1/tenants/").status_code == 401


def test_any_member_lists_the_members_and_no_one_sees_their_emails(api_for, users) -> None:  # type: ignore[no-untyped-def]
    """Not even the tenant's admins: they may add any account, so an address shown to them would
    be any user's address (add them, read it, remove them again)."""
    for user in users.values():
        user.email = f"{user.username}@example.org"
        user.save()
    expected = [
        ("alice", "member", "Member"),
        ("bob", "member", "Member"),
        ("victor", "viewer", "Viewer"),
        ("vision-admin", "admin", "Tenant admin"),
    ]
    for username in ("alice", "victor", "vision-admin"):
        listed = api_for(username).get(MEMBERS).json()
        assert listed["count"] == 4
        assert [(m["username"], m["role"], m["role_label"]) for m in listed["results"]] == expected
        assert [sorted(m) for m in listed["results"]] == [["role", "role_label", "username"]] * 4


@pytest.mark.parametrize(("username", "role"), [("alice", "member"), ("victor", "viewer")])
def test_members_and_viewers_may_not_change_members(api_for, username, role) -> None:  # type: ignore[no-untyped-def]
    client = api_for(username)
    refused = [
        client.post(MEMBERS, {"username": "carol", "role": "member"}, format="json"),
        client.post(MEMBERS, {"username": "no such user", "role": "nonsense"}, format="json"),
        client.patch(member("bob"), {"role": "admin"}, format="json"),
        client.patch(member(username), {"role": "admin"}, format="json"),
        client.delete(member("bob")),
    ]
    for response in refused:
        assert response.status_code == 403, response.content
        assert response.json() == {"detail": "Only an admin of tenant vision may change its members."}
    assert (role_of("carol"), role_of("bob"), role_of(username)) == (None, "member", role)
    assert member_changes() == []
    # Refused writes are audited and counted towards security alerts, as everywhere in the API.
    assert sorted(AuditEntry.objects.filter(action__endswith=".denied").values_list("action", flat=True)) == [
        "tenant-member.create.denied",
        "tenant-member.create.denied",
        "tenant-member.destroy.denied",
        "tenant-member.partial_update.denied",
        "tenant-member.partial_update.denied",
    ]


@pytest.mark.parametrize("outsider", ["carol", "admin", "nobody"])
def test_another_tenant_answers_every_endpoint_as_one_that_does_not_exist(api_for, outsider) -> None:  # type: ignore[no-untyped-def]
    """A speech member, the cluster admin who belongs to no tenant, and a user of none."""
    client = api_for(outsider)
    for tenant in ("vision", "no-such-tenant"):
        base = f"/api/v1/tenants/{tenant}/members/"
        answers = [
            client.get(base),
            client.post(base, {"username": "dave", "role": "member"}, format="json"),
            client.patch(f"{base}alice/", {"role": "viewer"}, format="json"),
            client.delete(f"{base}alice/"),
        ]
        assert [(a.status_code, a.json()) for a in answers] == [
            (404, {"detail": "No such tenant among yours."})
        ] * 4
    assert "vision" not in [t["name"] for t in client.get("/api/v1/tenants/").json()["results"]]
    assert (role_of("dave"), role_of("alice")) == (None, "member")
    assert member_changes() == []


def test_anonymous_callers_get_nothing(api_for) -> None:  # type: ignore[no-untyped-def]
    client = api_for(None)
    assert client.get(MEMBERS).status_code == 401
    assert client.post(MEMBERS, {"username": "carol", "role": "member"}, format="json").status_code == 401
    assert client.patch(member("alice"), {"role": "admin"}, format="json").status_code == 401
    assert client.delete(member("alice")).status_code == 401


def test_the_tenant_admin_adds_changes_and_removes_members_with_audit_entries(api_for, users) -> None:  # type: ignore[no-untyped-def]
    users["carol"].email = "carol@example.org"
    users["carol"].save()
    admin = api_for("vision-admin")

    added = admin.post(MEMBERS, {"username": "carol", "role": "viewer"}, format="json")
    assert added.status_code == 201, added.content
    # carol belongs to speech only: adding her tells the admin of vision nothing about her address.
    assert added.json() == {"username": "carol", "role": "viewer", "role_label": "Viewer"}
    assert role_of("carol") == "viewer" and role_of("carol", "speech") == "member"
    assert [t["name"] for t in api_for("carol").get("/api/v1/tenants/").json()["results"]] == [
        "speech",
        "vision",
    ]

    changed = admin.patch(member("carol"), {"role": "member"}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json() == {"username": "carol", "role": "member", "role_label": "Member"}
    assert role_of("carol") == "member"

    assert admin.delete(member("carol")).status_code == 204
    assert role_of("carol") is None and role_of("carol", "speech") == "member"

    entries = AuditEntry.objects.filter(action__startswith="member.").order_by("id")
    assert [(e.action, e.detail, e.actor, e.tenant.name) for e in entries] == [
        ("member.add", "carol as viewer", users["vision-admin"], "vision"),
        ("member.role", "carol: viewer -> member", users["vision-admin"], "vision"),
        ("member.remove", "carol (was member)", users["vision-admin"], "vision"),
    ]


def test_a_role_set_again_changes_nothing_and_records_nothing(api_for) -> None:  # type: ignore[no-untyped-def]
    response = api_for("vision-admin").patch(member("bob"), {"role": "member"}, format="json")
    assert (response.status_code, response.json()["role"]) == (200, "member")
    assert member_changes() == []


def test_refused_additions_name_the_field(api_for) -> None:  # type: ignore[no-untyped-def]
    admin = api_for("vision-admin")
    cases = [
        ({"username": "ghost", "role": "member"}, {"username": ["No user named 'ghost'."]}),
        (
            {"username": "bob", "role": "viewer"},
            {"username": ["bob is already a member of vision; change their role instead."]},
        ),
        ({"username": "carol", "role": "owner"}, {"role": ['"owner" is not a valid choice.']}),
        ({"role": "member"}, {"username": ["This field is required."]}),
    ]
    for body, errors in cases:
        response = admin.post(MEMBERS, body, format="json")
        assert (response.status_code, response.json()) == (400, errors), body
    assert (role_of("carol"), role_of("bob")) == (None, "member")
    assert member_changes() == []


def test_a_deactivated_account_is_refused_as_one_the_portal_does_not_know(api_for, users) -> None:  # type: ignore[no-untyped-def]
    """dave belongs to speech, nobody to no tenant; deactivated, each reads as no user at all."""
    for username in ("dave", "nobody"):
        users[username].is_active = False
        users[username].save()
    admin = api_for("vision-admin")
    for username in ("dave", "nobody", "ghost"):
        response = admin.post(MEMBERS, {"username": username, "role": "member"}, format="json")
        assert (response.status_code, response.json()) == (
            400,
            {"username": [f"No user named {username!r}."]},
        ), username
    assert (role_of("dave"), role_of("nobody"), role_of("dave", "speech")) == (None, None, "member")
    assert member_changes() == []


def test_refused_changes_name_the_field(api_for) -> None:  # type: ignore[no-untyped-def]
    admin = api_for("vision-admin")
    response = admin.patch(member("bob"), {"role": "owner"}, format="json")
    assert (response.status_code, response.json()) == (400, {"role": ['"owner" is not a valid choice.']})
    response = admin.patch(member("bob"), {}, format="json")
    assert (response.status_code, response.json()) == (400, {"role": ["This field is required."]})
    # carol exists, but is not a member of vision: nothing to change or remove.
    for response in (
        admin.patch(member("carol"), {"role": "admin"}, format="json"),
        admin.delete(member("carol")),
    ):
        assert (response.status_code, response.json()) == (
            404,
            {"detail": "Tenant vision has no member named 'carol'."},
        )
    assert (role_of("bob"), role_of("carol"), role_of("carol", "speech")) == ("member", None, "member")
    assert member_changes() == []


@pytest.mark.parametrize("deactivated_admin", [False, True], ids=["only-admin", "another-admin-deactivated"])
def test_the_last_active_admin_can_be_neither_demoted_nor_removed(api_for, users, deactivated_admin) -> None:  # type: ignore[no-untyped-def]
    """With bob an admin of vision too but his account deactivated, he cannot manage the
    tenant, so vision-admin is still its last admin and may neither step down nor leave."""
    if deactivated_admin:
        Membership.objects.filter(tenant__name="vision", user=users["bob"]).update(role=Role.ADMIN)
        users["bob"].is_active = False
        users["bob"].save()
    admin = api_for("vision-admin")
    message = "vision-admin is the last admin of vision; make another member an admin first."
    demoted = admin.patch(member("vision-admin"), {"role": "member"}, format="json")
    assert (demoted.status_code, demoted.json()) == (400, {"role": [message]})
    removed = admin.delete(member("vision-admin"))
    assert (removed.status_code, removed.json()) == (400, {"non_field_errors": [message]})
    assert role_of("vision-admin") == "admin"
    assert member_changes() == []
    if deactivated_admin:
        # The deactivated admin may still be demoted or removed: he is not the one it keeps.
        assert role_of("bob") == "admin"
        assert admin.patch(member("bob"), {"role": "member"}, format="json").status_code == 200
        assert admin.delete(member("bob")).status_code == 204
        assert role_of("bob") is None


def test_an_admin_may_step_down_while_another_admin_remains(api_for) -> None:  # type: ignore[no-untyped-def]
    admin = api_for("vision-admin")
    assert admin.patch(member("bob"), {"role": "admin"}, format="json").status_code == 200
    stepped_down = admin.patch(member("vision-admin"), {"role": "member"}, format="json")
    assert (stepped_down.status_code, stepped_down.json()["role"]) == (200, "member")
    # No longer an admin: no more changes; and bob, now the last admin, cannot leave.
    assert admin.patch(member("bob"), {"role": "member"}, format="json").status_code == 403
    bob = api_for("bob")
    assert bob.delete(member("bob")).status_code == 400
    # bob removes the former admin, then makes alice an admin and leaves himself.
    assert bob.delete(member("vision-admin")).status_code == 204
    assert bob.patch(member("alice"), {"role": "admin"}, format="json").status_code == 200
    assert bob.delete(member("bob")).status_code == 204
    assert (role_of("vision-admin"), role_of("bob"), role_of("alice")) == (None, None, "admin")
    assert [action for action, _ in member_changes()] == [
        "member.role",
        "member.role",
        "member.remove",
        "member.role",
        "member.remove",
    ]


def test_a_removed_user_no_longer_sees_the_tenant_but_their_jobs_stay(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    job = alice.post("/api/v1/jobs/", small_job, format="json").json()["id"]
    assert "vision" in [vc["name"] for vc in alice.get("/api/v1/virtual-clusters/").json()["results"]]

    assert api_for("vision-admin").delete(member("alice")).status_code == 204

    assert [vc["name"] for vc in alice.get("/api/v1/virtual-clusters/").json()["results"]] == []
    assert alice.get("/api/v1/jobs/").json()["count"] == 0
    assert alice.get(f"/api/v1/jobs/{job}/").status_code == 404
    assert alice.get("/api/v1/tenants/").json()["count"] == 0
    assert alice.get(MEMBERS).status_code == 404
    assert alice.post("/api/v1/jobs/", small_job, format="json").status_code == 400
    # The job stays with the tenant, whose admins manage it.
    admin = api_for("vision-admin")
    assert admin.get(f"/api/v1/jobs/{job}/").json()["owner"] == "alice"
    assert admin.post(f"/api/v1/jobs/{job}/cancel/").status_code == 200


def test_member_changes_are_throttled(api_for, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from portal.lib.throttling import WriteThrottle

    monkeypatch.setattr(WriteThrottle, "THROTTLE_RATES", {**WriteThrottle.THROTTLE_RATES, "members": "2/min"})
    admin = api_for("vision-admin")
    codes = [
        admin.patch(member("bob"), {"role": role}, format="json").status_code for role in ("viewer", "member")
    ]
    assert codes == [200, 200]
    assert admin.delete(member("bob")).status_code == 429
    assert admin.get(MEMBERS).status_code == 200  # reading is never throttled
    assert role_of("bob") == "member"


def waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db(transaction=True)
def test_two_admins_demoting_each_other_at_once_leave_one_admin(users) -> None:  # type: ignore[no-untyped-def]
    """The second change waits for the first one's locks, then sees it: bob, demoted a moment
    ago, may change nothing. Without the locks each would see the other still an admin, and
    both would pass the last-admin check."""
    from portal.accounts.services import MemberDenied, change_member_role

    vision = Tenant.objects.get(name="vision")
    Membership.objects.filter(tenant=vision, user=users["bob"]).update(role=Role.ADMIN)
    first_changed, second_done = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                change_member_role(vision, users["vision-admin"], "bob", Role.MEMBER)
                first_changed.set()
                # Commit once the second change waits for the lock (or, without one, is done).
                deadline = threading.Event()
                for _ in range(100):
                    if second_done.is_set() or waiting_on_a_lock():
                        break
                    deadline.wait(0.05)
        finally:
            connections.close_all()

    def second() -> None:
        first_changed.wait(10)
        try:
            change_member_role(vision, users["bob"], "vision-admin", Role.MEMBER)
            outcome["second"] = "changed"
        except MemberDenied:
            outcome["second"] = "denied"
        finally:
            second_done.set()
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert outcome == {"second": "denied"}
    assert (role_of("vision-admin"), role_of("bob")) == ("admin", "member")

"""`gpuportal tenants` and `gpuportal members` against the live portal: a tenant admin adds a
member, changes their role and removes them; refusals print the portal's words (a field's under
its name) and exit non-zero; a member lists but may not change; another tenant reads as not
found.

The cast (tests/conftest.py): vision has vision-admin (admin), alice and bob (members) and victor
(viewer); speech has speech-admin, carol and dave."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuportal.cli import with_members_list_implied
from portal.accounts.models import Membership
from portal.accounts.services import create_api_token

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tokens(users: dict[str, Any]) -> dict[str, str]:
    names = ("vision-admin", "alice", "carol")
    return {name: create_api_token(users[name], "members test")[1] for name in names}


def role_of(username: str, tenant: str = "vision") -> str | None:
    membership = Membership.objects.filter(user__username=username, tenant__name=tenant).first()
    return membership.role if membership is not None else None


def test_tenants_lists_yours_with_your_role(run_cli: Any, tokens: dict[str, str]) -> None:
    listed = run_cli(tokens["alice"], "tenants")
    assert listed.returncode == 0, listed.stderr
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["TENANT", "DISPLAY", "NAME", "ROLE"],
        ["vision", "Vision", "member"],
    ]
    as_json = run_cli(tokens["vision-admin"], "tenants", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == [
        {"name": "vision", "display_name": "Vision", "role": "admin", "role_label": "Tenant admin"}
    ]


def test_an_admin_adds_a_member_changes_their_role_and_removes_them(
    run_cli: Any, tokens: dict[str, str], users: dict[str, Any]
) -> None:
    admin = tokens["vision-admin"]
    users["carol"].email = "carol@example.org"
    users["carol"].save()

    added = run_cli(admin, "members", "add", "vision", "carol", "--role", "viewer")
    assert added.returncode == 0, added.stderr
    assert (added.stdout, added.stderr.strip()) == ("", "Added carol to vision as a viewer.")
    assert role_of("carol") == "viewer"

    promoted = run_cli(admin, "members", "set-role", "vision", "carol", "admin")
    assert promoted.returncode == 0, promoted.stderr
    assert (promoted.stdout, promoted.stderr.strip()) == ("", "carol is now an admin of vision.")
    assert role_of("carol") == "admin"

    changed = run_cli(admin, "members", "set-role", "vision", "carol", "member", "-o", "json")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout) == {"username": "carol", "role": "member", "role_label": "Member"}
    assert role_of("carol") == "member"

    # `members TENANT` is the list; no one's address, not even for an admin.
    listed = run_cli(admin, "members", "vision")
    assert listed.returncode == 0, listed.stderr
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["USER", "ROLE"],
        ["alice", "member"],
        ["bob", "member"],
        ["carol", "member"],
        ["victor", "viewer"],
        ["vision-admin", "admin"],
    ]
    as_json = run_cli(admin, "members", "vision", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert "carol@example.org" not in as_json.stdout
    assert {tuple(sorted(m)) for m in json.loads(as_json.stdout)} == {("role", "role_label", "username")}

    removed = run_cli(admin, "members", "remove", "vision", "carol")
    assert removed.returncode == 0, removed.stderr
    assert (removed.stdout, removed.stderr.strip()) == ("", "Removed carol from vision.")
    assert role_of("carol") is None
    assert role_of("carol", "speech") == "member"  # her own tenant keeps her


def test_refusals_print_the_portal_s_words_and_exit_non_zero(run_cli: Any, tokens: dict[str, str]) -> None:
    admin = tokens["vision-admin"]
    unknown = run_cli(admin, "members", "add", "vision", "ghost")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [
        "error: the portal refused to add ghost to vision",
        "  username: No user named 'ghost'.",
    ]
    already = run_cli(admin, "members", "add", "vision", "bob", "--role", "admin")
    assert already.returncode == 2
    assert "  username: bob is already a member of vision; change their role instead." in already.stderr

    last_admin = "vision-admin is the last admin of vision; make another member an admin first."
    demoted = run_cli(admin, "members", "set-role", "vision", "vision-admin", "member")
    assert demoted.returncode == 2
    assert demoted.stderr.splitlines() == [
        "error: the portal refused to make vision-admin a member of vision",
        f"  role: {last_admin}",
    ]
    # Removing the last admin is refused as a whole, not on a field: the message is the error.
    leaving = run_cli(admin, "members", "remove", "vision", "vision-admin")
    assert leaving.returncode == 2
    assert leaving.stderr.splitlines() == [f"error: {last_admin}"]
    assert role_of("vision-admin") == "admin" and role_of("bob") == "member"

    nobody = run_cli(admin, "members", "set-role", "vision", "zed", "viewer")
    assert nobody.returncode == 3
    assert nobody.stderr.strip() == "error: Tenant vision has no member named 'zed'."
    bad_role = run_cli(admin, "members", "set-role", "vision", "bob", "owner")
    assert bad_role.returncode == 2 and "invalid choice: 'owner'" in bad_role.stderr
    assert role_of("bob") == "member"


def test_a_member_lists_the_members_but_may_not_change_them(run_cli: Any, tokens: dict[str, str]) -> None:
    alice = tokens["alice"]
    listed = run_cli(alice, "members", "vision")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["USER", "ROLE"]
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [
        "alice",
        "bob",
        "victor",
        "vision-admin",
    ]
    as_json = json.loads(run_cli(alice, "members", "-o", "json", "vision").stdout)
    assert as_json[0] == {"username": "alice", "role": "member", "role_label": "Member"}

    refused = run_cli(alice, "members", "remove", "vision", "bob")
    assert refused.returncode == 4
    assert refused.stderr.strip() == "error: Only an admin of tenant vision may change its members."
    assert role_of("bob") == "member"


def test_another_tenant_reads_as_one_that_does_not_exist(run_cli: Any, tokens: dict[str, str]) -> None:
    for tenant in ("vision", "no-such-tenant"):
        listed = run_cli(tokens["carol"], "members", "list", tenant)
        assert listed.returncode == 3
        assert listed.stderr.strip() == "error: No such tenant among yours."
    # An admin of one tenant is nobody in another.
    added = run_cli(tokens["vision-admin"], "members", "add", "speech", "alice")
    assert added.returncode == 3 and "No such tenant among yours." in added.stderr
    assert role_of("alice", "speech") is None


@pytest.mark.parametrize(
    ("typed", "parsed"),
    [
        ("members vision", "members list vision"),
        ("members -o json vision", "members list -o json vision"),
        ("members", "members list"),
        ("members list vision", "members list vision"),
        ("members add vision carol", "members add vision carol"),
        ("members remove vision carol", "members remove vision carol"),
        ("members --help", "members --help"),
        ("templates show vision", "templates show vision"),
    ],
)
def test_members_tenant_is_short_for_members_list_tenant(typed: str, parsed: str) -> None:
    assert with_members_list_implied(typed.split()) == parsed.split()

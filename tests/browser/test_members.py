"""A tenant admin manages the tenant's members on the Members page: adds a user (an unknown name
refused under its field), changes their role, is refused stepping down as the only admin, and
removes them. A member of two tenants picks one and sees its list without any of the controls; a
tenant that is none of theirs says so.

The cast (tests/conftest.py): vision has vision-admin (admin), alice and bob (members) and victor
(viewer); carol belongs to speech."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST

LAST_ADMIN = "vision-admin is the last admin of vision; make another member an admin first."


@sync_to_async
def role_of(username: str) -> str | None:
    """A user's role in vision, read in a worker thread (the ORM must not run in the event loop)."""
    from django.db import connection

    from portal.accounts.models import Membership

    try:
        membership = Membership.objects.filter(user__username=username, tenant__name="vision").first()
        return membership.role if membership is not None else None
    finally:
        connection.close()


@sync_to_async
def give_address(username: str) -> None:
    from django.contrib.auth.models import User
    from django.db import connection

    try:
        User.objects.filter(username=username).update(email=f"{username}@example.org")
    finally:
        connection.close()


async def test_an_admin_adds_changes_and_removes_a_member(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    await give_address("carol")  # of speech only: nothing here shows it to the admin of vision
    await sign_in(page, live_stack["http"], "vision-admin")
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Members").click()
    await expect(page.get_by_role("heading", name="Members of Vision")).to_be_visible(timeout=LONG)
    assert page.url.endswith("/tenants/vision/members")
    members = page.get_by_role("region", name="Members", exact=True)
    await expect(members.get_by_role("row")).to_have_count(5, timeout=LONG)  # the header and four members

    # A name the portal does not know is refused under the field.
    await page.get_by_label("User name").fill("ghost")
    await page.get_by_role("button", name="Add member").click()
    username_field = page.locator(".field", has=page.get_by_label("User name"))
    await expect(username_field.locator(".field-error")).to_have_text("No user named 'ghost'.", timeout=LONG)

    await page.get_by_label("User name").fill("carol")
    await page.get_by_label("Role", exact=True).select_option("viewer")
    await page.get_by_role("button", name="Add member").click()
    await expect(page.get_by_role("status").filter(has_text="Added")).to_have_text(
        "Added carol as Viewer.", timeout=LONG
    )
    carol_role = page.get_by_label("Role of carol")
    await expect(carol_role).to_have_value("viewer", timeout=LONG)
    await expect(page.locator(".field.has-error")).to_have_count(0)
    # Not even to an admin (whose role selects are up by now): no Email column, no address.
    await expect(members.get_by_role("columnheader")).to_have_count(3)  # User, Role, the actions
    await expect(members.get_by_role("columnheader", name="Email")).to_have_count(0)
    await expect(page.locator("body")).not_to_contain_text("carol@example.org")
    assert await role_of("carol") == "viewer"

    # The role is saved on change, with no button.
    async with page.expect_response(lambda r: r.request.method == "PATCH", timeout=LONG) as saved:
        await carol_role.select_option("member")
    assert (await saved.value).status == 200
    await expect(carol_role).to_have_value("member")
    assert await role_of("carol") == "member"

    # The only admin may not step down: the portal's words under their role, which stays admin.
    own_role = page.get_by_label("Role of vision-admin")
    await own_role.select_option("member")
    own_row = members.get_by_role("row", name="vision-admin")
    await expect(own_row.locator(".field-error")).to_have_text(LAST_ADMIN, timeout=LONG)
    await expect(own_role).to_have_value("admin")
    assert await role_of("vision-admin") == "admin"

    await page.get_by_role("button", name="Remove carol").click()
    await expect(page.get_by_label("Role of carol")).to_have_count(0, timeout=LONG)
    await expect(members.get_by_role("row")).to_have_count(5)
    assert await role_of("carol") is None

    # It fits a phone, as every page does (test_pages_fit_a_phone_screen).
    await page.set_viewport_size({"width": 390, "height": 844})
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the members page is {overflow} px wider than a phone screen"


@sync_to_async
def make_viewer_of_speech(username: str) -> None:
    from django.contrib.auth.models import User
    from django.db import connection

    from portal.accounts.choices import Role
    from portal.accounts.models import Membership, Tenant

    try:
        user = User.objects.get(username=username)
        Membership.objects.create(user=user, tenant=Tenant.objects.get(name="speech"), role=Role.VIEWER)
    finally:
        connection.close()


async def test_a_member_sees_the_members_but_no_controls(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    await make_viewer_of_speech("alice")  # two tenants: the page offers a choice
    await sign_in(page, live_stack["http"], "alice")
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Members").click()
    await expect(page.get_by_role("heading", name="Members of Speech")).to_be_visible(timeout=LONG)
    await page.get_by_label("Tenant").select_option("vision")
    await expect(page.get_by_role("heading", name="Members of Vision")).to_be_visible(timeout=LONG)
    assert page.url.endswith("/tenants/vision/members")

    members = page.get_by_role("region", name="Members", exact=True)
    await expect(members.get_by_role("row", name="vision-admin")).to_contain_text(
        "Tenant admin", timeout=LONG
    )
    await expect(members.get_by_role("row", name="alice")).to_contain_text("(you)")
    await expect(members.get_by_role("row", name="victor")).to_contain_text("Viewer")
    await expect(members.get_by_role("row")).to_have_count(5)
    for control in (
        page.get_by_role("region", name="Add member"),
        page.get_by_label("User name"),
        page.get_by_role("button", name="Remove bob"),
        members.get_by_role("combobox"),  # no role select, in any row
        members.get_by_role("columnheader", name="Email"),
    ):
        await expect(control).to_have_count(0)
    await expect(members).to_contain_text("You are a member of Vision: its admins add and remove members")

    # A tenant that is none of theirs says so plainly.
    await page.goto(live_stack["http"] + "/tenants/nlp/members")
    await expect(page.get_by_role("alert")).to_contain_text("No such tenant among yours.", timeout=LONG)
    await expect(page.get_by_role("row")).to_have_count(0)

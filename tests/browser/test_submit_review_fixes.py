"""The submit page and the session: a clone shows the spec as it was written, the priority
classes a member may not use are marked, templates are deleted from the picker, and a sign-out in
another tab brings the sign-in page."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in
from tests.browser.test_submit_templates import save_template

pytestmark = BROWSER_TEST


async def test_a_clone_shows_the_command_and_time_limit_as_written(
    live_stack: dict[str, Any], users: Any, submit_as: Any, page: Page
) -> None:
    job = await submit_as("alice", name="as-written", command="sleep 600", time_limit="90m")
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/submit?clone={job['id']}")
    await expect(page.get_by_label("Command", exact=True)).to_have_value("sleep 600", timeout=LONG)
    await expect(page.get_by_role("radio", name=re.compile("a shell"))).to_be_checked()
    await expect(page.get_by_label("Time limit")).to_have_value("90m")

    # A member may not use production (for vision's admins): disabled, with the reason.
    priority = page.get_by_label("Priority")
    production = priority.locator("option", has_text="production")
    await expect(production).to_be_disabled()
    await expect(production).to_contain_text("only admins of vision may use it")
    # From YAML back to the form: the classes only, no extra "default" entry.
    await page.get_by_role("tab", name="YAML").click()
    await page.get_by_role("tab", name="Form").click()
    texts = await page.get_by_label("Priority").locator("option").all_inner_texts()
    assert all(re.match(r"^\w+ \(\d+", text) for text in texts), texts


async def test_templates_are_deleted_by_their_owner_and_shared_ones_by_a_tenant_admin(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    spec = {"name": "t", "vc": "vision", "flavor": "s-A100", "command": "sleep 1"}
    await sync_to_async(save_template)(users["alice"], {"name": "mine", "spec": spec})
    await sync_to_async(save_template)(users["alice"], {"name": "ours", "spec": spec, "shared": True})

    await sign_in(page, live_stack["http"], "alice")
    await page.goto(live_stack["http"] + "/submit")
    picker = page.get_by_label("Template", exact=True)
    await expect(picker.locator("option", has_text="mine")).to_have_count(1, timeout=LONG)
    await picker.select_option(label="mine")
    await page.get_by_role("button", name="Delete template").click()
    confirm = page.get_by_role("group", name="Confirm delete")
    await expect(confirm).to_contain_text("Delete template mine for good?")
    await confirm.get_by_role("button", name="Keep").click()
    await page.get_by_role("button", name="Delete template").click()
    await page.get_by_role("button", name="Yes, delete").click()
    await expect(page.get_by_role("status").filter(has_text="Deleted template mine.")).to_be_visible(
        timeout=LONG
    )
    await expect(picker.locator("option", has_text="mine")).to_have_count(0)

    # A tenant admin deletes alice's shared template.
    await page.get_by_role("button", name="Sign out").click()
    await sign_in(page, live_stack["http"], "vision-admin")
    await page.goto(live_stack["http"] + "/submit")
    await expect(picker.locator("option", has_text="shared by alice")).to_have_count(1, timeout=LONG)
    await picker.select_option(label="ours (shared by alice)")
    await page.get_by_role("button", name="Delete template").click()
    await page.get_by_role("button", name="Yes, delete").click()
    await expect(page.get_by_role("status").filter(has_text="Deleted template ours.")).to_be_visible(
        timeout=LONG
    )


async def test_signing_out_in_another_tab_brings_the_sign_in_page(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(base + "/jobs")
    await expect(page.get_by_role("status", name="Live updates")).to_have_text("Live", timeout=LONG)

    other = await page.context.new_page()
    await other.goto(base + "/")
    await other.get_by_role("button", name="Sign out").click()
    await expect(other.get_by_role("heading", name="Sign in to GPU Portal")).to_be_visible(timeout=LONG)

    # The first tab learns of it from its live socket, and asks for a sign-in on the same page.
    await expect(page.get_by_role("heading", name="Sign in to GPU Portal")).to_be_visible(timeout=LONG)
    await expect(page.get_by_role("status")).to_contain_text("You were signed out")
    assert page.url.endswith("/jobs")
    await page.get_by_label("User name").fill("alice")
    await page.get_by_label("Password").fill("alice-pass")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Jobs")).to_be_visible(timeout=LONG)
    await other.close()

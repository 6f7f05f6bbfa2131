"""Job templates on the submit page: the form saved as a template (refused with the portal's
words, the spec's at its fields), and after a reload loaded back from the picker."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


def save_template(user: Any, body: dict[str, Any]) -> None:
    """Saves a template over the REST API in-process (run in a worker thread: the ORM must not
    run in the test's event loop)."""
    from django.db import connection
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    try:
        response = client.post("/api/v1/templates/", body, format="json")
    finally:
        connection.close()
    assert response.status_code == 201, response.content


async def test_save_the_form_as_a_template_and_load_it_again(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(live_stack["http"] + "/submit")
    await page.get_by_label("Name", exact=True).fill("train-big")
    await page.get_by_role("radio", name=re.compile(r"^m-A100")).check()

    # The form fits a phone with the dialog open.
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.get_by_role("button", name="Save as template").click()
    dialog = page.get_by_role("form", name="Save as template")
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the submit page is {overflow}px wider than a phone"
    await page.set_viewport_size({"width": 1280, "height": 900})

    # No command yet: refused as a submission would be, the message at the Command field.
    await dialog.get_by_label("Template name").fill("big")
    await dialog.get_by_role("button", name="Save template").click()
    await expect(dialog.get_by_role("alert")).to_contain_text("The spec has errors", timeout=LONG)
    await expect(page.locator(".field.has-error")).to_contain_text("The command must not be empty.")

    await page.get_by_label("Command", exact=True).fill("python train.py --big")
    await dialog.get_by_label("Description").fill("Four GPUs")
    await dialog.get_by_label("Share with everyone in the tenant").check()
    await dialog.get_by_role("button", name="Save template").click()
    await expect(page.get_by_role("status").filter(has_text="Saved template big")).to_contain_text(
        "shared with tenant vision", timeout=LONG
    )

    await page.reload()
    picker = page.get_by_label("Template", exact=True)
    await expect(picker.locator("option", has_text="big: Four GPUs")).to_have_count(1, timeout=LONG)
    await expect(page.get_by_label("Name", exact=True)).not_to_have_value("train-big")
    await picker.select_option(label="big: Four GPUs")
    await expect(page.get_by_label("Name", exact=True)).to_have_value("train-big")
    await expect(page.get_by_label("Command", exact=True)).to_have_value("python train.py --big")
    await expect(page.get_by_role("radio", name=re.compile(r"^m-A100"))).to_be_checked()

    # The name is taken now: the dialog says so at its field.
    await page.get_by_role("button", name="Save as template").click()
    await dialog.get_by_label("Template name").fill("big")
    await dialog.get_by_role("button", name="Save template").click()
    await expect(dialog.get_by_text("You already have a template named 'big'.")).to_be_visible(timeout=LONG)


async def test_a_peer_sees_a_shared_template_with_its_owner(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    spec = {"name": "eval", "vc": "vision", "flavor": "s-A100", "command": "python eval.py"}
    await sync_to_async(save_template)(users["alice"], {"name": "nightly", "spec": spec, "shared": True})
    await sign_in(page, live_stack["http"], "bob")
    await page.goto(live_stack["http"] + "/submit")
    picker = page.get_by_label("Template", exact=True)
    await picker.select_option(label="nightly (shared by alice)")
    await expect(page.get_by_label("Command", exact=True)).to_have_value("python eval.py")

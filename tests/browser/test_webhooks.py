"""A researcher adds a webhook on the Tokens & webhooks page, tests it against a real receiver on
loopback, and sees each test's outcome; then disables and deletes it."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in
from tests.webhook_receiver import running_receiver

pytestmark = BROWSER_TEST


async def test_add_test_disable_and_delete_a_webhook(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    with running_receiver() as receiver:
        await sign_in(page, live_stack["http"], "alice")
        nav = page.get_by_role("navigation", name="Main")
        await nav.get_by_role("link", name="Tokens & webhooks").click()
        url = page.get_by_label("URL")
        await url.fill("ftp://example.org/hook")  # refused before any look-up
        await page.get_by_role("button", name="Add webhook").click()
        refused = page.get_by_text("Only http and https URLs can be webhooks.")
        await expect(refused).to_be_visible(timeout=LONG)

        hook = receiver.url + "/browser"
        await url.fill(hook)
        await page.get_by_label("Format").select_option("json")
        await page.get_by_label("Secret (optional)").fill("s3cret")
        await page.get_by_role("button", name="Add webhook").click()
        row = page.get_by_role("row", name=hook)
        await expect(row).to_contain_text("none yet", timeout=LONG)
        await expect(row).to_contain_text("JSON event")

        await page.get_by_role("button", name=f"Test {hook}").click()
        await expect(page.get_by_role("status").filter(has_text="Test")).to_have_text(
            "Test delivered: HTTP 200.", timeout=LONG
        )
        await expect(row).to_contain_text("HTTP 200")
        [delivery] = receiver.to("/browser")
        assert delivery.json()["event"] == "webhook.test"
        timestamp = delivery.headers["X-GPU-Portal-Timestamp"]
        mac = hmac.new(b"s3cret", timestamp.encode() + b"." + delivery.body, hashlib.sha256).hexdigest()
        assert delivery.headers["X-GPU-Portal-Signature"] == f"sha256={mac}"

        receiver.answer(404)
        await page.get_by_role("button", name=f"Test {hook}").click()
        await expect(page.get_by_role("status").filter(has_text="Test")).to_have_text(
            "Test failed: HTTP 404.", timeout=LONG
        )
        await expect(row).to_contain_text("failed")

        await page.get_by_role("button", name=f"Disable {hook}").click()
        await expect(row).to_contain_text("disabled", timeout=LONG)
        await page.get_by_role("button", name=f"Delete {hook}").click()
        await expect(page.get_by_text("No webhooks yet.")).to_be_visible(timeout=LONG)

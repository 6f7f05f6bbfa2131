"""A signed-out visitor: every page opens the sign-in page, and the browser's console shows no
error. The app asks who is signed in on every visit; nobody is an answer (204), not a refused
request the browser would log as a failed resource load."""

from __future__ import annotations

from typing import Any

from playwright.async_api import ConsoleMessage, Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


async def test_signed_out_pages_open_without_a_console_error(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    errors: list[str] = []

    def heard(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"{message.text} ({message.location.get('url', '')})")

    page.on("console", heard)
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in_page = page.get_by_role("heading", name="Sign in to GPU Portal")
    for path in ("/", "/jobs", "/tenants/vision/members"):
        async with page.expect_response(lambda r: r.url.endswith("/api/v1/session/")) as asked:
            await page.goto(base + path)
        assert (await asked.value).status == 204
        await expect(sign_in_page).to_be_visible(timeout=LONG)
        await expect(page.get_by_label("Password")).to_be_visible()

    # Signed in and out again, the page reloaded: still nobody, and still no error.
    await sign_in(page, base, "alice")
    await expect(page.get_by_role("status", name="Live updates")).to_have_text("Live", timeout=LONG)
    await page.get_by_role("button", name="Sign out").click()
    await expect(sign_in_page).to_be_visible(timeout=LONG)
    await page.reload()
    await expect(sign_in_page).to_be_visible(timeout=LONG)
    assert errors == []

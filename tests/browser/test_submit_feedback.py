"""What the submit page and a VC page say when something is wrong: a refusal at the bottom of the
form is scrolled to and focused; job ids that are not numbers are refused before sending and
nested messages carry no internal keys; a viewer is not offered a submission; a VC that is none of
the user's shows one card and no empty lists."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


async def test_a_refused_submission_is_scrolled_to_and_focused(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    await page.set_viewport_size({"width": 1280, "height": 700})
    await sign_in(page, base, "alice")
    await page.goto(base + "/submit")
    submit = page.get_by_role("button", name="Submit job")
    await submit.scroll_into_view_if_needed()
    await submit.click()
    banner = page.locator("#submit-failure")
    await expect(banner).to_be_visible(timeout=LONG)
    await expect(banner).to_be_focused()
    await expect(banner).to_be_in_viewport()
    # Editing the spec clears the refusal: it was for the spec as it was.
    await page.get_by_label("Name", exact=True).fill("fixed")
    await expect(banner).to_have_count(0)


async def test_field_messages_are_in_words_and_bad_job_ids_are_refused_before_sending(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(base + "/submit")
    await page.get_by_label("Name", exact=True).fill("words")
    await page.get_by_label("Command", exact=True).fill("true")
    await page.get_by_label("Start after jobs").fill("abc, 99999")
    sent: list[str] = []
    page.on(
        "request", lambda r: sent.append(r.url) if r.method == "POST" and "/api/v1/jobs/" in r.url else None
    )
    await page.get_by_role("button", name="Submit job").click()
    await expect(page.locator("#f-after-error")).to_have_text(
        '"abc" is not a job id: give job numbers, such as 41, 42.', timeout=LONG
    )
    assert sent == []
    await page.get_by_label("Start after jobs").fill("")
    await page.get_by_label("Retries").fill("-5")
    await page.get_by_role("button", name="Submit job").click()
    await expect(page.locator("#f-retries-error")).to_be_visible(timeout=LONG)
    await expect(page.locator("#f-retries-error")).not_to_contain_text("limit:")


async def test_a_viewer_is_not_offered_a_submission(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    await sign_in(page, base, "victor")
    await expect(page.get_by_role("link", name="Submit a job")).to_have_count(0)
    await page.goto(base + "/submit")
    await expect(page.get_by_role("button", name="Submit job")).to_be_disabled(timeout=LONG)
    await expect(page.get_by_role("button", name="Check")).to_be_disabled()
    await expect(page.get_by_role("note")).to_contain_text("viewer")


async def test_a_vc_that_is_none_of_yours_shows_one_card(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(base + "/vcs/no-such-vc")
    await expect(page.get_by_text("No such virtual cluster among yours", exact=False)).to_be_visible(
        timeout=LONG
    )
    await expect(page.get_by_text("No job is waiting.")).to_have_count(0)
    await expect(page.get_by_text("Nothing running.")).to_have_count(0)
    await expect(page.get_by_role("button", name="Try again")).to_have_count(0)

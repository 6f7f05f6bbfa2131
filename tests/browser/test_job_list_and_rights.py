"""The job list and job page offer only what the portal allows, and follow the URL: a page past the
last after a bulk cancel moves to the last one, the Search and Owner fields follow the URL's
filters, Submit in the menu after a clone opens an empty form, and a viewer gets no job actions."""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


async def test_the_last_page_emptied_by_a_bulk_cancel_moves_to_the_page_before(
    live_stack: dict[str, Any], submit_as: Any, page: Page
) -> None:
    for n in range(26):  # 25 a page: the 26th on page 2
        await submit_as("alice", name=f"paged-{n}")
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(base + "/jobs?state=pending&owner=me&page=2")
    rows = page.locator("tr[data-job-id]")
    await expect(rows).to_have_count(1, timeout=LONG)
    await page.get_by_label("Select all jobs that can be cancelled").check()
    await page.get_by_role("button", name="Cancel selected").click()
    await page.get_by_role("button", name="Yes, cancel").click()
    await expect(page.get_by_role("status").filter(has_text="Cancelled 1 of 1.")).to_be_visible(timeout=LONG)
    # The page moves to page 1 (in place of page 2, which no longer exists) and shows its jobs.
    await expect(page).to_have_url(re.compile(r"/jobs\?state=pending&owner=me$"), timeout=LONG)
    await expect(rows).to_have_count(25, timeout=LONG)


async def test_the_search_fields_follow_the_urls_filters(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(base + "/jobs?owner=me&q=nothing-like-it")
    await expect(page.get_by_label("Search", exact=True)).to_have_value("nothing-like-it")
    await expect(page.get_by_label("Owner")).to_have_value("me")
    await page.get_by_role("navigation").get_by_role("link", name="Jobs", exact=True).click()
    await expect(page).to_have_url(re.compile(r"/jobs$"))
    await expect(page.get_by_label("Search", exact=True)).to_have_value("")
    await expect(page.get_by_label("Owner")).to_have_value("")


async def test_submit_in_the_menu_after_a_clone_opens_an_empty_form(
    live_stack: dict[str, Any], submit_as: Any, page: Page
) -> None:
    job = await submit_as("alice", name="clone-source")
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(base + f"/submit?clone={job['id']}")
    await expect(page.get_by_label("Name", exact=True)).to_have_value("clone-source", timeout=LONG)
    await page.get_by_role("navigation").get_by_role("link", name="Submit", exact=True).click()
    await expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()
    await expect(page.get_by_label("Name", exact=True)).not_to_have_value("clone-source")


async def test_a_viewer_gets_no_job_actions(live_stack: dict[str, Any], submit_as: Any, page: Page) -> None:
    job = await submit_as("alice", name="alices-job")
    base = live_stack["http"]
    # Its owner, a member of its tenant, manages it.
    await sign_in(page, base, "alice")
    await page.goto(base + f"/jobs/{job['id']}")
    await expect(page.get_by_role("heading", name="Why it is waiting")).to_be_visible(timeout=LONG)
    await expect(page.get_by_role("button", name="Cancel job")).to_be_visible()
    await expect(page.get_by_role("button", name="Hold", exact=True)).to_be_visible()
    await page.get_by_role("button", name="Sign out").click()

    # A viewer of the tenant only reads: no action the portal would refuse.
    await sign_in(page, base, "victor")
    await page.goto(base + f"/jobs/{job['id']}")
    await expect(page.get_by_role("heading", name="Why it is waiting")).to_be_visible(timeout=LONG)
    for name in ("Cancel job", "Hold", "Change", "Shell"):
        await expect(page.get_by_role("button", name=name, exact=True)).to_have_count(0)
    await expect(page.get_by_role("button", name=re.compile("^Move before"))).to_have_count(0)
    await page.goto(base + "/jobs")
    await expect(page.get_by_label(f"Select alices-job #{job['id']}")).to_be_disabled(timeout=LONG)
    await expect(page.get_by_label("Select all jobs that can be cancelled")).not_to_be_checked()

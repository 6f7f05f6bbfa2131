"""The usage page: GPU-hours per VC as a chart and a table, per user after a change of group,
a date range, and the CSV download of what is shown."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


def make_usage(users: dict[str, Any]) -> None:
    """alice 1 GPU-hour and bob 3 in VC vision, carol 2 in VC speech (another tenant)."""
    from django.db import connection

    from tests.client.test_usage_cli import job_with_usage

    try:
        job_with_usage(users["alice"], "vision", "a100-node-1", [0, 1], 30, 100.0, 400.0)
        job_with_usage(users["bob"], "vision", "a100-node-1", [2, 3, 4, 5], 45, 50.0, 300.0)
        job_with_usage(users["carol"], "speech", "a100-node-2", [0, 1], 60, 100.0, 400.0)
    finally:
        connection.close()


async def test_the_usage_page_shows_gpu_hours_per_vc_and_per_user(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    await sync_to_async(make_usage)(users)
    await sign_in(page, live_stack["http"], "alice")
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage").click()
    await expect(page.get_by_role("heading", name="GPU usage")).to_be_visible(timeout=LONG)

    per_vc = page.get_by_role("table", name="GPU usage per virtual cluster")
    vision = per_vc.get_by_role("row").filter(has=page.get_by_role("rowheader", name="vision", exact=True))
    await expect(vision.locator("td")).to_have_text(["2", "4.00", "2.50", "1.30"], timeout=LONG)
    await expect(per_vc.get_by_role("rowheader")).to_have_count(1)  # not the other tenant's VC
    await expect(page.get_by_role("img", name="vision: 4.00 GPU-hours, 2.50 used")).to_be_visible()

    await page.get_by_label("Group by").select_option("user")
    await expect(page).to_have_url(re.compile(r"/usage\?group=user$"))
    per_user = page.get_by_role("table", name="GPU usage per user")
    await expect(per_user.get_by_role("rowheader")).to_have_text(["bob", "alice"], timeout=LONG)
    bob = per_user.get_by_role("row").filter(has=page.get_by_role("rowheader", name="bob", exact=True))
    await expect(bob.locator("td")).to_have_text(["1", "3.00", "1.50", "0.90"])

    # The download is the API's CSV of the same report, with the browser's session.
    href = await page.get_by_role("link", name="Download CSV").get_attribute("href")
    assert href is not None and "format=csv" in href and "group=user" in href, href
    csv = await page.request.get(live_stack["http"] + href)
    assert csv.ok, await csv.text()
    assert (await csv.text()).splitlines()[1:] == ["bob,1,3.0,1.5,0.9", "alice,1,1.0,1.0,0.4"]

    # A period before the jobs has no usage; the default period has it again.
    await page.get_by_label("To (included)").fill("2020-01-31")
    await expect(page.get_by_text("No GPU usage in this period.")).to_be_visible(timeout=LONG)
    await page.get_by_role("button", name="Last 30 days").click()
    await expect(per_user.get_by_role("rowheader")).to_have_text(["bob", "alice"], timeout=LONG)

    # It fits a phone, as every page does (test_pages_fit_a_phone_screen).
    await page.set_viewport_size({"width": 390, "height": 844})
    await expect(per_user.get_by_role("rowheader")).to_have_count(2)
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"/usage is {overflow} px wider than a phone screen"

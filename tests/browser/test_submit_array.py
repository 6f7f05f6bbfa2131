"""Job arrays from the submit page: Copies queues one spec N times through the bulk endpoint, as
NAME-0 .. NAME-(N-1) with ARRAY_INDEX 0 .. N-1, and the endpoint's errors sit under the fields as
for a single job; nothing is queued when it refuses."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


def job_count() -> int:
    from django.db import connection

    from portal.jobs.models import Job

    try:
        return Job.objects.count()
    finally:
        connection.close()


async def test_three_copies_from_the_form_show_in_the_jobs_list(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(base + "/submit")
    await page.get_by_label("Name", exact=True).fill("sweep")
    await page.get_by_role("radio", name=re.compile(r"^s-A100")).check()
    await page.get_by_label("Command", exact=True).fill("sleep 600")
    copies = page.get_by_label("Copies")
    await expect(copies).to_have_value("1")
    await copies.fill("3")
    await expect(page.get_by_text("ARRAY_INDEX 0 to 2")).to_be_visible()
    # It fits a phone, Copies and all.
    await page.set_viewport_size({"width": 390, "height": 844})
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the submit page is {overflow} px wider than a phone screen"
    await page.get_by_role("button", name="Submit 3 jobs").click()

    done = page.get_by_role("region", name="Submitted")
    await expect(done.get_by_role("status")).to_have_text(
        re.compile(r"^Submitted 3 jobs: ids \d+\u2013\d+, named sweep-0 to sweep-2\.$"), timeout=LONG
    )
    await expect(page).to_have_url(re.compile("/submit$"))
    # Not twice by a second click: the button waits for an edit of the spec or the copies.
    await expect(page.get_by_role("button", name="Submitted")).to_be_disabled()
    await copies.fill("2")
    await expect(page.get_by_role("button", name="Submit 2 jobs")).to_be_enabled()
    await done.get_by_role("link", name="Show them in the jobs list").click()
    await expect(page).to_have_url(re.compile(r"/jobs\?q=sweep&owner=me$"))
    for i in range(3):
        await expect(page.get_by_role("link", name=f"sweep-{i}", exact=True)).to_be_visible(timeout=LONG)
    # Each copy has its index.
    for i in range(3):
        href = await page.get_by_role("link", name=f"sweep-{i}", exact=True).get_attribute("href")
        job = await (await page.request.get(f"{base}/api/v1{href}/")).json()
        assert job["spec"]["env"]["ARRAY_INDEX"] == str(i), job["spec"]


async def test_the_bulk_endpoints_errors_sit_under_their_fields(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    base = live_stack["http"]
    before = await sync_to_async(job_count)()
    await sign_in(page, base, "alice")
    await page.goto(base + "/submit")
    await page.get_by_role("tab", name="YAML").click()
    await page.get_by_label("Job spec (YAML)").fill(
        "name: sweep\nvc: vision\nflavor: no-such\ncommand: python train.py\n"
    )
    await page.get_by_label("Copies").fill("3")
    await page.get_by_role("button", name="Submit 3 jobs").click()
    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text("The portal did not accept the jobs.", timeout=LONG)
    flavor_error = re.compile(r"^flavor: No flavor named 'no-such'")
    await expect(alert.get_by_role("listitem")).to_have_text(flavor_error)
    # In the form the message sits under the flavor picker, as for a single job.
    await page.get_by_role("tab", name="Form").click()
    picker = page.get_by_role("group", name="Flavor (per replica)")
    await expect(picker.locator(".field-error")).to_contain_text("No flavor named 'no-such'")

    # A count the endpoint refuses is said under Copies, in the form as in YAML.
    await page.get_by_role("radio", name=re.compile(r"^s-A100")).check()
    await page.get_by_label("Copies").fill("1001")
    await page.get_by_role("button", name="Submit 1001 jobs").click()
    await expect(page.get_by_label("Copies")).to_have_accessible_description(
        "Ensure this value is less than or equal to 1000.", timeout=LONG
    )
    await expect(page.get_by_role("alert").get_by_role("listitem")).to_have_count(0)
    assert await sync_to_async(job_count)() == before

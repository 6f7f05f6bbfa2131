"""The submit page's Check: the portal's dry run of the spec in the form, shown under the buttons,
with what would start the job sooner applicable to the form in a click; nothing is submitted."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


def placed(job_ids: list[int]) -> None:
    from django.db import connection

    from portal.jobs.models import Job
    from tests.conftest import wait_for

    try:
        started = Job.objects.filter(pk__in=job_ids, state__in=["scheduled", "starting", "running"])
        wait_for(lambda: started.count() == len(job_ids), 60, f"jobs {job_ids} to be placed")
    finally:
        connection.close()


def job_count() -> int:
    from django.db import connection

    from portal.jobs.models import Job

    try:
        return Job.objects.count()
    finally:
        connection.close()


async def test_check_says_whether_the_job_would_start_and_what_would_help(
    live_stack: dict[str, Any], users: Any, a100_agent: Any, submit_as: Any, page: Page
) -> None:
    # Three 2-GPU jobs leave 2 of a100-node-1's 8 A100 free: a 4-GPU job would wait, 2 would start.
    fillers = [await submit_as("alice", name=f"filler-{i}", flavor="s-A100") for i in range(3)]
    await sync_to_async(placed)([job["id"] for job in fillers])

    await sign_in(page, live_stack["http"], "alice")
    await page.goto(live_stack["http"] + "/submit")
    await page.get_by_label("Name", exact=True).fill("check-me")
    await page.get_by_label("Command", exact=True).fill("sleep 600")
    await page.get_by_role("radio", name=re.compile(r"^m-A100")).check()
    await page.get_by_role("button", name="Check").click()

    verdict = page.get_by_role("region", name="If you submit it now")
    await expect(verdict.get_by_role("status")).to_contain_text("Would wait: ", timeout=LONG)
    await expect(verdict.get_by_role("status")).to_contain_text("Estimated start")
    hints = verdict.get_by_role("list", name="What would start it sooner")
    smaller = hints.get_by_role("listitem").filter(has_text="s-A100")
    await expect(smaller).to_contain_text("starts now")
    await smaller.get_by_role("button", name="Use this").click()
    # The form takes the hint's flavor; the verdict was about the spec before, so it goes.
    await expect(page.get_by_role("radio", name=re.compile(r"^s-A100"))).to_be_checked()
    await expect(verdict).to_have_count(0)

    await page.get_by_role("button", name="Check").click()
    await expect(verdict.get_by_role("status")).to_have_text(
        re.compile(r"^Would start now on a100-node-1:\d,\d\.$"), timeout=LONG
    )
    assert await sync_to_async(job_count)() == len(fillers)  # nothing was submitted

    # A spec the portal would refuse shows its messages, as a submission does.
    await page.get_by_label("Replicas").fill("100")
    await page.get_by_role("button", name="Check").click()
    refusal = page.get_by_role("alert")
    await expect(refusal).to_contain_text("The portal would not accept the job.", timeout=LONG)
    await expect(verdict).to_have_count(0)
    await page.get_by_role("tab", name="YAML").click()
    await expect(refusal).to_contain_text("replicas")

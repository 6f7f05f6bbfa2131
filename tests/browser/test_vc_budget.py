"""A virtual cluster's monthly GPU-hour budget on its page: a bar of the hours its jobs held this
month (UTC), and once they reach the budget a notice of when its jobs start again, with its
waiting jobs' reason in the queue."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in
from tests.client.test_cli_vcs import first_of_next_month, two_gpu_hours_this_month

pytestmark = BROWSER_TEST


def use_two_gpu_hours(user: Any) -> datetime:
    from django.db import connection

    try:
        return two_gpu_hours_this_month(user, "vision")
    finally:
        connection.close()


def set_budget(vc_name: str, gpu_hours_per_month: int | None) -> None:
    from django.db import connection

    from portal.cluster.models import VirtualCluster

    try:
        VirtualCluster.objects.filter(name=vc_name).update(gpu_hours_per_month=gpu_hours_per_month)
    finally:
        connection.close()


async def test_a_vc_page_shows_its_budget_and_says_when_it_is_spent(
    live_stack: dict[str, Any], users: Any, a100_agent: Any, submit_as: Any, page: Page
) -> None:
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/vcs/vision")
    await expect(page.get_by_text("Queue order:")).to_be_visible(timeout=LONG)
    budget_bars = page.get_by_role("img", name=re.compile("^vision monthly budget"))
    await expect(budget_bars).to_have_count(0)  # the demo's VCs have no budget

    now = await sync_to_async(use_two_gpu_hours)(users["alice"])
    used = f"used in {now:%B} (UTC)"
    await sync_to_async(set_budget)("vision", 1000)
    await page.reload()
    bar = page.get_by_role("img", name=f"vision monthly budget: 2.0 of 1,000 GPU-hours {used}, 0 %")
    await expect(bar).to_be_visible(timeout=LONG)
    await expect(page.get_by_text(f"2.0 of 1,000 GPU-hours {used} · 0 %")).to_be_visible()
    await expect(bar.locator(".budget-fill")).to_have_class("budget-fill budget-ok")
    await expect(page.get_by_text("Budget spent")).to_have_count(0)

    await sync_to_async(set_budget)("vision", 2)
    waiting = await submit_as("alice", name="over-budget")
    await page.reload()
    until = first_of_next_month(now)
    notice = page.get_by_role("status").filter(has_text="Budget spent")
    await expect(notice).to_have_text(
        f"Budget spent: its jobs start again on {until} (UTC), or sooner if an admin raises its monthly"
        " GPU-hour budget; running jobs go on.",
        timeout=LONG,
    )
    bar = page.get_by_role("img", name=f"vision monthly budget: 2.0 of 2 GPU-hours {used}, 100 %")
    await expect(bar).to_be_visible()
    await expect(bar.locator(".budget-fill")).to_have_class("budget-fill budget-spent")
    await expect(bar.locator(".budget-fill")).to_have_attribute("style", "width: 100%;")

    # The waiting job says why, with no place in the queue, as under an admin's stop.
    row = page.locator(f"tr[data-job-id='{waiting['id']}']")
    await expect(row.locator("td[data-label='Why waiting']")).to_contain_text(
        f"VC vision has used 2.0 of its 2 GPU-hours for {now:%B} (UTC)", timeout=LONG
    )
    await expect(row.locator("td[data-label='Position']")).to_have_text("\u2013")  # the page's dash for none

    # The list of VCs says it too.
    await page.goto(f"{live_stack['http']}/vcs")
    await expect(page.get_by_role("status").filter(has_text="Budget spent")).to_be_visible(timeout=LONG)

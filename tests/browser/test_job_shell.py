"""The job shell in the browser: the owner types into a terminal on the job page and the job's
process environment answers; another member of the tenant is offered no shell."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


async def test_the_owner_opens_a_shell_in_a_running_job_and_types_into_it(
    live_stack: dict[str, Any], submit_as: Any, a100_agent: Any, page: Page
) -> None:
    job = await submit_as("alice", name="shell-here", command="sleep 600")
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(f"{base}/jobs/{job['id']}")
    badge = page.get_by_role("heading", level=1).locator(".badge")
    await expect(badge).to_have_text("running", timeout=LONG)

    await page.get_by_role("button", name="Shell").click()
    terminal = page.get_by_role("application", name=f"Shell in job {job['id']}")
    await expect(page.get_by_role("status").filter(has_text="connected")).to_contain_text(
        "a100-node-1", timeout=LONG
    )
    await terminal.click()
    await page.keyboard.type("echo $((6*7)) $GPUPORTAL_JOB_ID")
    await page.keyboard.press("Enter")
    await expect(terminal).to_contain_text(f"42 {job['id']}", timeout=LONG)
    # Ctrl-C interrupts what runs in the shell, not the page or the job.
    await page.keyboard.type("sleep 100")
    await page.keyboard.press("Enter")
    await page.keyboard.press("Control+c")
    await page.keyboard.type("echo $((1+1))ok")
    await page.keyboard.press("Enter")
    await expect(terminal).to_contain_text("2ok", timeout=LONG)

    await page.keyboard.type("exit 5")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("status").filter(has_text="ended")).to_contain_text("5", timeout=LONG)
    await expect(page.get_by_role("button", name="Reconnect")).to_be_visible()
    await expect(badge).to_have_text("running")


async def test_another_member_of_the_tenant_is_offered_no_shell(
    live_stack: dict[str, Any], submit_as: Any, a100_agent: Any, page: Page
) -> None:
    job = await submit_as("alice", name="not-bobs", command="sleep 600")
    base = live_stack["http"]
    await sign_in(page, base, "bob")
    await page.goto(f"{base}/jobs/{job['id']}")
    badge = page.get_by_role("heading", level=1).locator(".badge")
    await expect(badge).to_have_text("running", timeout=LONG)
    await expect(page.get_by_role("link", name="Clone and resubmit")).to_be_visible()
    await expect(page.get_by_role("button", name="Shell")).to_have_count(0)

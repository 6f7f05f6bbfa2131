"""A running job with checkpointing is paused from its page and resumed: the Hold button reads
Pause, the job checkpoints and waits held, and Release reads Resume."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST

REPO = Path(__file__).resolve().parents[2]
TRAINING = [
    sys.executable,
    str(REPO / "examples" / "train_counter.py"),
    "--steps",
    "100000",
    "--save-every",
    "50",
]


async def test_an_owner_pauses_a_running_job_and_resumes_it(
    live_stack: dict[str, Any], users: Any, a100_agent: Any, submit_as: Any, cancel_as: Any, page: Page
) -> None:
    job = await submit_as(
        "alice",
        name="to-pause",
        command=TRAINING,
        env={"PYTHONPATH": str(REPO)},
        checkpoint={"enabled": True, "grace_seconds": 60},
    )
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/jobs/{job['id']}")
    badge = page.locator("main h1 .badge")
    await expect(badge).to_have_text("running", timeout=LONG)
    await page.get_by_role("button", name="Pause", exact=True).click()

    card = page.locator(".pending-card")
    await expect(card).to_contain_text(
        "Paused by alice: resumes from its checkpoint when released", timeout=LONG
    )
    await expect(badge).to_have_text("pending", timeout=LONG)
    await expect(card).to_contain_text("Paused: it resumes from its checkpoint when resumed.")
    await page.get_by_role("button", name="Resume", exact=True).click()
    await expect(badge).to_have_text("running", timeout=LONG)
    await expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible(timeout=LONG)
    await cancel_as("alice", job["id"])

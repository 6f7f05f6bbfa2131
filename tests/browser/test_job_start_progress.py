"""A job whose image is being pulled shows it on its page: each replica's state and the agent's
message, with a bar for the pull's progress, updated live while the job stays starting."""

from __future__ import annotations

import itertools
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST

IMAGE = "registry.example.org/ml/pytorch:24.10"
GENERATIONS = itertools.count(1)


def place(job_id: int) -> None:
    """The job placed on a100-node-1 by a scheduling cycle; no agent runs, the test reports for it."""
    from django.db import connection

    from portal.cluster.models import Node
    from portal.jobs.models import Job
    from scheduler.tasks import run_cycle

    try:
        Node.objects.exclude(name="a100-node-1").update(state="cordoned")
        Node.objects.filter(name="a100-node-1").update(state="ready")
        run_cycle()
        assert Job.objects.get(pk=job_id).state == "scheduled"
    finally:
        connection.close()


def report(job_id: int, state: str, message: str = "") -> None:
    """What a100-node-1's agent would say of the job's replica 0."""
    from django.db import connection
    from django.utils import timezone

    from agents.protocol import AttemptState, AttemptStatus
    from portal.agentgw.desired import agent_attempt_id
    from portal.cluster.models import Node
    from portal.jobs.models import JobAttempt
    from portal.jobs.services import record_attempt_status

    try:
        attempt = JobAttempt.objects.get(job_id=job_id)
        status = AttemptStatus(
            attempt_id=agent_attempt_id(attempt, 0),
            job_id=str(job_id),
            state=AttemptState(state),
            generation=next(GENERATIONS),
            time=timezone.now(),
            message=message,
        )
        assert record_attempt_status(Node.objects.get(name="a100-node-1"), status)
    finally:
        connection.close()


async def test_the_job_page_follows_an_image_pull_without_a_reload(
    live_stack: dict[str, Any], submit_as: Any, paused_loop: Any, page: Page
) -> None:
    job = await submit_as("alice", name="pulls-an-image")
    await sync_to_async(place)(job["id"])
    base = live_stack["http"]
    await sign_in(page, base, "alice")
    await page.goto(f"{base}/jobs/{job['id']}")
    await expect(page.get_by_role("status", name="Live updates")).to_have_text("Live", timeout=LONG)
    await page.evaluate("window.loadedOnce = true")  # gone if the page reloads
    badge = page.get_by_role("heading", level=1).locator(".badge")
    replicas = page.get_by_role("region", name="Replicas")
    await expect(replicas).to_contain_text("replica 0 on a100-node-1: not reported yet")

    await sync_to_async(report)(job["id"], "starting", f"pulling {IMAGE}")
    await expect(badge).to_have_text("starting", timeout=LONG)
    await expect(replicas).to_contain_text(f"replica 0 on a100-node-1: starting — pulling {IMAGE}")
    bar = replicas.get_by_role("progressbar", name="Image pull of replica 0")
    await expect(bar).to_have_count(0)  # no sizes yet

    # The job stays starting while the pull goes on: only the message changes.
    await sync_to_async(report)(job["id"], "starting", f"pulling {IMAGE}: 312 of 1,024 MiB")
    await expect(replicas).to_contain_text(f"starting — pulling {IMAGE}: 312 of 1,024 MiB", timeout=LONG)
    await expect(bar).to_have_attribute("value", "312")
    await expect(bar).to_have_attribute("max", "1024")
    await sync_to_async(report)(job["id"], "starting", f"pulling {IMAGE}: 700 of 1,024 MiB")
    await expect(bar).to_have_attribute("value", "700", timeout=LONG)
    await expect(badge).to_have_text("starting")

    # A long image name fits a phone.
    await page.set_viewport_size({"width": 390, "height": 844})
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the job page is {overflow} px wider than a phone screen"

    # Running, the replicas have nothing more to say.
    await sync_to_async(report)(job["id"], "running")
    await expect(badge).to_have_text("running", timeout=LONG)
    await expect(replicas).to_have_count(0)
    assert await page.evaluate("window.loadedOnce === true"), "the page was reloaded"

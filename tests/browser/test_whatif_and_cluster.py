"""A waiting job says what would start it sooner, and the hint resubmits in two clicks; the
cluster grid shows each GPU's job and load, and cluster admins cordon and drain nodes from it
(a drain only once they confirm what it moves)."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST


def hints_of(job_id: int) -> list[dict[str, Any]]:
    from django.db import connection

    from portal.jobs.models import Job
    from tests.conftest import wait_for

    try:
        job = wait_for(
            lambda: Job.objects.filter(pk=job_id).exclude(whatif_hints=[]).first(),
            60,
            f"what-if hints on job {job_id}",
        )
        return list(job.whatif_hints)
    finally:
        connection.close()


async def test_a_waiting_job_offers_a_smaller_flavor_that_starts_now(
    live_stack: dict[str, Any], users: Any, a100_agent: Any, submit_as: Any, page: Page
) -> None:
    # Three 2-GPU jobs leave 2 of a100-node-1's 8 A100 free: a 4-GPU job waits, 2 would start.
    for i in range(3):
        await submit_as("alice", name=f"filler-{i}", flavor="s-A100")
    waiting = await submit_as("alice", name="wants-four", flavor="m-A100")
    hints = await sync_to_async(hints_of)(waiting["id"])
    smaller = [h for h in hints if h["kind"] == "fewer-gpus" and h["flavor"] == "s-A100"]
    assert smaller and smaller[0]["starts_now"], hints

    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/jobs/{waiting['id']}")
    hint_list = page.get_by_role("list", name="What would start it sooner")
    smaller = hint_list.get_by_role("listitem").filter(has_text="s-A100")
    await expect(smaller).to_contain_text("starts now", timeout=LONG)
    await smaller.get_by_role("link", name="Resubmit like this").click()

    await expect(page.get_by_role("heading", name="Resubmit wants-four")).to_be_visible(timeout=LONG)
    await expect(page.get_by_role("radio", name=re.compile("^s-A100"))).to_be_checked()
    # The original still waits under the same name: the page says so and offers to cancel it.
    original = page.get_by_role("region", name="The original job")
    await expect(original).to_contain_text(f"The original job #{waiting['id']} (wants-four) is still waiting")
    await original.get_by_label(f"Cancel job #{waiting['id']} once this one is submitted").check()
    await page.get_by_role("button", name="Submit job").click()
    await expect(page).to_have_url(re.compile(r"/jobs/\d+$"), timeout=LONG)
    badge = page.locator("main h1 .badge")
    await expect(badge).to_have_text(re.compile("scheduled|starting|running"), timeout=LONG)
    left = await (await page.request.get(f"{live_stack['http']}/api/v1/jobs/{waiting['id']}/")).json()
    assert left["state"] == "cancelled", left


async def test_the_grid_shows_gpu_load_and_admins_cordon_a_node(
    live_stack: dict[str, Any], users: Any, a100_agent: Any, submit_as: Any, page: Page
) -> None:
    job = await submit_as("alice", name="busy", flavor="s-A100")
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(live_stack["http"] + "/cluster")
    node = page.get_by_role("article", name="Node a100-node-1")
    # A big figure is grouped as the browser's locale (en-GB) groups digits.
    await expect(node).to_contain_text("256 CPU · 2,048 GB · ", timeout=LONG)
    # The job's GPUs link to it, and carry the agent's latest reading.
    job_cell = node.locator(f"a[href='/jobs/{job['id']}']").first
    await expect(job_cell).to_be_visible(timeout=LONG)
    await expect(node.locator(".gpu-util").first).to_contain_text("%", timeout=LONG)
    # Researchers get no node actions.
    await expect(page.get_by_role("button", name="Cordon")).to_have_count(0)
    # The per-model bar counts the job's GPUs as allocated, here and on the dashboard.
    a100_in_use = re.compile(r"^A100 GPUs: [1-9]\d* allocated, \d+ free, \d+ unavailable$")
    await expect(page.get_by_role("img", name=a100_in_use)).to_be_visible(timeout=LONG)
    await page.goto(live_stack["http"] + "/")
    utilization = page.get_by_role("region", name="Cluster utilization")
    await expect(utilization.get_by_role("img", name=a100_in_use)).to_be_visible(timeout=LONG)

    await page.context.clear_cookies()
    await sign_in(page, live_stack["http"], "admin")
    await page.goto(live_stack["http"] + "/cluster")
    other = page.get_by_role("article", name="Node a100-node-2")
    # The admin says why, and the node's card then says it to everyone.
    await other.get_by_label("Reason to cordon or drain a100-node-2").fill("replacing a PSU")
    await other.get_by_role("button", name="Cordon").click()
    await expect(other.locator("header .badge")).to_have_text("cordoned", timeout=LONG)
    await expect(other.get_by_text("replacing a PSU", exact=True)).to_be_visible(timeout=LONG)
    await other.get_by_role("button", name="Make ready").click()
    await expect(other.get_by_role("button", name="Cordon")).to_be_visible(timeout=LONG)

    # Drain asks first, saying in numbers what it would move; Keep leaves the node as it was.
    busy = page.get_by_role("article", name="Node a100-node-1")
    await expect(busy).to_contain_text("2/8 GPUs allocated", timeout=LONG)
    await busy.get_by_role("button", name="Drain").click()
    question = busy.get_by_role("group", name="Confirm drain of a100-node-1")
    await expect(question).to_contain_text(
        "Drain a100-node-1? Its 1 running job, on 2 of its 8 GPUs, is checkpointed or stopped and "
        "requeued elsewhere. It then takes no new jobs until an admin makes it ready."
    )
    # The confirming button has the focus, and the question describes it; Escape keeps.
    yes = question.get_by_role("button", name="Yes, drain")
    await expect(yes).to_be_focused()
    await expect(yes).to_have_accessible_description(re.compile(r"^Drain a100-node-1\? Its 1 running job"))
    await page.keyboard.press("Escape")
    await expect(question).to_have_count(0)
    await expect(busy.get_by_role("button", name="Drain")).to_be_focused()
    await busy.get_by_role("button", name="Drain").click()
    await question.get_by_role("button", name="Keep").click()
    await expect(busy.get_by_role("button", name="Drain")).to_be_focused()
    await expect(busy.locator("header .badge")).to_have_text("ready")
    assert (await sync_to_async(node_state)("a100-node-1")) == "ready"

    # Confirmed, the node drains (one without jobs: nothing of this test's moves).
    await other.get_by_label("Reason to cordon or drain a100-node-2").fill("firmware update")
    await other.get_by_role("button", name="Drain").click()
    drain_other = other.get_by_role("group", name="Confirm drain of a100-node-2")
    await expect(drain_other).to_contain_text("Drain a100-node-2? No job holds its GPUs now.")
    await drain_other.get_by_role("button", name="Yes, drain").click()
    await expect(other.locator("header .badge")).to_have_text("draining", timeout=LONG)
    await expect(other.get_by_text("firmware update", exact=True)).to_be_visible(timeout=LONG)
    # Its Drain button gone, the focus goes to what took its place.
    await expect(other.get_by_role("button", name="Make ready")).to_be_focused(timeout=LONG)
    await other.get_by_role("button", name="Make ready").click()
    await expect(other.get_by_role("button", name="Drain")).to_be_visible(timeout=LONG)


def node_state(name: str) -> str:
    from django.db import connection

    from portal.cluster.models import Node

    try:
        return Node.objects.get(name=name).state
    finally:
        connection.close()


def queue_positions(*job_ids: int) -> list[int | None]:
    from django.db import connection

    from portal.jobs.models import Job

    try:
        positions = dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "queue_position"))
        return [positions.get(job_id) for job_id in job_ids]
    finally:
        connection.close()


async def test_an_owner_moves_a_waiting_job_before_their_others(
    live_stack: dict[str, Any], users: Any, submit_as: Any, page: Page
) -> None:
    """No agent runs, so both jobs wait; the later one, moved from its page, goes first."""
    first = await submit_as("alice", name="first")
    later = await submit_as("alice", name="later")
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/jobs/{later['id']}")
    await page.get_by_role("button", name="Move before alice's other jobs").click()
    moved = page.get_by_role("status").filter(has_text="Moved:")
    await expect(moved).to_contain_text("goes before alice's other pending jobs in vision", timeout=LONG)

    async def moved_first() -> bool:
        ahead, behind = await sync_to_async(queue_positions)(later["id"], first["id"])
        return ahead is not None and behind is not None and ahead < behind

    for _ in range(600):
        if await moved_first():
            break
        await page.wait_for_timeout(100)
    assert await moved_first(), await sync_to_async(queue_positions)(later["id"], first["id"])
    await page.reload()
    await expect(page.get_by_text("moved to the front of alice's pending jobs")).to_be_visible(timeout=LONG)


async def test_an_owner_holds_and_releases_a_waiting_job(
    live_stack: dict[str, Any], users: Any, submit_as: Any, page: Page
) -> None:
    job = await submit_as("alice", name="to-hold")
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/jobs/{job['id']}")
    await page.get_by_role("button", name="Hold", exact=True).click()
    card = page.locator(".pending-card")
    await expect(card).to_contain_text("Held by alice: it does not start until released.", timeout=LONG)
    # The hold is an event without a transition: the timeline says so instead of "new -> -".
    await page.reload()
    entry = page.get_by_role("list", name="Events").get_by_role("listitem").filter(has_text="held: it does")
    await expect(entry).to_contain_text("note by alice", timeout=LONG)
    await expect(entry).not_to_contain_text("→")
    await page.get_by_role("button", name="Release", exact=True).click()
    await expect(page.get_by_role("button", name="Hold", exact=True)).to_be_visible(timeout=LONG)
    await expect(card).not_to_contain_text("Held by alice", timeout=LONG)


def update_vc(vc_name: str, **fields: Any) -> None:
    from django.db import connection

    from portal.cluster.models import VirtualCluster

    try:
        VirtualCluster.objects.filter(name=vc_name).update(**fields)
    finally:
        connection.close()


async def test_a_vc_page_names_its_queue_order(live_stack: dict[str, Any], users: Any, page: Page) -> None:
    """The demo's vision VC orders its own jobs first in, first out; without a policy of its
    own it follows the scheduler's order, and its page says which."""
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/vcs/vision")
    await expect(page.get_by_text("Queue order: First in, first out")).to_be_visible(timeout=LONG)
    await sync_to_async(update_vc)("vision", queueing_policy="")
    await page.reload()
    await expect(page.get_by_text("Queue order: The scheduler's order")).to_be_visible(timeout=LONG)


async def test_a_vc_page_names_its_per_user_limits(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    caps = {"max_gpus_per_user": 4, "max_cpus_per_user": 32, "max_memory_gb_per_user": 256}
    await sync_to_async(update_vc)("vision", **caps)
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/vcs/vision")
    limits = page.get_by_text("Queue order:")
    await expect(limits).to_contain_text("at most 4 GPUs per user", timeout=LONG)
    await expect(limits).to_contain_text("at most 32 CPUs per user")
    await expect(limits).to_contain_text("at most 256 GB of memory per user")


async def test_an_owner_lowers_a_time_limit_and_may_not_raise_it(
    live_stack: dict[str, Any], users: Any, submit_as: Any, page: Page
) -> None:
    job = await submit_as("alice", name="to-shorten")  # s-A100: 72 h
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/jobs/{job['id']}")
    facts = page.locator("dl.facts").filter(has_text="Time limit")
    await expect(facts).to_contain_text("3d")
    await page.get_by_role("button", name="Change").click()
    await page.get_by_label("New time limit").fill("90m")
    await page.get_by_role("button", name="Save").click()
    await expect(facts).to_contain_text("1h 30m", timeout=LONG)
    await page.get_by_role("button", name="Change").click()
    await page.get_by_label("New time limit").fill("2h")
    await page.get_by_role("button", name="Save").click()
    await expect(page.get_by_role("alert")).to_contain_text(
        "Only an admin of the job's tenant may raise its time limit", timeout=LONG
    )

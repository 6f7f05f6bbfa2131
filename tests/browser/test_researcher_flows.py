"""What a researcher does in the browser: sign in, submit, follow a running job, fix a rejected
spec, cancel from the list; and what they must not see (another tenant's jobs)."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG, sign_in

pytestmark = BROWSER_TEST

# One line, so that it is one argument in the form's "one argument per line" command.
HELLO = (
    "[print(f'hello from the browser {i}', flush=True) or __import__('time').sleep(0.5) for i in range(8)]"
)


async def test_submit_through_the_form_and_follow_the_job_live(
    live_stack: dict[str, Any], users: Any, a100_agent: Any, page: Page
) -> None:
    base = live_stack["http"]
    await page.goto(base + "/")
    await page.get_by_label("User name").fill("alice")
    await page.get_by_label("Password").fill("wrong")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("Wrong user name or password.")
    await page.get_by_label("Password").fill("alice-pass")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()

    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Submit").click()
    await page.get_by_label("Name", exact=True).fill("browser-hello")
    await page.get_by_role("radio", name=re.compile(r"^s-A100")).check()
    await page.get_by_role("radio", name=re.compile("a list of arguments")).check()
    await page.get_by_label("Command", exact=True).fill(f"python3\n-c\n{HELLO}")
    # The form and the YAML editor show the same spec.
    await page.get_by_role("tab", name="YAML").click()
    await expect(page.get_by_label("Job spec (YAML)")).to_have_value(re.compile("name: browser-hello"))
    await page.get_by_role("tab", name="Form").click()
    await page.get_by_role("button", name="Submit job").click()

    await expect(page).to_have_url(re.compile(r"/jobs/\d+$"), timeout=LONG)
    await expect(page.get_by_role("heading", level=1)).to_contain_text("browser-hello")
    await expect(page.get_by_role("status", name="Live updates")).to_have_text("Live", timeout=LONG)
    log = page.get_by_test_id("log")
    try:
        await expect(log).to_contain_text("hello from the browser 0", timeout=LONG)
    except AssertionError as exc:
        job = await (await page.request.get(page.url.replace("/jobs/", "/api/v1/jobs/") + "/")).json()
        raise AssertionError(f"no log line; the job as the API has it: {job}") from exc
    badge = page.get_by_role("heading", level=1).locator(".badge")
    await expect(badge).to_have_text("succeeded", timeout=LONG)
    await expect(log).to_contain_text("hello from the browser 7", timeout=LONG)
    # The timeline shows the path the job took, the attempt its placement.
    await expect(page.get_by_role("region", name="Timeline")).to_contain_text("running")
    await expect(page.get_by_role("region", name="Attempts")).to_contain_text("a100-node-1 GPU")
    # Per-GPU samples of the simulated host reached the charts (named node/GPU index).
    await expect(page.get_by_role("region", name="GPU telemetry")).to_contain_text(
        "a100-node-1/", timeout=LONG
    )
    # Clone and resubmit starts from the same spec.
    await page.get_by_role("link", name="Clone and resubmit").click()
    await expect(page.get_by_label("Name", exact=True)).to_have_value("browser-hello")
    await expect(page.get_by_label("Command", exact=True)).to_have_value(f"python3\n-c\n{HELLO}")
    await expect(page.get_by_role("radio", name=re.compile(r"^s-A100"))).to_be_checked()


async def test_a_yaml_spec_with_a_bad_field_shows_the_apis_message(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(live_stack["http"] + "/submit")
    await page.get_by_role("tab", name="YAML").click()
    editor = page.get_by_label("Job spec (YAML)")
    await editor.fill("name: too-many\nvc: vision\nflavor: s-A100\ncommand: python train.py\nreplicas: 100\n")
    await page.get_by_role("button", name="Submit job").click()
    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text("replicas")
    await expect(alert).to_contain_text("Ensure this value is less than or equal to 64.")
    # Back in the form the message sits under the field.
    await page.get_by_role("tab", name="Form").click()
    await expect(page.get_by_label("Replicas")).to_have_value("100")
    await expect(page.locator(".field.has-error")).to_contain_text("less than or equal to 64")
    await expect(page).to_have_url(re.compile("/submit$"))


async def test_another_tenants_job_is_invisible(
    live_stack: dict[str, Any], submit_as: Any, cancel_as: Any, page: Page
) -> None:
    secret = await submit_as("carol", name="speech-secret", vc="speech", flavor="s-V100")
    mine = await submit_as("alice", name="vision-visible")
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(live_stack["http"] + "/jobs")
    await expect(page.get_by_role("link", name="vision-visible")).to_be_visible()
    await expect(page.get_by_text("speech-secret")).to_have_count(0)
    await page.get_by_label("Search").fill("speech-secret")
    await page.get_by_role("button", name="Search").click()
    await expect(page.get_by_text("No jobs match.")).to_be_visible()

    await page.goto(f"{live_stack['http']}/jobs/{secret['id']}")
    await expect(page.get_by_role("heading", name="Job not found")).to_be_visible()
    # The live socket answers a subscription to it exactly like one to a job that does not exist.
    answers = await page.evaluate(
        """async ([secret, mine]) => {
            const ws = new WebSocket(`ws://${location.host}/ws/live/`);
            const answers = [];
            await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
            const done = new Promise((resolve) => {
                ws.onmessage = (e) => {
                    answers.push(JSON.parse(e.data));
                    if (answers.length === 3) resolve();
                };
            });
            ws.send(JSON.stringify({subscribe: "job", id: secret}));
            ws.send(JSON.stringify({subscribe: "job", id: 999999}));
            ws.send(JSON.stringify({subscribe: "job", id: mine}));
            await done;
            ws.close();
            return answers;
        }""",
        [secret["id"], mine["id"]],
    )
    assert answers[0] == {"error": "not found", "subscribe": "job", "id": secret["id"]}
    assert answers[1] == {"error": "not found", "subscribe": "job", "id": 999999}
    assert answers[2] == {"subscribed": "job", "id": mine["id"]}

    # Subscribed to "jobs", alice's socket carries her tenant's changes and nothing of speech's.
    await page.evaluate(
        """() => new Promise((resolve, reject) => {
            window.liveSeen = [];
            const ws = new WebSocket(`ws://${location.host}/ws/live/`);
            ws.onerror = reject;
            ws.onopen = () => ws.send(JSON.stringify({subscribe: "jobs"}));
            ws.onmessage = (e) => {
                const m = JSON.parse(e.data);
                if (m.subscribed) resolve();
                else window.liveSeen.push(m);
            };
        })"""
    )
    await cancel_as("carol", secret["id"])
    await cancel_as("alice", mine["id"])
    await page.wait_for_function(f"window.liveSeen.some((m) => m.job === {mine['id']})")
    seen = await page.evaluate("window.liveSeen")
    assert all(m["job"] != secret["id"] for m in seen), seen


async def test_cancel_selected_jobs_from_the_list(
    live_stack: dict[str, Any], submit_as: Any, page: Page
) -> None:
    first = await submit_as("alice", name="cancel-me-1")
    second = await submit_as("alice", name="cancel-me-2")
    await submit_as("alice", name="keep-me")
    base = live_stack["http"]
    # Signed in with the keyboard alone.
    await page.goto(base + "/")
    await page.get_by_label("User name").focus()
    await page.keyboard.type("alice")
    await page.keyboard.press("Tab")
    await page.keyboard.type("alice-pass")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()

    await page.goto(base + "/jobs?owner=me")
    await page.get_by_label(f"Select cancel-me-1 #{first['id']}").check()
    await page.get_by_label(f"Select cancel-me-2 #{second['id']}").check()
    await page.get_by_role("button", name="Cancel selected").click()
    await page.get_by_role("button", name="Yes, cancel").click()
    await expect(page.get_by_role("status").filter(has_text="Cancelled 2 of 2.")).to_be_visible(timeout=LONG)
    for job in (first, second):
        row = page.locator(f"tr[data-job-id='{job['id']}']")
        await expect(row.locator(".badge")).to_have_text("cancelled", timeout=LONG)
    await expect(page.get_by_role("row", name=re.compile("keep-me")).locator(".badge")).not_to_have_text(
        "cancelled"
    )


async def test_pages_fit_a_phone_screen(live_stack: dict[str, Any], submit_as: Any, page: Page) -> None:
    job = await submit_as("alice", name="phone-check")
    await page.set_viewport_size({"width": 390, "height": 844})
    await sign_in(page, live_stack["http"], "alice")
    for path in [
        "/",
        "/jobs",
        f"/jobs/{job['id']}",
        "/submit",
        "/cluster",
        "/vcs/vision",
        "/tokens",
        "/members",
    ]:
        await page.goto(live_stack["http"] + path)
        await expect(page.locator("main h1").first).to_be_visible()
        overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} is {overflow} px wider than a phone screen"


async def test_the_page_catches_up_after_losing_its_socket(
    live_stack: dict[str, Any], submit_as: Any, page: Page
) -> None:
    base = live_stack["http"]
    job = await submit_as("alice", name="resync-me")  # no agent runs: it waits
    blocked = False
    routes: list[Any] = []

    async def live_socket(ws: Any) -> None:
        if blocked:  # the portal is unreachable: the socket closes at once
            await ws.close()
            return
        ws.connect_to_server()
        routes.append(ws)

    await page.route_web_socket(re.compile(r"/ws/live/$"), live_socket)
    await sign_in(page, base, "alice")
    await page.goto(f"{base}/jobs/{job['id']}")
    indicator = page.get_by_role("status", name="Live updates")
    badge = page.get_by_role("heading", level=1).locator(".badge")
    await expect(indicator).to_have_text("Live")
    await expect(badge).to_have_text("pending")

    blocked = True
    for ws in routes:
        await ws.close()
    await expect(indicator).not_to_have_text("Live")
    # The change happens while the page has no socket; it must not be lost.
    csrf = {c["name"]: c["value"] for c in await page.context.cookies()}["csrftoken"]
    response = await page.request.post(
        f"{base}/api/v1/jobs/{job['id']}/cancel/", headers={"X-CSRFToken": csrf, "Referer": base + "/"}
    )
    assert response.ok, await response.text()
    blocked = False
    await expect(indicator).to_have_text("Live", timeout=LONG)
    await expect(badge).to_have_text("cancelled", timeout=LONG)


async def test_create_and_revoke_an_api_token(live_stack: dict[str, Any], users: Any, page: Page) -> None:
    await sign_in(page, live_stack["http"], "alice")
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Tokens").click()
    await page.get_by_label("Name").fill("laptop")
    await page.get_by_role("button", name="Create token").click()
    await expect(page.get_by_role("status").filter(has_text="shown only once")).to_contain_text("gpp_")
    await page.get_by_role("button", name="Revoke laptop").click()
    await expect(page.get_by_role("row", name=re.compile("laptop"))).to_contain_text("revoked")


def add_notes(job_id: int, count: int) -> None:
    from django.db import connection

    from portal.jobs.models import Job
    from portal.jobs.services import record_job_event

    try:
        job = Job.objects.get(pk=job_id)
        for i in range(count):
            record_job_event(job, "portal", f"note {i}")
    finally:
        connection.close()


async def test_a_long_timeline_opens_at_the_latest_event(
    live_stack: dict[str, Any], users: Any, submit_as: Any, page: Page
) -> None:
    # The timeline scrolls inside its card, oldest first: the latest events must be in sight.
    job = await submit_as("alice", name="many-events")
    await sync_to_async(add_notes)(job["id"], 30)
    await sign_in(page, live_stack["http"], "alice")
    await page.goto(f"{live_stack['http']}/jobs/{job['id']}")
    timeline = page.get_by_role("list", name="Events")
    await expect(timeline).to_contain_text("note 29", timeout=LONG)
    await timeline.scroll_into_view_if_needed()
    await expect(timeline.get_by_text("note 29", exact=True)).to_be_in_viewport()
    await expect(timeline.get_by_text("submitted", exact=True)).not_to_be_in_viewport()


def set_email(user: Any, address: str) -> None:
    from django.db import connection

    try:
        user.email = address
        user.save(update_fields=["email"])
    finally:
        connection.close()


def notify_of(job_id: int) -> list[str]:
    from django.db import connection

    from portal.jobs.models import Job

    try:
        return list(Job.objects.get(pk=job_id).notify_on)
    finally:
        connection.close()


async def test_the_form_asks_for_mail_about_the_chosen_states(
    live_stack: dict[str, Any], users: Any, page: Page
) -> None:
    """The live stack sends mail (its SMTP server is the session's): the form offers the states,
    to the account's address, and the job keeps the ones ticked."""
    await sign_in(page, live_stack["http"], "bob")
    await page.goto(live_stack["http"] + "/submit")
    choices = page.get_by_role("group", name="Notify me when it is")
    await expect(page.get_by_text("Your account has no email address")).to_be_visible()  # bob has none yet
    await expect(choices.get_by_label("failed")).to_be_disabled()
    await sync_to_async(set_email)(users["bob"], "bob@example.org")
    await page.reload()
    await expect(page.get_by_text("To bob@example.org.")).to_be_visible(timeout=LONG)
    await page.get_by_label("Name", exact=True).fill("mail-me")
    await page.get_by_role("radio", name=re.compile(r"^s-A100")).check()
    await page.get_by_label("Command", exact=True).fill("sleep 600")
    await choices.get_by_label("succeeded").check()
    await choices.get_by_label("failed").check()
    await page.get_by_role("tab", name="YAML").click()
    await expect(page.get_by_label("Job spec (YAML)")).to_have_value(
        re.compile(r"notify:\n  - succeeded\n  - failed")
    )
    await page.get_by_role("tab", name="Form").click()
    await page.get_by_role("button", name="Submit job").click()
    await expect(page).to_have_url(re.compile(r"/jobs/\d+$"), timeout=LONG)
    job_id = int(page.url.rsplit("/", 1)[1])
    assert await sync_to_async(notify_of)(job_id) == ["failed", "succeeded"]

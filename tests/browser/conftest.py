"""Browser tests: the built web app in headless Chromium (the system browser), against the live stack.

They need `frontend/dist` (scripts/build-frontend.sh; `make test` builds it first) and Chromium at
/usr/bin/chromium; without either they are skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BROWSER_DIR = Path(__file__).resolve().parent

# Every browser test: against the live stack, on a database it may change, in the session's loop.
BROWSER_TEST = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]
LONG = 90_000  # ms: generous upper bounds for a loaded machine, never asserted as timings


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    reason = None
    if not Path(CHROMIUM).exists():
        reason = f"{CHROMIUM} is missing: install Chromium to run the browser tests"
    elif not (REPO / "frontend" / "dist" / "index.html").exists():
        reason = "frontend/dist is not built: run scripts/build-frontend.sh"
    if reason is None:
        return
    for item in items:
        if BROWSER_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_context_args, "viewport": {"width": 1366, "height": 860}, "locale": "en-GB"}


@pytest.fixture
def submit_as(users: dict[str, Any]) -> Callable[..., Awaitable[dict[str, Any]]]:
    """await submit_as("alice", name=..., flavor=...) -> the job, submitted over the REST API in-process
    (in a worker thread: the tests run in an event loop, the ORM must not)."""
    from asgiref.sync import sync_to_async
    from rest_framework.test import APIClient

    def submit(username: str, **spec: Any) -> dict[str, Any]:
        from django.db import connection

        client = APIClient()
        client.force_authenticate(users[username])
        body = {"vc": "vision", "flavor": "s-A100", "command": "sleep 600", **spec}
        try:
            response = client.post("/api/v1/jobs/", body, format="json")
        finally:
            connection.close()  # this worker thread's own connection; the test database is dropped at the end
        assert response.status_code == 201, response.content
        return dict(response.json())

    return sync_to_async(submit)


@pytest.fixture
def cancel_as(users: dict[str, Any]) -> Callable[[str, int], Awaitable[None]]:
    """await cancel_as("alice", job_id): cancels over the REST API in-process (in a worker thread)."""
    from asgiref.sync import sync_to_async
    from rest_framework.test import APIClient

    def cancel(username: str, job_id: int) -> None:
        from django.db import connection

        client = APIClient()
        client.force_authenticate(users[username])
        try:
            response = client.post(f"/api/v1/jobs/{job_id}/cancel/")
        finally:
            connection.close()
        assert response.status_code == 200, response.content

    return sync_to_async(cancel)


@pytest.fixture
def a100_agent(start_agent: Any) -> Any:
    """One simulated DGX-A100 host that really runs jobs (process runtime)."""
    from portal.cluster.models import Node
    from tests.conftest import wait_for

    agent = start_agent("a100-node-1")
    ready = Node.objects.filter(name="a100-node-1", state="ready")
    wait_for(ready.exists, 30, "a100-node-1 to say hello")
    return agent


async def sign_in(page: Any, base: str, username: str, password: str | None = None) -> None:
    from playwright.async_api import expect

    await page.goto(base + "/")
    await page.get_by_label("User name").fill(username)
    await page.get_by_label("Password").fill(password or f"{username}-pass")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()

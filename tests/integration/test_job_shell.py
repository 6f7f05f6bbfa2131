"""End to end: a shell in a running job, from a browser's websocket through the portal to a real
agent process, which runs it on a pseudo-terminal in the job's directory and environment
(process runtime), and back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import websockets
from asgiref.sync import sync_to_async
from django.test import Client

from portal.accounts.models import AuditEntry
from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job
from tests.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SLEEP = "import time\ntime.sleep(600)\n"


@pytest.fixture
def running_job(alice_api: httpx.Client, start_agent: Any) -> int:
    start_agent("a100-node-1")
    wait_for(lambda: Node.objects.filter(name="a100-node-1", state="ready").exists(), 30, "the agent's hello")
    spec = {"name": "sleeps", "vc": "vision", "flavor": "s-A100", "command": ["python3", "-c", SLEEP]}
    response = alice_api.post("/api/v1/jobs/", json=spec)
    assert response.status_code == 201, response.text
    job_id = int(response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job_id).state == "running", 60, "the job to run")
    return job_id


async def open_shell(live_stack: dict[str, Any], user: Any, job_id: int) -> Any:
    """The browser's side: signed in with a session cookie, from a page of the portal."""
    client = await sync_to_async(Client)()
    await sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    return await websockets.connect(
        f"{live_stack['ws']}/ws/jobs/{job_id}/shell/?cols=100&rows=30",
        additional_headers={"Cookie": cookie},
        origin=live_stack["http"],
    )


async def frame(socket: Any, timeout: float = 15) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(socket.recv(), timeout))


async def output_until(socket: Any, wanted: str, timeout: float = 15) -> str:
    """The terminal's output until `wanted` appears in it."""
    seen = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while wanted not in seen:
        message = await frame(socket, max(deadline - loop.time(), 0.1))
        assert message["type"] == "output", message
        seen += message["data"]
    return seen


@pytest.mark.asyncio
async def test_the_owner_runs_commands_in_the_job_and_the_shell_ends_with_its_code(
    live_stack: dict[str, Any], users: dict[str, Any], running_job: int
) -> None:
    job_id = running_job
    uuids = await sync_to_async(
        lambda: list(
            Allocation.objects.filter(attempt__job_id=job_id)
            .order_by("gpu__index")
            .values_list("gpu__uuid", flat=True)
        )
    )()
    socket = await open_shell(live_stack, users["alice"], job_id)
    opened = await frame(socket)
    assert opened == {"type": "opened", "job": job_id, "replica": 0, "node": "a100-node-1"}

    await socket.send(json.dumps({"type": "input", "data": "echo $((6*7))\r"}))
    assert "42" in await output_until(socket, "42")
    # The shell has the job's environment: its id and exactly its GPUs.
    await socket.send(json.dumps({"type": "input", "data": "echo job=$GPUPORTAL_JOB_ID\r"}))
    await output_until(socket, f"job={job_id}")
    await socket.send(json.dumps({"type": "input", "data": "echo gpus=$CUDA_VISIBLE_DEVICES.\r"}))
    await output_until(socket, f"gpus={','.join(uuids)}.")
    # The terminal has the size the browser asked for, and follows a resize.
    await socket.send(json.dumps({"type": "input", "data": "stty size\r"}))
    await output_until(socket, "30 100")
    await socket.send(json.dumps({"type": "resize", "cols": 132, "rows": 40}))
    await socket.send(json.dumps({"type": "input", "data": "stty size\r"}))
    await output_until(socket, "40 132")

    await socket.send(json.dumps({"type": "input", "data": "exit 3\r"}))
    message = await frame(socket)
    while message["type"] == "output":
        message = await frame(socket)
    assert message["type"] == "exit" and message["exit_code"] == 3, message
    await asyncio.wait_for(socket.wait_closed(), 10)
    assert socket.close_code == 1000
    actions = await sync_to_async(
        lambda: list(
            AuditEntry.objects.filter(action__startswith="job.shell").values_list("action", flat=True)
        )
    )()
    assert "job.shell.open" in actions
    # The job itself runs on, untouched by its shell.
    assert await sync_to_async(lambda: Job.objects.get(pk=job_id).state)() == "running"


@pytest.mark.asyncio
async def test_a_shell_ends_when_its_job_is_cancelled(
    live_stack: dict[str, Any], users: dict[str, Any], alice_api: httpx.Client, running_job: int
) -> None:
    socket = await open_shell(live_stack, users["alice"], running_job)
    assert (await frame(socket))["type"] == "opened"
    await socket.send(json.dumps({"type": "input", "data": "echo ready\r"}))
    await output_until(socket, "ready")

    response = await sync_to_async(alice_api.post)(f"/api/v1/jobs/{running_job}/cancel/")
    assert response.status_code in (200, 202), response.text
    message = await frame(socket, 60)
    while message["type"] == "output":
        message = await frame(socket, 60)
    assert message["type"] == "exit", message
    await asyncio.wait_for(socket.wait_closed(), 10)
    assert socket.close_code == 1000


@pytest.mark.asyncio
async def test_another_member_of_the_tenant_gets_no_shell_in_the_job(
    live_stack: dict[str, Any], users: dict[str, Any], running_job: int
) -> None:
    socket = await open_shell(live_stack, users["bob"], running_job)  # bob shares alice's tenant
    await asyncio.wait_for(socket.wait_closed(), 10)
    assert socket.close_code == 4403

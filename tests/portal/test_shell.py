"""Shells in running jobs (/ws/jobs/<id>/shell/) over the real Channels stack (Redis channel
layer, PostgreSQL): who may open one, the relay between the browser and a fake agent on the
agent socket, and the ends the portal decides (open timeout, idle, access changed); a client that
is not a browser (the CLI) signing in with an API token. The last test runs a real uvicorn server
and speaks to it over real websockets, browser and agent alike.

Another tenant's job answered like a missing one, and an agent writing into another node's
session, are in tests/security/test_shell_isolation.py.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from agents.protocol import (
    AttemptState,
    ShellExit,
    ShellOutput,
    decode_from_portal,
    encode,
)
from portal.accounts.models import ApiToken, AuditEntry, Membership
from portal.accounts.services import create_api_token, revoke_api_token
from portal.cluster.models import Node
from portal.jobs.models import Job
from portal.lib.redis import get_redis
from tests.conftest import SMALL_JOB, wait_for
from tests.portal.agentgw.test_agent_consumer import greet, hello, place_a_job, status
from tests.portal.test_live_hub import signed_in

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

ORIGIN = "http://localhost"


def application() -> Any:
    from portal.asgi import application

    return application


async def shell_socket(client: Client | None, job_id: int, query: str = "") -> WebsocketCommunicator:
    """A browser's shell socket on `client`'s session (None: not signed in), connected."""
    headers = [(b"origin", ORIGIN.encode())]
    if client is not None:
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    path = f"/ws/jobs/{job_id}/shell/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(application(), path, headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected  # refusals too are told after the handshake, so that the code arrives
    return communicator


async def token_socket(
    token: str | None, job_id: int, query: str = "", *, authorization: str | None = None
) -> WebsocketCommunicator:
    """A shell socket of a client that is not a browser: `Authorization: Bearer <token>` (or
    the `authorization` header as given) and no Origin, connected."""
    header = authorization if authorization is not None else f"Bearer {token}"
    path = f"/ws/jobs/{job_id}/shell/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(application(), path, headers=[(b"authorization", header.encode())])
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


async def token_answer(token: str | None, job_id: int, **kwargs: Any) -> tuple[list[Any], int]:
    communicator = await token_socket(token, job_id, **kwargs)
    result = await frames_until_close(communicator)
    await communicator.disconnect()
    return result


async def frames_until_close(
    communicator: WebsocketCommunicator, timeout: float = 10
) -> tuple[list[Any], int]:
    """The JSON frames the browser got, and the close code that ended them."""
    frames = []
    while True:
        output = await communicator.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return frames, int(output["code"])
        frames.append(json.loads(output["text"]))


async def answer(user: Any, job_id: int, query: str = "") -> tuple[list[Any], int]:
    client = await sync_to_async(signed_in)(user) if user is not None else None
    communicator = await shell_socket(client, job_id, query)
    result = await frames_until_close(communicator)
    await communicator.disconnect()
    return result


async def next_shell_message(agent: WebsocketCommunicator, timeout: float = 10) -> Any:
    """The next shell_* message the fake agent got (desired sets may come between)."""
    while True:
        message = decode_from_portal(await agent.receive_from(timeout=timeout))
        if message.type.startswith("shell_"):
            return message


async def no_shell_message(agent: WebsocketCommunicator, seconds: float = 0.5) -> None:
    """Fails if a shell_* message reaches the fake agent within `seconds` (a receive that times
    out would end the communicator's application, so this waits with receive_nothing)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        if await agent.receive_nothing(timeout=left):
            return
        message = decode_from_portal(await agent.receive_from(timeout=1))
        assert not message.type.startswith("shell_"), f"the agent got {message!r}"


class RunningJob:
    """Alice's job of two replicas of 8 A100s, one on each A100 node, both reported running by
    fake agents on the agent socket."""

    def __init__(self, job: Job, agents: dict[int, tuple[str, WebsocketCommunicator, str]]) -> None:
        self.job = job
        self.agents = agents  # replica -> (node name, fake agent, agent attempt id)

    def node(self, replica: int) -> str:
        return self.agents[replica][0]

    def agent(self, replica: int) -> WebsocketCommunicator:
        return self.agents[replica][1]

    def attempt_id(self, replica: int) -> str:
        return self.agents[replica][2]

    async def close(self) -> None:
        for _, agent, _ in self.agents.values():
            await agent.disconnect()


async def running_job(alice: Any) -> RunningJob:
    connected = {name: (await greet(name))[0] for name in ("a100-node-1", "a100-node-2")}
    job = await sync_to_async(place_a_job)(alice)
    agents = {}
    for name, agent in connected.items():
        (replica,) = decode_from_portal(await agent.receive_from(timeout=10)).attempts
        await agent.send_to(text_data=status(replica.attempt_id, job, AttemptState.RUNNING, 1))
        agents[int(replica.attempt_id.rsplit(".", 1)[1])] = (name, agent, replica.attempt_id)
    for _ in range(100):
        if (await Job.objects.aget(pk=job.pk)).state == "running":
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the job did not start running")
    return RunningJob(job, agents)


def submitted(user: Any) -> int:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    response = client.post("/api/v1/jobs/", SMALL_JOB, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def cancelled(user: Any) -> int:
    from rest_framework.test import APIClient

    job_id = submitted(user)
    client = APIClient()
    client.force_authenticate(user)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 200
    return job_id


async def audited(action: str, job_id: int) -> list[AuditEntry]:
    return [e async for e in AuditEntry.objects.filter(action=action, object_id=str(job_id)).order_by("id")]


async def test_who_may_open_a_shell_and_what_the_others_are_told(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    job_id = running.job.pk
    assert await answer(None, job_id) == ([], 4401)
    assert await answer(users["carol"], job_id) == ([], 4404)  # another tenant's
    assert await answer(users["carol"], 10**9) == ([], 4404)  # none at all
    assert await answer(users["bob"], job_id) == ([], 4403)  # same tenant, not the owner
    assert await answer(users["victor"], job_id) == ([], 4403)  # a viewer of the tenant
    assert await answer(users["admin"], job_id) == ([], 4403)  # a cluster admin sees it, not its shell
    # Every refusal but the anonymous one is audited, counted towards an alert on the user.
    denied = await audited("job.shell.open.denied", job_id)
    assert sorted(e.actor_id for e in denied) == sorted(
        users[n].pk for n in ("carol", "bob", "victor", "admin")
    )
    for replica in (0, 1):
        await no_shell_message(running.agent(replica), 0.2)  # no agent heard of any of them

    # The owner, of a job that does not run (yet, or any more): told why, then 4409.
    pending = await sync_to_async(submitted)(users["alice"])
    frames, code = await answer(users["alice"], pending)
    assert code == 4409 and frames == [
        {"type": "exit", "exit_code": None, "reason": f"job {pending} is pending, not running"}
    ]
    finished = await sync_to_async(cancelled)(users["alice"])
    frames, code = await answer(users["alice"], finished)
    assert code == 4409 and frames[0]["reason"] == f"job {finished} is cancelled, not running"
    # Of a replica the job does not have, or not given as a number.
    for query in ("replica=2", "replica=-1", "replica=first"):
        frames, code = await answer(users["alice"], job_id, query)
        assert code == 4409 and "has no such replica" in frames[0]["reason"], query
    # On a node whose agent is not heard from.
    await Node.objects.filter(name=running.node(1)).aupdate(last_heartbeat_at=None)
    frames, code = await answer(users["alice"], job_id, "replica=1")
    assert code == 4409
    assert frames == [
        {"type": "exit", "exit_code": None, "reason": f"the agent of node {running.node(1)} is not connected"}
    ]
    # An owner who is only a viewer of the job's tenant now.
    await Membership.objects.filter(user=users["alice"]).aupdate(role="viewer")
    assert await answer(users["alice"], job_id) == ([], 4403)
    assert await audited("job.shell.open", job_id) == []  # nothing opened
    await running.close()


async def test_a_cluster_admin_owner_needs_a_members_role_in_the_tenant(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """Staff may submit to a tenant they only view (or do not belong to); a shell in that job is
    still the tenant's work, so they get none, as a viewer owner gets none."""
    from portal.accounts.models import Tenant

    admin = users["admin"]
    await Membership.objects.filter(user=admin).adelete()
    vision = await Tenant.objects.aget(name="vision")
    await Membership.objects.acreate(user=admin, tenant=vision, role="viewer")
    running = await running_job(admin)
    assert await answer(admin, running.job.pk) == ([], 4403)
    await Membership.objects.filter(user=admin).adelete()
    assert await answer(admin, running.job.pk) == ([], 4403)
    denied = await audited("job.shell.open.denied", running.job.pk)
    assert [e.actor_id for e in denied] == [admin.pk, admin.pk]
    assert await audited("job.shell.open", running.job.pk) == []
    await running.close()


async def test_the_relay_between_browser_and_agent(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    agent, other = running.agent(1), running.agent(0)
    browser = await shell_socket(
        await sync_to_async(signed_in)(users["alice"]), running.job.pk, "replica=1&cols=132&rows=43"
    )
    assert await browser.receive_json_from(timeout=10) == {
        "type": "opened",
        "job": running.job.pk,
        "replica": 1,
        "node": running.node(1),
    }
    opened = await next_shell_message(agent)
    assert opened.type == "shell_open" and opened.attempt_id == running.attempt_id(1)
    assert (opened.cols, opened.rows, opened.command) == (132, 43, ["/bin/sh"])
    session = opened.session
    assert len(session) == 32 and int(session, 16) >= 0  # uuid4().hex
    entry = (await audited("job.shell.open", running.job.pk))[0]
    assert entry.actor_id == users["alice"].pk and f"replica 1 on node {running.node(1)}" in entry.detail

    for seq, data in enumerate(["$ ", "ls\r\n", "train.py  data\r\n$ "]):
        await agent.send_to(text_data=encode(ShellOutput(session=session, seq=seq, data=data)))
    got = [await browser.receive_json_from(timeout=5) for _ in range(3)]
    assert got == [{"type": "output", "data": d} for d in ["$ ", "ls\r\n", "train.py  data\r\n$ "]]

    await browser.send_json_to({"type": "input", "data": "ls -la\r"})
    message = await next_shell_message(agent)
    assert (message.type, message.session, message.data) == ("shell_input", session, "ls -la\r")
    await browser.send_json_to({"type": "resize", "cols": 200, "rows": 50})
    message = await next_shell_message(agent)
    assert (message.type, message.session, message.cols, message.rows) == ("shell_resize", session, 200, 50)

    # Frames that are not understood are answered with an error; the socket stays open.
    for bad in (
        "not json",
        json.dumps(["input", "x"]),
        json.dumps({"type": "exec", "data": "x"}),
        json.dumps({"type": "input", "data": ""}),
        json.dumps({"type": "input", "data": "x" * 65537}),
        json.dumps({"type": "input", "data": 7}),
        json.dumps({"type": "input", "data": "\ud800"}),
        json.dumps({"type": "resize", "cols": 0, "rows": 10}),
        json.dumps({"type": "resize", "cols": 80, "rows": 1001}),
        json.dumps({"type": "resize", "cols": True, "rows": 10}),
    ):
        await browser.send_to(text_data=bad)
        reply = await browser.receive_json_from(timeout=5)
        assert reply["type"] == "error" and reply["error"], (bad, reply)
    await no_shell_message(agent, 0.3)
    await browser.send_json_to({"type": "input", "data": "x" * 65536})  # the most one frame holds
    assert (await next_shell_message(agent)).data == "x" * 65536
    await no_shell_message(other, 0.2)  # the other replica's node heard nothing of it

    await agent.send_to(text_data=encode(ShellExit(session=session, exit_code=0, reason="the shell exited")))
    frames, code = await frames_until_close(browser)
    assert frames == [{"type": "exit", "exit_code": 0, "reason": "the shell exited"}] and code == 1000
    await browser.disconnect()
    await no_shell_message(agent, 0.3)  # the agent ended it: nothing to close
    (closed,) = await audited("job.shell.close", running.job.pk)
    assert session in closed.detail and "the shell exited" in closed.detail
    await running.close()


async def test_a_browser_that_goes_closes_the_session_on_the_agent(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk)
    assert (await browser.receive_json_from(timeout=10))["replica"] == 0  # replica 0 by default
    opened = await next_shell_message(running.agent(0))
    assert (opened.cols, opened.rows) == (80, 24)
    await asyncio.sleep(1.1)
    await browser.disconnect()
    closed = await next_shell_message(running.agent(0))
    assert (closed.type, closed.session) == ("shell_close", opened.session)
    (entry,) = await audited("job.shell.close", running.job.pk)
    assert entry.actor_id == users["alice"].pk and "the browser closed it" in entry.detail
    seconds = re.search(r"open (\d+) s", entry.detail)
    assert seconds is not None and 1 <= int(seconds[1]) <= 5, entry.detail
    await running.close()


async def test_a_user_has_at_most_so_many_shells_open(users, paused_loop, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SHELL_MAX_SESSIONS_PER_USER = 2
    running = await running_job(users["alice"])
    alice = await sync_to_async(signed_in)(users["alice"])
    first = await shell_socket(alice, running.job.pk)
    second = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk, "replica=1")
    for browser in (first, second):
        assert (await browser.receive_json_from(timeout=10))["type"] == "opened"
    assert await answer(users["alice"], running.job.pk) == ([], 4429)
    # Counted in Redis, for every web process alike.
    assert get_redis().zcard(f"shell:sessions:{users['alice'].pk}") == 2
    # A closed session frees its place.
    await first.disconnect()
    assert get_redis().zcard(f"shell:sessions:{users['alice'].pk}") == 1
    third = await shell_socket(alice, running.job.pk)
    assert (await third.receive_json_from(timeout=10))["type"] == "opened"
    for browser in (second, third):
        await browser.disconnect()
    assert get_redis().zcard(f"shell:sessions:{users['alice'].pk}") == 0
    await running.close()


async def test_an_agent_that_does_not_answer_ends_the_session(users, paused_loop, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SHELL_OPEN_TIMEOUT_S = 1
    running = await running_job(users["alice"])
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk)
    assert (await browser.receive_json_from(timeout=10))["type"] == "opened"
    opened = await next_shell_message(running.agent(0))
    frames, code = await frames_until_close(browser, timeout=5)
    assert code == 4504
    assert frames == [
        {"type": "exit", "exit_code": None, "reason": f"no answer from the agent of node {running.node(0)}"}
    ]
    closed = await next_shell_message(running.agent(0))  # should it answer late, it closes it
    assert (closed.type, closed.session) == ("shell_close", opened.session)
    await browser.disconnect()
    await running.close()


async def test_an_agent_that_answers_in_time_keeps_the_session(users, paused_loop, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SHELL_OPEN_TIMEOUT_S = 1
    running = await running_job(users["alice"])
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk)
    await browser.receive_json_from(timeout=10)
    opened = await next_shell_message(running.agent(0))
    await running.agent(0).send_to(text_data=encode(ShellOutput(session=opened.session, seq=0, data="$ ")))
    assert await browser.receive_json_from(timeout=5) == {"type": "output", "data": "$ "}
    assert await browser.receive_nothing(timeout=1.5)  # past the open timeout: still open
    await browser.disconnect()
    await running.close()


async def test_a_shell_without_input_is_closed(users, paused_loop, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SHELL_IDLE_TIMEOUT_S = 2
    running = await running_job(users["alice"])
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk)
    await browser.receive_json_from(timeout=10)
    opened = await next_shell_message(running.agent(0))
    await running.agent(0).send_to(text_data=encode(ShellOutput(session=opened.session, seq=0, data="$ ")))
    await browser.receive_json_from(timeout=5)
    await asyncio.sleep(1.2)
    await browser.send_json_to({"type": "input", "data": "\r"})  # input starts the time again
    assert (await next_shell_message(running.agent(0))).type == "shell_input"
    assert await browser.receive_nothing(timeout=1.3)  # 2.5 s after the open: still open
    frames, code = await frames_until_close(browser, timeout=5)
    assert frames == [{"type": "exit", "exit_code": None, "reason": "closed after 2 seconds without input"}]
    assert code == 1000
    closed = await next_shell_message(running.agent(0))
    assert (closed.type, closed.session) == ("shell_close", opened.session)
    await browser.disconnect()
    (entry,) = await audited("job.shell.close", running.job.pk)
    assert "without input" in entry.detail
    await running.close()


async def test_a_shell_ends_when_the_agent_connection_that_answered_it_closes(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """The agent ends its shells when it loses the portal and cannot say so: the portal does."""
    running = await running_job(users["alice"])
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk)
    await browser.receive_json_from(timeout=10)
    opened = await next_shell_message(running.agent(0))
    await running.agent(0).send_to(text_data=encode(ShellOutput(session=opened.session, seq=0, data="$ ")))
    await browser.receive_json_from(timeout=5)
    await running.agent(1).disconnect()  # another node's agent going changes nothing
    assert await browser.receive_nothing(timeout=0.5)
    await running.agent(0).disconnect()
    frames, code = await frames_until_close(browser)
    reason = f"the connection to the agent of node {running.node(0)} was lost"
    assert frames == [{"type": "exit", "exit_code": None, "reason": reason}] and code == 1000
    await browser.disconnect()
    (entry,) = await audited("job.shell.close", running.job.pk)
    assert reason in entry.detail


async def test_signing_out_closes_the_shells_of_that_session(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    laptop = await sync_to_async(signed_in)(users["alice"])
    phone = await sync_to_async(signed_in)(users["alice"])
    on_laptop, on_phone = (
        await shell_socket(laptop, running.job.pk),
        await shell_socket(phone, running.job.pk),
    )
    await on_laptop.receive_json_from(timeout=10)
    await on_phone.receive_json_from(timeout=10)
    sessions = {(await next_shell_message(running.agent(0))).session for _ in range(2)}
    await sync_to_async(laptop.logout)()
    assert await frames_until_close(on_laptop) == ([], 4403)
    await on_laptop.disconnect()
    closed = await next_shell_message(running.agent(0))
    assert closed.type == "shell_close" and closed.session in sessions
    assert await on_phone.receive_nothing(timeout=0.5)  # the phone's session is still signed in
    # Another tenant's admins adding and removing her there close nothing of vision's.
    from portal.accounts.models import Tenant

    speech = await Tenant.objects.aget(name="speech")
    elsewhere = await Membership.objects.acreate(user=users["alice"], tenant=speech, role="member")
    await elsewhere.adelete()
    assert await on_phone.receive_nothing(timeout=0.5)
    # Losing the membership of the job's tenant closes every shell of the user there.
    await Membership.objects.filter(user=users["alice"]).adelete()
    assert await frames_until_close(on_phone) == ([], 4403)
    await on_phone.disconnect()
    last = await next_shell_message(running.agent(0))
    assert last.type == "shell_close" and last.session == (sessions - {closed.session}).pop()
    await running.close()


async def test_a_client_with_an_api_token_opens_a_shell(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """The CLI cannot have a session: it sends its API token, and no Origin, as no browser can."""
    running = await running_job(users["alice"])
    token, raw = await sync_to_async(create_api_token)(users["alice"], "laptop")
    client = await token_socket(raw, running.job.pk, "replica=1&cols=100&rows=30")
    assert await client.receive_json_from(timeout=10) == {
        "type": "opened",
        "job": running.job.pk,
        "replica": 1,
        "node": running.node(1),
    }
    opened = await next_shell_message(running.agent(1))
    assert (opened.type, opened.cols, opened.rows) == ("shell_open", 100, 30)
    await running.agent(1).send_to(text_data=encode(ShellOutput(session=opened.session, seq=0, data="$ ")))
    assert await client.receive_json_from(timeout=5) == {"type": "output", "data": "$ "}
    await client.send_json_to({"type": "input", "data": "echo hi\r"})
    message = await next_shell_message(running.agent(1))
    assert (message.type, message.data) == ("shell_input", "echo hi\r")
    # The audit log says which token opened it, and how it ended.
    (entry,) = await audited("job.shell.open", running.job.pk)
    assert entry.actor_id == users["alice"].pk
    assert entry.detail.endswith(f"session {opened.session}, token {token}"), entry.detail
    assert (await ApiToken.objects.aget(pk=token.pk)).last_used_at is not None
    await client.disconnect()
    closed = await next_shell_message(running.agent(1))
    assert (closed.type, closed.session) == ("shell_close", opened.session)
    (entry,) = await audited("job.shell.close", running.job.pk)
    assert f"token {token}" in entry.detail and entry.detail.endswith("the client closed it")
    # A browser's shell says nothing of tokens.
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk)
    await browser.receive_json_from(timeout=10)
    await browser.disconnect()
    browsers = await audited("job.shell.open", running.job.pk)
    assert len(browsers) == 2 and "token" not in browsers[1].detail
    await running.close()


async def test_a_token_that_may_not_be_used_is_not_signed_in(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    job_id = running.job.pk
    revoked, revoked_raw = await sync_to_async(create_api_token)(users["alice"], "revoked")
    await sync_to_async(revoke_api_token)(revoked, users["alice"])
    expired, expired_raw = await sync_to_async(create_api_token)(users["alice"], "expired")
    await ApiToken.objects.filter(pk=expired.pk).aupdate(expires_at=expired.created_at)
    _, bob_raw = await sync_to_async(create_api_token)(users["bob"], "bob's")
    _, good_raw = await sync_to_async(create_api_token)(users["alice"], "good")
    assert await token_answer(revoked_raw, job_id) == ([], 4401)
    assert await token_answer(expired_raw, job_id) == ([], 4401)
    assert await token_answer("gpp_made-up", job_id) == ([], 4401)
    assert await token_answer(None, job_id, authorization=f"Basic {good_raw}") == ([], 4401)  # not Bearer
    assert await token_answer(None, job_id, authorization="Bearer") == ([], 4401)
    # The same tokens, once usable, are signed in: refused for what they are, not unheard.
    assert await token_answer(bob_raw, job_id) == ([], 4403)  # bob's own token: not his job
    await User.objects.filter(pk=users["bob"].pk).aupdate(is_active=False)
    assert await token_answer(bob_raw, job_id) == ([], 4401)  # an inactive account's token
    # A token-signed socket takes nothing from a cookie: the session of the owner beside a bad
    # token does not sign it in.
    cookie = f"sessionid={(await sync_to_async(signed_in)(users['alice'])).cookies['sessionid'].value}"
    communicator = WebsocketCommunicator(
        application(),
        f"/ws/jobs/{job_id}/shell/",
        headers=[(b"authorization", f"Bearer {revoked_raw}".encode()), (b"cookie", cookie.encode())],
    )
    assert (await communicator.connect(timeout=10))[0]
    assert await frames_until_close(communicator) == ([], 4401)
    await communicator.disconnect()
    await no_shell_message(running.agent(0), 0.2)
    assert await audited("job.shell.open", job_id) == []
    await running.close()


async def test_revoking_the_token_closes_its_shell_and_a_sign_out_does_not(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    token, raw = await sync_to_async(create_api_token)(users["alice"], "cli")
    other, _ = await sync_to_async(create_api_token)(users["alice"], "another")
    laptop = await sync_to_async(signed_in)(users["alice"])
    from_cli = await token_socket(raw, running.job.pk)
    in_browser = await shell_socket(laptop, running.job.pk)
    await from_cli.receive_json_from(timeout=10)
    await in_browser.receive_json_from(timeout=10)
    sessions = [(await next_shell_message(running.agent(0))).session for _ in range(2)]
    # The same user signs out of the browser: its shell closes, the CLI's stays open.
    await sync_to_async(laptop.logout)()
    assert await frames_until_close(in_browser) == ([], 4403)
    await in_browser.disconnect()
    assert (await next_shell_message(running.agent(0))).type == "shell_close"
    assert await from_cli.receive_nothing(timeout=0.5)
    # Revoking another of the user's tokens leaves it open too.
    await sync_to_async(revoke_api_token)(other, users["alice"])
    assert await from_cli.receive_nothing(timeout=0.5)
    # Revoking its own closes it, and its session on the agent.
    await sync_to_async(revoke_api_token)(token, users["alice"])
    assert await frames_until_close(from_cli) == ([], 4403)
    await from_cli.disconnect()
    closed = await next_shell_message(running.agent(0))
    assert closed.type == "shell_close" and closed.session in sessions
    entries = await audited("job.shell.close", running.job.pk)
    assert entries[-1].detail.endswith("the token cli was revoked"), entries[-1].detail
    await running.close()


async def test_a_revocation_does_not_close_a_browsers_shell(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    token, _ = await sync_to_async(create_api_token)(users["alice"], "cli")
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk)
    await browser.receive_json_from(timeout=10)
    await sync_to_async(revoke_api_token)(token, users["alice"])
    assert await browser.receive_nothing(timeout=0.5)
    await browser.disconnect()
    await running.close()


async def test_a_tokens_shell_closes_when_the_users_access_changes(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    first, first_raw = await sync_to_async(create_api_token)(users["alice"], "first")
    _, second_raw = await sync_to_async(create_api_token)(users["alice"], "second")
    one = await token_socket(first_raw, running.job.pk)
    two = await token_socket(second_raw, running.job.pk, "replica=1")
    for client in (one, two):
        assert (await client.receive_json_from(timeout=10))["type"] == "opened"
    # Deleting a token (an admin may) is as revoking it.
    await ApiToken.objects.filter(pk=first.pk).adelete()
    assert await frames_until_close(one) == ([], 4403)
    await one.disconnect()
    assert await two.receive_nothing(timeout=0.5)
    # A membership lost: every shell of the user closes, however it was signed in.
    await Membership.objects.filter(user=users["alice"]).adelete()
    assert await frames_until_close(two) == ([], 4403)
    await two.disconnect()
    await running.close()


# ---------------------------------------------------------------------------
# A real server: uvicorn in its own process, browser and agent on real websockets.
# ---------------------------------------------------------------------------


async def real_agent(server: str, name: str) -> Any:
    """A fake agent of node `name` on a real websocket to `server` (host:port), greeted."""
    from websockets.asyncio.client import connect

    from portal.cluster.services import issue_node_token

    token = await sync_to_async(issue_node_token)(await Node.objects.aget(name=name), None)
    ws = await connect(f"ws://{server}/ws/agent/", additional_headers={"Authorization": f"Bearer {token}"})
    await ws.send(encode(hello(name)))
    assert decode_from_portal(await asyncio.wait_for(ws.recv(), 10)).type == "welcome"
    assert decode_from_portal(await asyncio.wait_for(ws.recv(), 10)).type == "desired_set"
    return ws


async def real_shell_message(ws: Any) -> Any:
    """The next shell_* message a fake agent on a real websocket got."""
    while True:
        message = decode_from_portal(await asyncio.wait_for(ws.recv(), 10))
        if message.type.startswith("shell_"):
            return message


class RealRunningJob:
    """As RunningJob, with the fake agents on real websockets to a real server: Alice's job of
    two replicas, one on each A100 node, both reported running."""

    def __init__(self, job: Job, replicas: dict[int, tuple[Any, str]], agents: list[Any]) -> None:
        self.job = job
        self.replicas = replicas  # replica -> (fake agent, agent attempt id)
        self.agents = agents

    def agent(self, replica: int) -> Any:
        return self.replicas[replica][0]

    def attempt_id(self, replica: int) -> str:
        return self.replicas[replica][1]

    async def close(self) -> None:
        for ws in self.agents:
            await ws.close()


async def real_running_job(server: str, alice: Any) -> RealRunningJob:
    agents = [await real_agent(server, name) for name in ("a100-node-1", "a100-node-2")]
    job = await sync_to_async(place_a_job)(alice)
    replicas = {}
    for ws in agents:
        (replica,) = decode_from_portal(await asyncio.wait_for(ws.recv(), 10)).attempts
        await ws.send(status(replica.attempt_id, job, AttemptState.RUNNING, 1))
        replicas[int(replica.attempt_id.rsplit(".", 1)[1])] = (ws, replica.attempt_id)
    await sync_to_async(wait_for)(lambda: Job.objects.get(pk=job.pk).state == "running", 10, "the job to run")
    return RealRunningJob(job, replicas, agents)


async def test_a_real_server_relays_a_session_and_tells_each_refusal(
    users, paused_loop, shell_server
) -> None:  # type: ignore[no-untyped-def]
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    def browser(user: Any | None, job_id: int, query: str = "") -> Any:
        headers = {}
        if user is not None:
            headers["Cookie"] = f"sessionid={signed_in(user).cookies['sessionid'].value}"
        url = f"ws://{shell_server}/ws/jobs/{job_id}/shell/" + (f"?{query}" if query else "")
        return connect(url, origin=f"http://{shell_server}", additional_headers=headers)  # type: ignore[arg-type]

    async def close_code(ws: Any) -> int:
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None
        return int(closed.value.rcvd.code)

    running = await real_running_job(shell_server, users["alice"])
    job = running.job

    # Each refusal reaches a real client as its own close code.
    for user, job_id, code in (
        (None, job.pk, 4401),
        (users["carol"], job.pk, 4404),
        (users["bob"], job.pk, 4403),
    ):
        async with await sync_to_async(browser)(user, job_id) as ws:
            assert await close_code(ws) == code, user

    agent_ws, attempt_id = running.agent(0), running.attempt_id(0)
    async with await sync_to_async(browser)(users["alice"], job.pk, "cols=100&rows=30") as ws:
        opened = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert opened == {"type": "opened", "job": job.pk, "replica": 0, "node": opened["node"]}
        shell_open = await real_shell_message(agent_ws)
        assert (shell_open.attempt_id, shell_open.cols, shell_open.rows) == (attempt_id, 100, 30)
        for seq in range(20):
            await agent_ws.send(
                encode(ShellOutput(session=shell_open.session, seq=seq, data=f"line {seq}\r\n"))
            )
        got = [json.loads(await asyncio.wait_for(ws.recv(), 10))["data"] for _ in range(20)]
        assert got == [f"line {seq}\r\n" for seq in range(20)]
        await ws.send(json.dumps({"type": "input", "data": "exit\r"}))
        message = await real_shell_message(agent_ws)
        assert (message.type, message.data) == ("shell_input", "exit\r")
        await ws.send(json.dumps({"type": "resize", "cols": 90, "rows": 20}))
        assert (await real_shell_message(agent_ws)).type == "shell_resize"
        await agent_ws.send(
            encode(ShellExit(session=shell_open.session, exit_code=3, reason="exited with 3"))
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {
            "type": "exit",
            "exit_code": 3,
            "reason": "exited with 3",
        }
        assert await close_code(ws) == 1000
    await sync_to_async(wait_for)(
        lambda: AuditEntry.objects.filter(action="job.shell.close", object_id=str(job.pk)).exists(),
        10,
        "the close to be audited",
    )
    assert await AuditEntry.objects.filter(action="job.shell.open", object_id=str(job.pk)).acount() == 1
    await running.close()


async def test_a_shell_closes_when_its_token_or_session_expires(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """Signed in at the handshake is not signed in forever: a token or a session that expires
    while its shell is open closes the shell then, as the next request would be refused."""
    running = await running_job(users["alice"])
    token, raw = await sync_to_async(create_api_token)(users["alice"], "short")
    await ApiToken.objects.filter(pk=token.pk).aupdate(expires_at=timezone.now() + timedelta(seconds=1.5))
    laptop = await sync_to_async(signed_in)(users["alice"])
    session_key = laptop.cookies["sessionid"].value
    await Session.objects.filter(session_key=session_key).aupdate(
        expire_date=timezone.now() + timedelta(seconds=2.5)
    )
    lasting = await sync_to_async(signed_in)(users["alice"])
    from_cli = await token_socket(raw, running.job.pk)
    in_browser = await shell_socket(laptop, running.job.pk)
    in_other_browser = await shell_socket(lasting, running.job.pk)
    for socket in (from_cli, in_browser, in_other_browser):
        await socket.receive_json_from(timeout=10)
    sessions = [(await next_shell_message(running.agent(0))).session for _ in range(3)]

    token_expired = {"type": "exit", "exit_code": None, "reason": "the token short expired; sign in again"}
    assert await frames_until_close(from_cli) == ([token_expired], 4403)
    assert await in_browser.receive_nothing(timeout=0.3)  # its session has a second to go
    session_expired = {"type": "exit", "exit_code": None, "reason": "the session expired; sign in again"}
    assert await frames_until_close(in_browser) == ([session_expired], 4403)
    closed = [await next_shell_message(running.agent(0)) for _ in range(2)]
    assert [(m.type, m.session) for m in closed] == [("shell_close", s) for s in sessions[:2]]
    assert await in_other_browser.receive_nothing(timeout=0.5)  # a session that lasts keeps its shell
    for socket in (from_cli, in_browser):
        await socket.disconnect()
    entries = await audited("job.shell.close", running.job.pk)
    assert len(entries) == 2
    assert entries[0].detail.endswith("s; the token short expired; sign in again"), entries[0].detail
    assert entries[1].detail.endswith("s; the session expired; sign in again"), entries[1].detail
    await in_other_browser.disconnect()
    await running.close()

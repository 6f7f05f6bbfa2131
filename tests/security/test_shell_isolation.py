"""Shells in running jobs, as an attacker sees them (the open and relay themselves are in
tests/portal/test_shell.py): another tenant's job is answered exactly like a job that does not
exist, whatever its state and whatever is asked of it, with a session or an API token; an agent
cannot write into a session that runs on another node, even one of the same job, even knowing the
session's id; and a page of another site can open a shell neither with the user's session nor
by naming a token: a handshake with an Origin is a browser's, checked as one."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agents.protocol import ShellExit, ShellOutput, encode
from portal.accounts.models import AuditEntry
from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from tests.portal.test_live_hub import signed_in
from tests.portal.test_shell import (
    answer,
    frames_until_close,
    next_shell_message,
    no_shell_message,
    running_job,
    shell_socket,
    submitted,
    token_answer,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_another_tenants_job_is_answered_like_one_that_does_not_exist(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    pending = await sync_to_async(submitted)(users["alice"])
    missing = 10**9
    carol = users["carol"]
    nothing_there = await answer(carol, missing)
    assert nothing_there == ([], 4404)
    # Running or pending, any replica or none: the same answer, never the 4409 and reason that
    # the owner gets, which would tell whether the job exists and what it does.
    for job_id, query in (
        (running.job.pk, ""),
        (running.job.pk, "replica=1"),
        (running.job.pk, "replica=7"),
        (pending, ""),
        (missing, "replica=7"),
        (10**20, ""),  # past the largest id the database holds
    ):
        assert await answer(carol, job_id, query) == nothing_there, (job_id, query)
    for replica in (0, 1):
        await no_shell_message(running.agent(replica), 0.2)
    # Each attempt is audited as refused, counted towards an alert on Carol.
    denied = [e async for e in AuditEntry.objects.filter(action="job.shell.open.denied", actor=carol)]
    assert len(denied) == 7
    assert await AuditEntry.objects.filter(
        action="security.alert", detail__contains=f"user:{carol.pk}"
    ).aexists()
    await running.close()


async def test_an_agent_cannot_write_into_a_session_on_another_node(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    ours, theirs = running.agent(0), running.agent(1)  # both run a replica of the same job
    browser = await shell_socket(await sync_to_async(signed_in)(users["alice"]), running.job.pk, "replica=0")
    assert (await browser.receive_json_from(timeout=10))["node"] == running.node(0)
    session = (await next_shell_message(ours)).session
    # The other node's agent learnt the session id: its output and its exit reach no one.
    await theirs.send_to(text_data=encode(ShellOutput(session=session, seq=0, data="rm -rf / # injected")))
    await theirs.send_to(text_data=encode(ShellExit(session=session, exit_code=0, reason="forged")))
    assert await browser.receive_nothing(timeout=1.0)
    # The session still belongs to its own node: its output arrives, and nothing before it.
    await ours.send_to(text_data=encode(ShellOutput(session=session, seq=0, data="$ ")))
    assert await browser.receive_json_from(timeout=5) == {"type": "output", "data": "$ "}
    await ours.send_to(text_data=encode(ShellExit(session=session, exit_code=0, reason="exited")))
    frames, code = await frames_until_close(browser)
    assert frames == [{"type": "exit", "exit_code": 0, "reason": "exited"}] and code == 1000
    await browser.disconnect()
    # The attempt is audited against the node that made it.
    other = await Node.objects.aget(name=running.node(1))
    refused = [e async for e in AuditEntry.objects.filter(action="agent.shell.denied")]
    assert [(e.object_type, e.object_id) for e in refused] == [("cluster.Node", str(other.pk))]
    assert session in refused[0].detail
    await running.close()


async def test_another_site_cannot_open_a_shell_with_the_users_session(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """A page elsewhere that the signed-in owner visits would otherwise type into the job."""
    from channels.testing import WebsocketCommunicator

    from portal.asgi import application

    running = await running_job(users["alice"])
    client = await sync_to_async(signed_in)(users["alice"])
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    for origin in (b"https://evil.example", b"null", None):
        headers = [(b"cookie", cookie)] + ([(b"origin", origin)] if origin is not None else [])
        communicator = WebsocketCommunicator(
            application, f"/ws/jobs/{running.job.pk}/shell/", headers=headers
        )
        connected, _ = await communicator.connect(timeout=10)
        assert not connected, origin
    await no_shell_message(running.agent(0), 0.3)
    assert not await AuditEntry.objects.filter(action="job.shell.open").aexists()
    await running.close()


async def test_another_tenants_job_is_answered_like_a_missing_one_to_a_token_too(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    running = await running_job(users["alice"])
    _, carols = await sync_to_async(create_api_token)(users["carol"], "cli")
    nothing_there = await token_answer(carols, 10**9)
    assert nothing_there == ([], 4404)
    for query in ("", "replica=1", "replica=7"):
        assert await token_answer(carols, running.job.pk, query=query) == nothing_there, query
    for replica in (0, 1):
        await no_shell_message(running.agent(replica), 0.2)
    denied = [
        e async for e in AuditEntry.objects.filter(action="job.shell.open.denied", actor=users["carol"])
    ]
    assert len(denied) == 4
    await running.close()


async def test_a_handshake_with_an_origin_is_a_browsers_even_with_a_token(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """No browser can send Authorization on a websocket; one that claims to is checked as a browser:
    another site's page is refused at the handshake, and this site's is not signed in by the
    token (only a session signs a browser in)."""
    from channels.testing import WebsocketCommunicator

    from portal.asgi import application

    running = await running_job(users["alice"])
    _, raw = await sync_to_async(create_api_token)(users["alice"], "cli")
    bearer = (b"authorization", f"Bearer {raw}".encode())
    path = f"/ws/jobs/{running.job.pk}/shell/"
    for origin in (b"https://evil.example", b"null"):
        communicator = WebsocketCommunicator(application, path, headers=[bearer, (b"origin", origin)])
        connected, _ = await communicator.connect(timeout=10)
        assert not connected, origin
    communicator = WebsocketCommunicator(
        application, path, headers=[bearer, (b"origin", b"http://localhost")]
    )
    assert (await communicator.connect(timeout=10))[0]
    assert await frames_until_close(communicator) == ([], 4401)
    await communicator.disconnect()
    await no_shell_message(running.agent(0), 0.3)
    assert not await AuditEntry.objects.filter(action="job.shell.open").aexists()
    # Without the Origin, the same token opens it.
    assert (await token_answer(raw, running.job.pk, query="replica=9"))[1] == 4409
    await running.close()

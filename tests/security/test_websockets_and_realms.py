"""Who may open which socket and see what (reliability-security.md S3, S4, S5, S7, S8), over the
real Channels stack (Redis channel layer, PostgreSQL).

Covered elsewhere: every REST route and action as owner, peer, viewer, other tenant and anonymous,
with 404 for another tenant's objects (S1, S2) in tests/portal/test_tenant_isolation.py; the agent
socket refusing missing, wrong and user tokens and browsers, and a node reporting on another
node's replica (S7) in tests/portal/agentgw/test_agent_consumer.py; revoked and expired API tokens
in tests/portal/test_api_tokens.py; the browser's live socket answering another tenant's job like
a missing one in tests/browser/test_researcher_flows.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from portal.cluster.models import Node
from portal.cluster.services import issue_node_token

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

ORIGIN = "http://localhost"


def application() -> Any:
    from portal.asgi import application

    return application


def session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


async def live_socket(
    user: Any | None, origin: str | None = ORIGIN
) -> tuple[WebsocketCommunicator, bool, Any]:
    headers = []
    if user is not None:
        headers.append((b"cookie", (await sync_to_async(session_cookie)(user)).encode()))
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    communicator = WebsocketCommunicator(application(), "/ws/live/", headers=headers)
    connected, code = await communicator.connect()
    return communicator, connected, code


def submit(user: Any, vc: str, flavor: str) -> int:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    spec = {"name": "j", "vc": vc, "flavor": flavor, "command": "true"}
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def cancel(user: Any, job_id: int) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 200


async def test_cross_site_and_anonymous_handshakes_are_refused(users) -> None:  # type: ignore[no-untyped-def]
    """S5: a valid session with a foreign Origin, or with none, is refused at the handshake;
    an anonymous socket from this site is closed with 4401."""
    for origin in ("https://evil.example", "null", None):
        communicator, connected, _ = await live_socket(users["alice"], origin)
        assert not connected, origin
    communicator, connected, code = await live_socket(None)
    assert not connected and code == 4401
    communicator, connected, _ = await live_socket(users["alice"])
    assert connected
    await communicator.disconnect()


async def test_a_socket_never_carries_another_tenants_jobs(users) -> None:  # type: ignore[no-untyped-def]
    """S4: subscriptions to another tenant's job, to made-up group names and to malformed topics
    are refused; a socket subscribed to its tenant's jobs gets none of the other tenant's news."""
    carols = await sync_to_async(submit)(users["carol"], "speech", "s-V100")
    alices = await sync_to_async(submit)(users["alice"], "vision", "s-A100")
    communicator, connected, _ = await live_socket(users["alice"])
    assert connected
    for request in (
        {"subscribe": "job", "id": carols},
        {"subscribe": "job", "id": str(carols)},
        {"subscribe": "job", "id": 10**12},
        {"subscribe": "tenant.1"},
        {"subscribe": "jobs.all"},
        {"subscribe": f"job.{carols}"},
        {"subscribe": "jobs", "tenant": "speech"},
        ["subscribe", "jobs"],
    ):
        await communicator.send_to(text_data=json.dumps(request))
        answer = json.loads(await communicator.receive_from(timeout=5))
        if request == {"subscribe": "jobs", "tenant": "speech"}:
            assert answer == {"subscribed": "jobs", "id": None}  # its own tenant's, whatever it asks
        else:
            assert "error" in answer and "subscribed" not in answer, (request, answer)
    # Carol's job changes first, then Alice's: the socket gets Alice's and nothing before it.
    await sync_to_async(cancel)(users["carol"], carols)
    await sync_to_async(cancel)(users["alice"], alices)
    while True:
        message = json.loads(await communicator.receive_from(timeout=10))
        assert message.get("job") != carols, message
        if message.get("job") == alices and message.get("state") == "cancelled":
            break
    await communicator.disconnect()


async def test_an_agent_token_opens_no_user_door_and_a_replaced_one_no_agent_door(users) -> None:  # type: ignore[no-untyped-def]
    """S7, S8: a node's token is not a user credential; after the token is replaced, the old one
    no longer opens the agent socket."""
    from rest_framework.test import APIClient

    node = await Node.objects.aget(name="a100-node-1")
    old = await sync_to_async(issue_node_token)(node, None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {old}")
    for url in ("/api/v1/jobs/", "/api/v1/me/", "/api/v1/nodes/"):
        response = await sync_to_async(client.get)(url)
        assert response.status_code == 401, url
    new = await sync_to_async(issue_node_token)(node, None)
    for token, accepted in ((old, False), (new, True)):
        headers = [(b"authorization", f"Bearer {token}".encode())]
        communicator = WebsocketCommunicator(application(), "/ws/agent/", headers=headers)
        connected, code = await communicator.connect()
        assert connected is accepted, token
        if accepted:
            await communicator.disconnect()
        else:
            assert code == 4401
    # A user's session is no agent credential either.
    cookie = (await sync_to_async(session_cookie)(users["admin"])).encode()
    communicator = WebsocketCommunicator(application(), "/ws/agent/", headers=[(b"cookie", cookie)])
    connected, code = await communicator.connect()
    assert not connected and code == 4401


async def test_filters_ordering_and_counts_stay_within_the_tenant(users) -> None:  # type: ignore[no-untyped-def]
    """S3: filtering or ordering on another tenant's names and ids finds nothing, and counts
    count only what the caller may see."""
    from rest_framework.test import APIClient

    alices = [await sync_to_async(submit)(users["alice"], "vision", "s-A100") for _ in range(3)]
    await sync_to_async(submit)(users["carol"], "speech", "s-V100")
    carol = APIClient()
    carol.force_authenticate(users["carol"])

    def count(url: str) -> int:
        response = carol.get(url)
        assert response.status_code == 200, (url, response.content[:200])
        return int(response.json()["count"])

    for query in (
        "?vc=vision",
        "?owner=alice",
        f"?q={alices[0]}",
        "?q=j&vc=vision",
        "?state=pending&vc=vision",
        "?ordering=-priority&owner=alice",
        "?limit=1&offset=0&vc=vision",
    ):
        assert await sync_to_async(count)(f"/api/v1/jobs/{query}") == 0, query
    assert await sync_to_async(count)("/api/v1/jobs/") == 1
    assert await sync_to_async(count)("/api/v1/jobs/?ordering=id&limit=1") == 1
    response = await sync_to_async(carol.get)("/api/v1/virtual-clusters/vision/")
    assert response.status_code == 404
    usage = (await sync_to_async(carol.get)("/api/v1/usage/?group=tenant")).json()
    assert all(row.get("tenant") != "vision" for row in usage["results"])

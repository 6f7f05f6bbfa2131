"""The web process's fan-out hub over real Redis pub/sub: one subscription per topic however many
browsers follow it, none once the last leaves, and back after Redis drops the connection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from portal.lib.redis import get_redis
from portal.live.hub import channel_for
from tests.portal.hint_helpers import HintListener

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


async def live_socket(client: Client) -> WebsocketCommunicator:
    """A browser's live socket on `client`'s session, following its tenants' jobs."""
    from portal.asgi import application

    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    communicator = WebsocketCommunicator(
        application, "/ws/live/", headers=[(b"cookie", cookie), (b"origin", b"http://localhost")]
    )
    assert (await communicator.connect())[0]
    await communicator.send_json_to({"subscribe": "jobs"})
    assert (await communicator.receive_json_from(timeout=5))["subscribed"] == "jobs"
    return communicator


async def browser(user: Any) -> WebsocketCommunicator:
    return await live_socket(await sync_to_async(signed_in)(user))


def subscribers(topic: str) -> int:
    return int(get_redis().pubsub_numsub(channel_for(topic))[0][1])


@pytest.mark.asyncio
async def test_one_subscription_per_topic_and_every_browser_gets_the_message(users) -> None:  # type: ignore[no-untyped-def]
    alice, bob = users["alice"], users["bob"]
    browsers = [await browser(alice), await browser(alice), await browser(bob)]  # one tenant
    topic = (await sync_to_async(_tenant_topics)(alice))[0]
    assert await sync_to_async(subscribers)(topic) == 1  # three browsers, one subscription
    get_redis().publish(channel_for(topic), '{"kind": "job", "job": 7}')
    for communicator in browsers:
        assert await communicator.receive_json_from(timeout=5) == {"kind": "job", "job": 7}
    for communicator in browsers:
        await communicator.disconnect()
    assert await sync_to_async(subscribers)(topic) == 0


def _tenant_topics(user: Any) -> list[str]:
    from portal.live.consumers import tenant_groups

    return tenant_groups(user)


@pytest.mark.asyncio
async def test_the_hub_resubscribes_after_redis_drops_its_connection(users) -> None:  # type: ignore[no-untyped-def]
    communicator = await browser(users["alice"])
    topic = (await sync_to_async(_tenant_topics)(users["alice"]))[0]
    assert get_redis().client_kill_filter(_type="pubsub") >= 1
    # Messages published while the hub reconnects are lost (they are hints); it subscribes again
    # within seconds and the browser hears the next ones.
    for _ in range(100):
        await asyncio.sleep(0.1)
        if await sync_to_async(subscribers)(topic) == 1:
            break
    else:
        pytest.fail("the hub did not subscribe again after Redis dropped its connection")
    get_redis().publish(channel_for(topic), '{"kind": "job", "job": 8}')
    assert await communicator.receive_json_from(timeout=5) == {"kind": "job", "job": 8}
    await communicator.disconnect()


def test_only_jobs_someone_follows_count_as_watched() -> None:
    from portal.cluster.services import watched_jobs

    assert watched_jobs([1, 2]) == []
    # A browser in some web process follows job 2, once Redis has confirmed it: asked on another
    # connection, it may not have read the subscription yet.
    with HintListener(channel_for("job.2")):
        assert watched_jobs([1, 2]) == [2]


def test_a_burst_of_hints_arrives_whole_and_in_order() -> None:
    """The sender takes what waits in its queue at once and publishes it in pipelines; a
    cycle that starts thousands of jobs queues thousands of hints."""
    from portal.lib.channels import publish

    with HintListener("live:burst") as listener:
        for i in range(1200):
            publish("live:burst", str(i))
        assert [hint for _, hint in listener.hints()] == list(range(1200))

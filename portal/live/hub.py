"""Fan-out of live messages inside one web process.

A change to a job goes to every browser of its tenant. Through the channel layer that was one
message per browser, each popped from Redis and dispatched through its consumer: about a
quarter of a millisecond apiece, so a thousand browsers of one tenant took a third of a second
to hear of one change. Instead each web process subscribes once per topic to Redis pub/sub,
and writes the message, encoded once by the publisher, to each of its browsers itself.

Messages are hints (a browser resyncs over REST when it reconnects), so a message published
while the hub is reconnecting to Redis may be lost, never a fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from django.conf import settings

log = logging.getLogger(__name__)

CHANNEL_PREFIX = "live:"
RETRY_S = 1.0

Deliver = Callable[[str], Awaitable[None]]


def channel_for(topic: str) -> str:
    return CHANNEL_PREFIX + topic


class LiveHub:
    """The topics this process's browsers follow, and one pub/sub connection for all of them."""

    def __init__(self) -> None:
        self._members: dict[str, set[Deliver]] = defaultdict(set)
        # Idle reads must wait for as long as no message comes: no socket timeout.
        self._client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=None)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._changing = asyncio.Lock()
        self._listener: asyncio.Task[None] | None = None

    async def join(self, topic: str, deliver: Deliver) -> None:
        async with self._changing:
            if not self._members[topic]:
                await self._pubsub.subscribe(channel_for(topic))
            self._members[topic].add(deliver)
            if self._listener is None or self._listener.done():
                self._listener = asyncio.create_task(self._listen(), name="live-hub")

    async def leave(self, topic: str, deliver: Deliver) -> None:
        async with self._changing:
            members = self._members.get(topic)
            if not members or deliver not in members:
                return
            members.discard(deliver)
            if not members:
                del self._members[topic]
                with contextlib.suppress(Exception):  # Redis away: a topic nobody follows is harmless
                    await self._pubsub.unsubscribe(channel_for(topic))

    async def _listen(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            except Exception as exc:
                # redis-py reconnects and subscribes to the same topics on the next read.
                log.warning("live hub lost Redis (%s); reconnecting in %.0f s", exc, RETRY_S)
                await asyncio.sleep(RETRY_S)
                continue
            if message is None or message.get("type") != "message":
                continue
            topic = message["channel"].decode()[len(CHANNEL_PREFIX) :]
            text = message["data"].decode()
            for deliver in list(self._members.get(topic, ())):
                try:
                    await deliver(text)
                except Exception:  # the browser is gone; its disconnect leaves the topic
                    continue


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveHub] = weakref.WeakKeyDictionary()


def hub() -> LiveHub:
    """The hub of the running event loop (one per web process; tests run one loop per test)."""
    loop = asyncio.get_running_loop()
    if loop not in _hubs:
        _hubs[loop] = LiveHub()
    return _hubs[loop]

"""Sending to channel-layer groups and publishing on Redis pub/sub from synchronous code without
waiting for Redis.

async_to_sync spins up an event loop per call (milliseconds each), which a scheduling cycle that
starts thousands of jobs cannot afford. Messages go instead to one background event loop per
process that sends them one at a time, in order, fire and forget: they are hints (the design is
level-triggered), so one lost in a crash costs a resync, never a fact.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

# (group, channel-layer event) or (pub/sub channel, text)
Outgoing = asyncio.Queue[tuple[str, dict[str, Any] | str]]


class _BackgroundSender:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: Outgoing | None = None
        self._pid: int | None = None

    def _start(self) -> tuple[asyncio.AbstractEventLoop, Outgoing]:
        with self._lock:
            # A forked Celery worker inherits the object but not the thread: start a new one.
            if self._loop is None or self._queue is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                queue: Outgoing = asyncio.Queue()
                threading.Thread(target=_run, args=(loop, queue), name="channel-sender", daemon=True).start()
                self._loop, self._queue, self._pid = loop, queue, os.getpid()
            return self._loop, self._queue

    def send(self, items: list[tuple[str, dict[str, Any] | str]]) -> None:
        """Queues the items in order, waking the sender once for all of them."""
        loop, queue = self._start()
        loop.call_soon_threadsafe(_put_all, queue, items)


def _put_all(queue: Outgoing, items: list[tuple[str, dict[str, Any] | str]]) -> None:
    for item in items:
        queue.put_nowait(item)


def _run(loop: asyncio.AbstractEventLoop, queue: Outgoing) -> None:
    asyncio.set_event_loop(loop)
    loop.run_until_complete(_drain(queue))


BATCH = 500


async def _drain(queue: Outgoing) -> None:
    """In order: what waits in the queue is taken at once (up to BATCH), channel-layer events
    sent one at a time and the pub/sub messages between them in one pipeline each (a cycle
    that starts ten thousand jobs queues thirty thousand of those)."""
    from django.conf import settings

    layer = get_channel_layer()
    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    while True:
        items = [await queue.get()]
        while len(items) < BATCH and not queue.empty():
            items.append(queue.get_nowait())
        texts: list[tuple[str, str]] = []
        for target, message in items:
            if isinstance(message, str):
                texts.append((target, message))
                continue
            if texts:
                await _twice(functools.partial(_publish, redis, texts), texts[0][0])
                texts = []
            if layer is not None:
                await _twice(functools.partial(layer.group_send, target, message), target)
        if texts:
            await _twice(functools.partial(_publish, redis, texts), texts[0][0])


async def _publish(redis: aioredis.Redis, texts: list[tuple[str, str]]) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for channel, text in texts:
            pipe.publish(channel, text)
        await pipe.execute()


async def _twice(send: Callable[[], Awaitable[Any]], target: str) -> None:
    """Tried twice: the first command on a pooled connection that Redis closed (a restart)
    fails, and the second goes out on a new one."""
    for attempt in (1, 2):
        try:
            await send()
            return
        except Exception as exc:  # a hint lost; the receiver resyncs
            if attempt == 2:
                log.warning("send to %s failed: %s", target, exc)


_sender = _BackgroundSender()


def group_send(group: str, event: dict[str, Any]) -> None:
    _sender.send([(group, event)])


def publish(channels: str | list[str], text: str) -> None:
    """Publishes `text` on one pub/sub channel or several (in one pipeline when sent together)."""
    _sender.send([(channel, text) for channel in ([channels] if isinstance(channels, str) else channels)])

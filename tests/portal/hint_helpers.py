"""Hearing the live hints that a test's steps publish, on Redis pub/sub as a web process's hub does.

Hints are not published at commit: they are handed to this process's sender (portal.lib.channels),
which publishes them from its own thread, on a loaded machine long after the change. Waiting for a
lull, or for a fixed time, then took a late hint of one step for one of the next, and heard those
of the setup, or of earlier tests on a shared topic, after the first step. But the sender
publishes in the order it was handed, and Redis delivers to one subscriber in the order it
published: a marker handed to the sender now comes after every hint of the steps so far and
before any of the next.
"""

from __future__ import annotations

import json
import time
import uuid
from types import TracebackType
from typing import Any

from portal.lib.channels import publish
from portal.lib.redis import get_redis

# Only keeps a broken sender from hanging the suite: no step waits for it to pass.
DEADLINE_S = 30


class HintListener:
    """Subscribed to `channels` (pub/sub channels, portal.live.hub.channel_for) from `with` on:
    `hints()` are those handed to the sender since the last call. The markers go on the first."""

    def __init__(self, *channels: str) -> None:
        self.channels = channels
        self._pubsub = get_redis().pubsub()

    def __enter__(self) -> HintListener:
        """Redis confirms the subscriptions first: a marker published before it heard them would
        never be heard. What the sender still holds (the setup's hints, earlier tests') is dropped."""
        try:
            self._pubsub.subscribe(*self.channels)
            confirmed: set[str] = set()
            while len(confirmed) < len(set(self.channels)):
                message = self._next("the confirmation of the subscriptions")
                if message["type"] == "subscribe":
                    confirmed.add(message["channel"].decode())
            self.hints()
        except BaseException:
            self._pubsub.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._pubsub.close()

    def hints(self) -> list[tuple[str, Any]]:
        """(channel, decoded hint), in the order they were handed to the sender."""
        marker = f"marker {uuid.uuid4()}"
        publish(self.channels[0], marker)
        found = []
        while (message := self._next(marker))["data"] != marker.encode():
            found.append((message["channel"].decode(), json.loads(message["data"])))
        return found

    def _next(self, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            message = self._pubsub.get_message(timeout=1.0)
            if message is not None:
                return dict(message)
        raise AssertionError(f"nothing arrived in {DEADLINE_S} s while waiting for {what}")

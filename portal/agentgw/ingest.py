"""Batched ingestion of what agents stream all the time: telemetry samples and heartbeats.

Writing each agent message on its own costs database round trips per message on the
consumers' one database thread, and a thousand agents reporting every second queue up behind
each other. Instead the consumers append to this process's buffer, and every half second (and
when a connection closes, and before a status report is handled) everything buffered goes out
at once: the latest sample per GPU to Redis and the history rows to PostgreSQL in one statement
each (portal.cluster.services.store_telemetry), heartbeats in two UPDATEs. Writes run on a
thread of their own, in the order they were handed over, so a newer latest sample never lands
before an older one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

from agents.protocol import GpuSample
from portal.lib.db import end_of_work

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5


def _write(samples: list[tuple[int, list[GpuSample]]], heartbeats: set[int]) -> None:
    from portal.cluster import services

    if not samples and not heartbeats:
        return
    close_old_connections()
    try:
        if heartbeats:
            try:
                services.record_heartbeats(heartbeats)
            except Exception:
                log.exception("heartbeats of %d nodes not recorded", len(heartbeats))
        if samples:
            try:
                services.store_telemetry(samples)
            except Exception:
                log.exception("%d telemetry samples not stored", sum(len(s) for _, s in samples))
    finally:
        end_of_work()


class IngestBuffer:
    """What this process received and has not written yet. Used from the event loop only."""

    def __init__(self, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[int, list[GpuSample]]] = []
        self.heartbeats: set[int] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-writer")
        self._pending: set[asyncio.Future[None]] = set()

    def add_telemetry(self, node_id: int, samples: list[GpuSample]) -> None:
        if samples:
            self.samples.append((node_id, samples))
            self._schedule()

    def add_heartbeat(self, node_id: int) -> None:
        self.heartbeats.add(node_id)
        self._schedule()

    async def flush(self) -> None:
        """Hands everything buffered to the writer and waits until it, and every earlier hand-over,
        is written (so a caller that found the buffer empty still waits for writes in flight)."""
        samples, self.samples = self.samples, []
        heartbeats, self.heartbeats = self.heartbeats, set()
        started = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(self._writer, _write, samples, heartbeats)
        if (took := time.monotonic() - started) > 2 * self.interval_s:
            log.warning("writing %d telemetry batches took %.1f s", len(samples), took)

    def close_connections(self) -> None:
        """Closes the writer thread's database connections. They stay open between flushes (as
        CONN_MAX_AGE allows) and no request ends on that thread to close them, so whoever drops
        the database (the test suite's teardown) calls this first."""
        from django.db import connections

        self._writer.submit(connections.close_all).result()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        if self._timer is not None and self._timer_loop is loop:
            return
        self._timer, self._timer_loop = loop.call_later(self.interval_s, self._on_timer), loop

    def _on_timer(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self.flush())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


buffer = IngestBuffer()

"""Simulated node agents that run jobs, many in one asyncio process, for load benchmarks.

Each speaks the real agent protocol (agents.protocol) over /ws/agent/: a hello with eight
simulated A100s, heartbeats, and for every attempt new in its desired set the reports a real
agent sends (starting, running, then exited 0 after `job_seconds`), without starting a process:
at hundreds of jobs a second the job processes, not the portal, would fill the two cores. An
attempt that leaves the desired set while it runs is reported stopped, as the agent does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import websockets
import websockets.exceptions

from agents.protocol import (
    AttemptState,
    AttemptStatus,
    DesiredSet,
    ExitReason,
    GpuInfo,
    GpuTopology,
    Heartbeat,
    Hello,
    HostInfo,
    ReportedAttempt,
    RuntimeInfo,
    Welcome,
    decode_from_portal,
    encode,
    utc_now,
)


class SimAgent:
    def __init__(self, url: str, node: str, token: str, gpus: int = 8, job_seconds: float = 2.0) -> None:
        self.url, self.node, self.token, self.gpus = url, node, token, gpus
        self.job_seconds = job_seconds
        self.ws: Any = None
        self.heartbeat_s = 10.0
        self.generation: dict[str, int] = {}  # attempts started here, by id
        self.live: dict[str, asyncio.Task[None]] = {}  # attempts still running
        self.job_of: dict[str, str] = {}
        self.started_at = time.monotonic()
        self.counts = {"started": 0, "succeeded": 0, "stopped": 0, "connections": 0, "dropped": 0}
        self.stopping = False
        self.drops: dict[str, int] = {}  # why connections ended, while not stopping

    def hello(self) -> Hello:
        return Hello(
            node_name=self.node,
            agent_version="bench",
            host=HostInfo(hostname=self.node, cpu_count=256, memory_total_mib=2_097_152, simulated=True),
            runtime=RuntimeInfo(kind="process"),
            gpus=[
                GpuInfo(
                    index=g,
                    uuid=f"GPU-{self.node}-{g}",
                    model="NVIDIA A100-SXM4-80GB",
                    memory_total_mib=81920,
                    topology=GpuTopology(numa_node=g // 4, pcie_switch=f"sw{g // 2}", nvlink_group="nv"),
                )
                for g in range(self.gpus)
            ],
            # After a reconnect, what still runs here (a real agent lists its attempts the same way).
            attempts=[
                ReportedAttempt(
                    attempt_id=a,
                    job_id=self.job_of[a],
                    state=AttemptState.RUNNING,
                    generation=self.generation[a] - 1,
                    gpu_uuids=[],
                )
                for a in self.live
            ],
        )

    async def run(self) -> None:
        """Connects, and reconnects after a lost connection, as the agent does, until stopped."""
        while not self.stopping:
            try:
                async with websockets.connect(
                    self.url,
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                    open_timeout=60,
                    max_size=None,
                ) as ws:
                    self.ws = ws
                    self.counts["connections"] += 1
                    await ws.send(encode(self.hello()))
                    heartbeat = asyncio.create_task(self._heartbeats())
                    try:
                        async for text in ws:
                            await self._handle(decode_from_portal(text))
                    finally:
                        heartbeat.cancel()
            except websockets.exceptions.ConnectionClosed as exc:
                reason = (
                    f"closed {exc.rcvd.code} {exc.rcvd.reason}"
                    if exc.rcvd
                    else "closed without a close frame"
                )
                self.drops[reason] = self.drops.get(reason, 0) + 1
            except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
                reason = type(exc).__name__
                self.drops[reason] = self.drops.get(reason, 0) + 1
            self.ws = None
            if not self.stopping:
                self.counts["dropped"] += 1
                await asyncio.sleep(1)

    async def stop(self) -> None:
        self.stopping = True
        for task in self.live.values():
            task.cancel()
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()

    async def _handle(self, message: Any) -> None:
        if isinstance(message, Welcome):
            self.heartbeat_s = message.heartbeat_interval_s or self.heartbeat_s
        elif isinstance(message, DesiredSet):
            wanted = {a.attempt_id: a for a in message.attempts}
            for attempt_id, attempt in wanted.items():
                if attempt_id not in self.generation and attempt.run_state == "running":
                    self.generation[attempt_id] = 0
                    self.job_of[attempt_id] = attempt.job_id
                    self.live[attempt_id] = asyncio.create_task(self._run_job(attempt_id, attempt.job_id))
            for attempt_id in [a for a in self.live if a not in wanted]:
                self.live.pop(attempt_id).cancel()
                job_id = self.job_of[attempt_id]
                await self._report(
                    attempt_id, job_id, AttemptState.EXITED, exit_code=137, reason=ExitReason.STOPPED
                )
                self.counts["stopped"] += 1

    async def _run_job(self, attempt_id: str, job_id: str) -> None:
        self.counts["started"] += 1
        await self._report(attempt_id, job_id, AttemptState.STARTING)
        await self._report(attempt_id, job_id, AttemptState.RUNNING)
        await asyncio.sleep(self.job_seconds)
        self.live.pop(attempt_id, None)
        await self._report(attempt_id, job_id, AttemptState.EXITED, exit_code=0, reason=ExitReason.SUCCEEDED)
        self.counts["succeeded"] += 1

    async def _report(
        self,
        attempt_id: str,
        job_id: str,
        state: AttemptState,
        exit_code: int | None = None,
        reason: ExitReason | None = None,
    ) -> None:
        generation = self.generation[attempt_id]
        self.generation[attempt_id] = generation + 1
        status = AttemptStatus(
            attempt_id=attempt_id,
            job_id=job_id,
            state=state,
            generation=generation,
            time=utc_now(),
            exit_code=exit_code,
            reason=reason,
        )
        if self.ws is not None:
            with contextlib.suppress(websockets.exceptions.ConnectionClosed):
                await self.ws.send(encode(status))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            beat = Heartbeat(attempt_ids=list(self.live), uptime_s=time.monotonic() - self.started_at)
            await self.ws.send(encode(beat))

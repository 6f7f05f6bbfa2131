"""Builders shared by the agent tests (plain functions, no fixtures with hidden state)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fake_portal import TOKEN, FakePortal

from agents.agent import Agent
from agents.config import AgentConfig
from agents.devices.simulated import SimulatedBackend, load_description
from agents.protocol import DesiredAttempt, GpuRef, Resources
from agents.runtime.docker import DockerRuntime


def make_attempt(
    attempt_id: str = "att-1", command: list[str] | None = None, **fields: Any
) -> DesiredAttempt:
    values: dict[str, Any] = {
        "attempt_id": attempt_id,
        "job_id": fields.pop("job_id", "job-1"),
        "image": "local/busybox:1",
        "command": command or ["sh", "-c", "echo hello"],
        "resources": Resources(cpus=1, memory_mib=256, pids=128),
        "gpus": [GpuRef(uuid="GPU-sim-0", index=0)],
        "grace_period_s": 5.0,
    }
    values.update(fields)
    return DesiredAttempt(**values)


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout_s: float = 15.0
) -> None:
    """Poll until ``check`` is true; the timeout only bounds a hung test, it is not asserted."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached: {getattr(check, '__name__', check)}")
        await asyncio.sleep(0.02)


async def collect_logs(
    runtime: Any, attempt_id: str, stream: str, from_seq: int = 0
) -> list[tuple[int, str]]:
    return [(line.seq, line.text) async for line in runtime.logs(attempt_id, stream, from_seq)]


def docker_agent(portal: FakePortal, runtime: DockerRuntime, state_dir: Path) -> Agent:
    """An agent of a simulated DGX-A100 that runs its jobs in the private Docker engine."""
    config = AgentConfig(
        portal_url=f"{portal.url.replace('http', 'ws')}/ws/agent/",
        token=TOKEN,
        runtime="docker",
        simulate="dgx-a100",
        state_dir=state_dir,
        monitor_interval_s=0.05,
    )
    return Agent(config, SimulatedBackend(load_description("dgx-a100"), "n"), runtime)

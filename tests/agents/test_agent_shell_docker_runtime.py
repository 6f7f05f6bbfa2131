"""DockerRuntime shells: ``docker exec`` on a terminal in a running container of a real engine.

The engine (tests/docker_engine.py) is started for this module and stopped at teardown; where it
cannot start, these tests are skipped with the reason. The image is the local busybox one, whose
``sh`` is the shell.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from agent_builders import docker_agent, eventually, make_attempt
from fake_portal import FakePortal, wait_for
from shell_reading import closed, read_until, run_in

from agents.protocol import (
    AttemptState,
    RequestAck,
    ResumeRequest,
    ShellExit,
    ShellInput,
    ShellOpen,
    ShellOutput,
    StopRequest,
    SuspendRequest,
)
from agents.runtime import RuntimeFailure
from agents.runtime.docker import DockerRuntime
from agents.runtime.policy import HostPolicy
from agents.runtime.shell import session_members
from tests.docker_engine import IMAGE, engine

__all__ = ["engine"]  # the module's fixture: one engine for all its tests

LOOP = "echo ready; while true; do sleep 0.05; done"


@pytest.fixture
def runtime(engine) -> Iterator[DockerRuntime]:
    yield DockerRuntime(engine, HostPolicy(), request_gpus=False)  # this engine has no NVIDIA runtime
    for container in engine.containers.list(all=True):  # an agent would stop them one by one
        container.remove(force=True)


async def running(runtime: DockerRuntime, attempt_id: str) -> None:
    await runtime.start(
        make_attempt(attempt_id, image=IMAGE, command=["sh", "-c", LOOP], env={"EPOCHS": "3"})
    )

    async def is_running() -> bool:
        return any(
            item.attempt_id == attempt_id and item.state == "running"
            for item in await runtime.list_attempts()
        )

    await eventually(is_running)


def capabilities(lines: list[str]) -> dict[str, str]:
    """``grep CapEff FILE...`` output, by file."""
    return {line.split(":")[0]: line.split()[-1] for line in lines}


@pytest.mark.asyncio
async def test_the_shell_runs_inside_the_container_with_its_confinement(
    engine, runtime: DockerRuntime
) -> None:
    await running(runtime, "dk-shell")
    shell = await runtime.open_shell("dk-shell", ["/bin/sh"], 120, 40)
    try:
        await shell.write(b"echo $((6*7))\r")
        assert b"42\r\n" in await read_until(shell, b"42\r\n")
        inspected = engine.api.inspect_container("gpuportal-dk-shell")
        assert await run_in(shell, "cat /etc/hostname") == [inspected["Config"]["Hostname"]]
        assert await run_in(shell, "cat /proc/1/cmdline; echo") == ["sh\0-c\0" + LOOP + "\0"]
        assert await run_in(shell, 'echo "$EPOCHS $GPUPORTAL_ATTEMPT_ID $TERM"') == [
            "3 dk-shell xterm-256color"
        ]
        # The same user and capabilities as the job's own process, not the engine's full set.
        assert await run_in(shell, "id -u") == ["0"]
        caps = capabilities(await run_in(shell, "grep CapEff /proc/1/status /proc/self/status"))
        assert caps["/proc/self/status"] == caps["/proc/1/status"]
        assert int(caps["/proc/self/status"], 16) != int("1ffffffffff", 16)
        details = engine.api.exec_inspect(shell.exec_id)
        assert (
            details["ProcessConfig"]["privileged"] is False and details["ProcessConfig"].get("user", "") == ""
        )
    finally:
        await closed(shell)


@pytest.mark.asyncio
async def test_the_terminal_has_the_asked_size_and_follows_resizes(runtime: DockerRuntime) -> None:
    await running(runtime, "dk-size")
    shell = await runtime.open_shell("dk-size", ["/bin/sh"], 120, 40)
    try:
        assert await run_in(shell, "busybox stty size") == ["40 120"]
        await shell.resize(100, 30)
        assert await run_in(shell, "busybox stty size") == ["30 100"]
    finally:
        await closed(shell)


@pytest.mark.asyncio
async def test_the_shells_exit_code_is_reported(engine, runtime: DockerRuntime) -> None:
    await running(runtime, "dk-exit")
    shell = await runtime.open_shell("dk-exit", ["/bin/sh"], 80, 24)
    await shell.write(b"exit 3\r")
    await read_until(shell, None)
    assert await closed(shell) == 3
    assert engine.api.exec_inspect(shell.exec_id)["Running"] is False


@pytest.mark.asyncio
async def test_close_hangs_up_the_shell_and_what_it_started(engine, runtime: DockerRuntime) -> None:
    await running(runtime, "dk-close")
    shell = await runtime.open_shell("dk-close", ["/bin/sh"], 80, 24)
    await run_in(shell, "sleep 600 & true")
    await shell.write(b"sleep 601\r")  # the shell waits; it reads nothing from its terminal now
    await read_until(shell, b"sleep 601\r\n")
    session_id = engine.api.exec_inspect(shell.exec_id)["Pid"]
    # the shell and both sleeps, seen from the host
    await eventually(lambda: len(session_members(session_id)) == 3)
    assert await closed(shell) == 129  # SIGHUP
    assert engine.api.exec_inspect(shell.exec_id)["Running"] is False
    assert session_members(session_id) == []


@pytest.mark.asyncio
async def test_a_shell_that_ignores_the_hangup_is_killed(engine, runtime: DockerRuntime) -> None:
    await running(runtime, "dk-stubborn")
    shell = await runtime.open_shell("dk-stubborn", ["sh", "-c", "trap '' HUP; " + LOOP], 80, 24)
    await read_until(shell, b"ready")
    assert await closed(shell) == 137  # SIGKILL
    assert engine.api.exec_inspect(shell.exec_id)["Running"] is False


class CountedInspections:
    """The engine's API, counting the exec inspections (each one a request to the engine)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.inspections = 0

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        self.inspections += 1
        return self.api.exec_inspect(exec_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


@pytest.mark.asyncio
async def test_closing_a_shell_that_exited_asks_the_engine_once(runtime: DockerRuntime) -> None:
    await running(runtime, "dk-asked")
    shell = await runtime.open_shell("dk-asked", ["/bin/sh"], 80, 24)
    await shell.write(b"exit 4\r")
    await read_until(shell, None)
    await eventually(lambda: not shell.api.exec_inspect(shell.exec_id)["Running"])
    shell.api = counted = CountedInspections(shell.api)
    assert await closed(shell) == 4
    assert counted.inspections == 1  # its pid and its exit code in one answer


@pytest.mark.asyncio
async def test_the_engine_is_not_polled_while_a_shell_has_its_hangup_grace(runtime: DockerRuntime) -> None:
    """The host's /proc tells whether the shell's process still runs; the engine is asked for
    the exit code once that process is gone."""
    await running(runtime, "dk-polled")
    shell = await runtime.open_shell("dk-polled", ["sh", "-c", "trap '' HUP; " + LOOP], 80, 24)
    await read_until(shell, b"ready")
    shell.api = counted = CountedInspections(shell.api)
    assert await closed(shell) == 137  # SIGKILL, after the grace
    assert counted.inspections <= 4  # its pid, then its exit code (the engine may lag a little)


@pytest.mark.asyncio
async def test_stopping_the_container_ends_its_shell(runtime: DockerRuntime) -> None:
    await running(runtime, "dk-stop")
    shell = await runtime.open_shell("dk-stop", ["/bin/sh"], 80, 24)
    await run_in(shell, "true")
    await runtime.stop("dk-stop", grace_s=1)
    await read_until(shell, None)
    await closed(shell)
    with pytest.raises(RuntimeFailure, match="exited, not running"):
        await runtime.open_shell("dk-stop", ["/bin/sh"], 80, 24)


@pytest.mark.asyncio
async def test_no_shell_in_a_paused_or_unknown_container(runtime: DockerRuntime) -> None:
    with pytest.raises(RuntimeFailure, match="no container"):
        await runtime.open_shell("dk-none", ["/bin/sh"], 80, 24)
    await running(runtime, "dk-paused")
    await runtime.suspend("dk-paused")
    with pytest.raises(RuntimeFailure, match="suspended, not running"):
        await runtime.open_shell("dk-paused", ["/bin/sh"], 80, 24)
    await runtime.resume("dk-paused")


@pytest.mark.asyncio
async def test_the_agent_relays_a_container_shell_and_ends_it_with_the_attempt(
    runtime: DockerRuntime, tmp_path: Path
) -> None:
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        portal.desired = [make_attempt("dk-agent-shell", image=IMAGE, command=["sh", "-c", LOOP])]
        task = asyncio.create_task(agent.run())
        try:
            await wait_for(
                lambda: (s := portal.last_status("dk-agent-shell")) and s.state == AttemptState.RUNNING
            )
            await portal.send(ShellOpen(session="s1", attempt_id="dk-agent-shell"))
            await portal.send(ShellInput(session="s1", data="echo $((6*7))\r"))
            await wait_for(lambda: "42\r\n" in text(portal, "s1"))
            suspend = SuspendRequest(attempt_id="dk-agent-shell")
            await portal.send(suspend)
            await wait_for(lambda: exits(portal, "s1"))
            # hung up before the container froze
            assert exits(portal, "s1") == [(129, "the job's attempt was suspended")]
            await wait_for(lambda: answered(portal, suspend.id))

            resume = ResumeRequest(attempt_id="dk-agent-shell")
            await portal.send(resume)
            await wait_for(lambda: answered(portal, resume.id))
            await portal.send(ShellOpen(session="s2", attempt_id="dk-agent-shell"))
            await portal.send(ShellInput(session="s2", data="echo $((6*7))\r"))
            await wait_for(lambda: "42\r\n" in text(portal, "s2"))
            await portal.send(StopRequest(attempt_id="dk-agent-shell"))
            await wait_for(lambda: exits(portal, "s2"))
            assert exits(portal, "s2")[0][1] == "the job's attempt is being stopped"
            for session in ("s1", "s2"):
                sequence = [m.seq for m in portal.of_type(ShellOutput) if m.session == session]
                assert sequence == list(range(len(sequence)))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def text(portal: FakePortal, session: str) -> str:
    return "".join(m.data for m in portal.of_type(ShellOutput) if m.session == session)


def exits(portal: FakePortal, session: str) -> list[tuple[int | None, str]]:
    return [(m.exit_code, m.reason) for m in portal.of_type(ShellExit) if m.session == session]


def answered(portal: FakePortal, request_id: UUID) -> bool:
    return any(ack.request_id == request_id for ack in portal.of_type(RequestAck))

"""ProcessRuntime shells: real processes on a real pseudo-terminal, in a running attempt."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from agent_builders import make_attempt
from shell_reading import alive, closed, read_until, run_in

from agents.protocol import GpuRef
from agents.runtime import RuntimeFailure, UnknownAttemptError
from agents.runtime.policy import HostPolicy
from agents.runtime.process import ProcessRuntime
from agents.runtime.shell import HANGUP_GRACE_S, session_members

PY = sys.executable
FOREVER = "import time\nwhile True: time.sleep(0.05)\n"
IGNORES_HANGUP = (
    "import signal, time\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


@pytest_asyncio.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    runtime = ProcessRuntime(tmp_path / "state", HostPolicy())
    yield runtime
    for item in await runtime.list_attempts():
        if item.state.is_live:
            await runtime.signal(item.attempt_id, "SIGKILL")


async def running(runtime: ProcessRuntime, attempt_id: str = "att-1", **fields) -> None:
    await runtime.start(make_attempt(attempt_id, command=[PY, "-c", FOREVER], **fields))


@pytest.mark.asyncio
async def test_the_shell_runs_in_the_attempts_directory_with_its_environment(
    runtime: ProcessRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SECRET", "do-not-leak")
    await running(runtime, env={"EPOCHS": "3"}, gpus=[GpuRef(uuid="GPU-a", index=2)])
    shell = await runtime.open_shell("att-1", ["/bin/sh"], 120, 40)
    try:
        await shell.write(b"echo $((6*7))\r")
        assert b"42\r\n" in await read_until(shell, b"42\r\n")
        variables = "$GPUPORTAL_ATTEMPT_ID|$CUDA_VISIBLE_DEVICES|$EPOCHS|$TERM|${AGENT_SECRET:-unset}"
        lines = await run_in(shell, f'echo "[{variables}]"; pwd; tty')
        assert lines[0] == "[att-1|GPU-a|3|xterm-256color|unset]"
        assert lines[1] == str(runtime.root / "att-1")
        assert lines[2].startswith("/dev/pts/")
    finally:
        await closed(shell)


@pytest.mark.asyncio
async def test_the_terminal_has_the_asked_size_and_follows_resizes(runtime: ProcessRuntime) -> None:
    await running(runtime)
    shell = await runtime.open_shell("att-1", ["/bin/sh"], 120, 40)
    try:
        assert await run_in(shell, "stty size") == ["40 120"]
        await shell.resize(100, 30)
        assert await run_in(shell, "stty size") == ["30 100"]
    finally:
        await closed(shell)


@pytest.mark.asyncio
async def test_control_keys_reach_the_foreground_program(runtime: ProcessRuntime) -> None:
    """The terminal is the shell's controlling terminal: Ctrl-C interrupts what runs in front."""
    await running(runtime)
    shell = await runtime.open_shell("att-1", ["/bin/sh"], 120, 40)
    try:
        await shell.write(b"sleep 600\r")
        await read_until(shell, b"sleep 600\r\n")
        await asyncio.sleep(0.2)  # sleep runs now
        await shell.write(b"\x03")
        assert await run_in(shell, "echo interrupted") == ["interrupted"]
    finally:
        await closed(shell)


@pytest.mark.asyncio
async def test_the_shells_exit_code_is_reported(runtime: ProcessRuntime) -> None:
    await running(runtime)
    shell = await runtime.open_shell("att-1", ["/bin/sh"], 80, 24)
    await shell.write(b"exit 3\r")
    await read_until(shell, None)
    assert await closed(shell) == 3
    assert await closed(shell) == 3  # the same answer every time


@pytest.mark.asyncio
async def test_close_hangs_up_a_shell_that_waits_for_nothing_from_its_terminal(
    runtime: ProcessRuntime,
) -> None:
    await running(runtime)
    shell = await runtime.open_shell("att-1", ["/bin/sh", "-c", "echo ready; sleep 600"], 80, 24)
    await read_until(shell, b"ready")
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await closed(shell) == 129  # SIGHUP
    assert loop.time() - started < HANGUP_GRACE_S
    assert session_members(shell.pid) == []
    assert await shell.read() == b""


@pytest.mark.asyncio
async def test_a_shell_does_not_inherit_what_the_agent_ignores(runtime: ProcessRuntime) -> None:
    """An agent started under nohup ignores SIGHUP, and in the background SIGINT: its shells
    must still hang up, and Ctrl-C still interrupt."""
    ignored = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGHUP, signal.SIGINT)}
    try:
        await running(runtime)
        shell = await runtime.open_shell("att-1", ["/bin/sh", "-c", "echo ready; sleep 600"], 80, 24)
        await read_until(shell, b"ready")
    finally:
        for signum, handler in ignored.items():
            signal.signal(signum, handler)
    ignoring = (await asyncio.to_thread(Path(f"/proc/{shell.pid}/status").read_text)).split("SigIgn:")[1]
    assert int(ignoring.split()[0], 16) & (1 << (signal.SIGHUP - 1) | 1 << (signal.SIGINT - 1)) == 0
    assert await closed(shell) == 129  # SIGHUP, not SIGKILL after the grace


@pytest.mark.asyncio
async def test_a_shell_that_ignores_the_hangup_is_killed_after_the_grace(runtime: ProcessRuntime) -> None:
    await running(runtime)
    shell = await runtime.open_shell("att-1", [PY, "-c", IGNORES_HANGUP], 80, 24)
    await read_until(shell, b"ready")
    assert await closed(shell) == 137  # SIGKILL
    assert session_members(shell.pid) == []


@pytest.mark.asyncio
async def test_what_the_shell_left_running_ends_with_the_session(runtime: ProcessRuntime) -> None:
    await running(runtime)
    shell = await runtime.open_shell("att-1", ["/bin/sh"], 80, 24)
    (line,) = await run_in(shell, "sleep 600 & echo background=$!")
    background = int(line.removeprefix("background="))
    assert alive(background)
    await shell.write(b"exit 0\r")
    await read_until(shell, None)  # ends although the background job still holds the terminal
    assert await closed(shell) == 0
    assert not alive(background)


@pytest.mark.asyncio
async def test_a_missing_command_ends_the_shell_with_127(runtime: ProcessRuntime) -> None:
    await running(runtime)
    shell = await runtime.open_shell("att-1", ["/no/such/shell"], 80, 24)
    assert b"cannot run '/no/such/shell'" in await read_until(shell, None)
    assert await closed(shell) == 127


@pytest.mark.asyncio
async def test_shells_open_only_in_running_attempts(runtime: ProcessRuntime) -> None:
    with pytest.raises(UnknownAttemptError):
        await runtime.open_shell("att-none", ["/bin/sh"], 80, 24)
    await running(runtime)
    await runtime.suspend("att-1")
    with pytest.raises(RuntimeFailure, match="suspended, not running"):
        await runtime.open_shell("att-1", ["/bin/sh"], 80, 24)
    await runtime.resume("att-1")
    await runtime.signal("att-1", "SIGKILL")
    await runtime.wait("att-1")
    with pytest.raises(RuntimeFailure, match="exited, not running"):
        await runtime.open_shell("att-1", ["/bin/sh"], 80, 24)

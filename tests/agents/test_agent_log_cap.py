"""The cap on a job's output on the host (--log-max-bytes), with the process runtime's real processes.

The wrapper copies the command's output from pipes into stdout.log and stderr.log and keeps at
most the cap of each, then one line that says the rest was dropped; the command never blocks on
its output. Docker's side (the engine's log rotation) is tested with the engine, in
test_agent_docker_runtime.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest
from agent_builders import collect_logs, eventually, make_attempt
from fake_portal import TOKEN, FakePortal, wait_for

from agents.__main__ import build_runtime
from agents.agent import Agent
from agents.config import parse_args
from agents.devices.simulated import SimulatedBackend, load_description
from agents.protocol import AttemptState
from agents.runtime import DEFAULT_LOG_MAX_BYTES
from agents.runtime.policy import HostPolicy
from agents.runtime.process import ProcessRuntime
from agents.runtime.wrapper import CappedLog, dropped_note

PY = sys.executable
CAP = 10_050  # lines are 100 bytes: the cut falls inside line 100
NOTE = dropped_note(CAP).decode().rstrip("\n")
# Numbered lines of 100 bytes on stdout, then a few on stderr, then exit 3.
PRINTS = """
import sys
count = int(sys.argv[1])
for n in range(count):
    sys.stdout.write(f"line {n:05d} ".ljust(99, "x") + "\\n")
sys.stderr.write("warning: almost done\\n")
sys.exit(3)
"""


def capped_runtime(tmp_path: Path, log_max_bytes: int = CAP) -> ProcessRuntime:
    return ProcessRuntime(tmp_path / "state", HostPolicy(), log_max_bytes=log_max_bytes)


def line(n: int) -> str:
    return f"line {n:05d} ".ljust(99, "x")


@pytest.mark.asyncio
async def test_output_beyond_the_cap_is_dropped_and_the_log_ends_with_a_note(tmp_path: Path) -> None:
    runtime = capped_runtime(tmp_path)
    await runtime.start(make_attempt(command=[PY, "-c", PRINTS, "200000"]))  # 20 MB: 2000 times the cap
    assert await asyncio.wait_for(runtime.wait("att-1"), 60) == 3
    stdout = (runtime.root / "att-1" / "stdout.log").read_bytes()
    # The first CAP bytes of output (the head, as the portal keeps it), then the note on a line of
    # its own: the cut fell inside line 100, so a newline ends that piece first.
    written = "".join(line(n) + "\n" for n in range(101)).encode()
    assert stdout == written[:CAP] + b"\n" + dropped_note(CAP)
    lines = await collect_logs(runtime, "att-1", "stdout")
    assert lines == [*((n, line(n)) for n in range(100)), (100, line(100)[:50]), (101, NOTE)]
    assert await collect_logs(runtime, "att-1", "stderr") == [(0, "warning: almost done")]  # under the cap
    final = next(item for item in await runtime.list_attempts() if item.attempt_id == "att-1")
    assert (final.state, final.exit_code) == (AttemptState.EXITED, 3)


@pytest.mark.asyncio
async def test_output_under_the_cap_is_kept_as_it_was_written(tmp_path: Path) -> None:
    runtime = capped_runtime(tmp_path)
    await runtime.start(make_attempt(command=[PY, "-c", PRINTS, "100"]))  # 10,000 bytes
    assert await asyncio.wait_for(runtime.wait("att-1"), 60) == 3
    stdout = (runtime.root / "att-1" / "stdout.log").read_bytes()
    assert stdout == "".join(line(n) + "\n" for n in range(100)).encode()
    assert await collect_logs(runtime, "att-1", "stdout") == [(n, line(n)) for n in range(100)]


def test_a_log_takes_exactly_the_cap_without_a_note_and_a_byte_more_with_one(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    with open(path, "ab") as file:
        log = CappedLog(file.fileno(), 10)
        log.write(b"12345")
        log.write(b"67890")  # exactly the cap: nothing was dropped, so there is no note
        assert path.read_bytes() == b"1234567890"
        log.write(b"\n")
        log.write(b"more")  # ignored once full
    assert path.read_bytes() == b"1234567890\n" + dropped_note(10)
    with open(path, "wb") as file:
        log = CappedLog(file.fileno(), 10)
        log.write(b"line\n" * 3)  # cut after a newline: the note needs none before it
    assert path.read_bytes() == b"line\nline\n" + dropped_note(10)


@pytest.mark.asyncio
async def test_a_cap_of_0_keeps_all_output(tmp_path: Path) -> None:
    runtime = capped_runtime(tmp_path, log_max_bytes=0)
    await runtime.start(make_attempt(command=[PY, "-c", PRINTS, "20000"]))  # 2 MB
    assert await asyncio.wait_for(runtime.wait("att-1"), 60) == 3
    assert (runtime.root / "att-1" / "stdout.log").stat().st_size == 20000 * 100
    lines = await collect_logs(runtime, "att-1", "stdout")
    assert len(lines) == 20000 and lines[-1] == (19999, line(19999))


def test_the_cap_defaults_to_the_portals_and_is_set_with_the_option(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    arguments = ["--portal", "http://127.0.0.1", "--token-file", str(token), "--runtime", "process"]
    arguments += ["--state-dir", str(tmp_path / "state")]
    assert parse_args(arguments).log_max_bytes == DEFAULT_LOG_MAX_BYTES == 100 * 1024 * 1024
    config = parse_args([*arguments, "--log-max-bytes", "4096"])
    assert config.log_max_bytes == 4096
    runtime = build_runtime(config)
    assert isinstance(runtime, ProcessRuntime) and runtime.log_max_bytes == 4096
    assert parse_args([*arguments, "--log-max-bytes", "0"]).log_max_bytes == 0
    with pytest.raises(SystemExit):
        parse_args([*arguments, "--log-max-bytes", "-1"])


# A job that prints without end, as fast as it can: it must keep running (never blocked on a full
# pipe) and keep answering signals, while the log stays at the cap.
FLOODS = """
import os, signal, sys
signal.signal(signal.SIGUSR2, lambda s, f: (os.write(2, b"got usr2\\n"), sys.exit(5)))
block = b"flood " * 10_000 + b"\\n"
while True:
    os.write(1, block)
"""


@pytest.mark.asyncio
async def test_a_job_that_floods_its_output_keeps_running_suspends_and_takes_signals(tmp_path: Path) -> None:
    runtime = capped_runtime(tmp_path)
    await runtime.start(make_attempt(command=[PY, "-c", FLOODS]))
    stdout = runtime.root / "att-1" / "stdout.log"
    await eventually(lambda: stdout.read_bytes().endswith(dropped_note(CAP)))
    await runtime.suspend("att-1")
    assert (await runtime.list_attempts())[0].state == AttemptState.SUSPENDED
    await runtime.resume("att-1")
    await runtime.signal("att-1", "SIGUSR2")
    assert await asyncio.wait_for(runtime.wait("att-1"), 30) == 5
    assert stdout.stat().st_size == CAP + 1 + len(dropped_note(CAP))
    assert await collect_logs(runtime, "att-1", "stderr") == [(0, "got usr2")]


@pytest.mark.asyncio
async def test_a_stopped_flood_ends_with_its_exit_code(tmp_path: Path) -> None:
    runtime = capped_runtime(tmp_path)
    await runtime.start(make_attempt(command=[PY, "-c", FLOODS]))
    await eventually(lambda: (runtime.root / "att-1" / "stdout.log").stat().st_size > CAP)
    assert await asyncio.wait_for(runtime.stop("att-1", grace_s=5), 30) == 128 + signal.SIGTERM


def _running(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text[text.rindex(")") + 2] != "Z"


@pytest.mark.asyncio
async def test_a_background_child_that_keeps_writing_does_not_hold_the_attempt_open(tmp_path: Path) -> None:
    """The child holds the command's pipes after the command exited, and writes to them without
    end: the wrapper must not wait for their end (the runtime kills the child only once the
    wrapper has exited), and the attempt ends with the command's exit code."""
    runtime = capped_runtime(tmp_path)
    child_pid = tmp_path / "child.pid"
    script = f"echo main done; (while true; do echo background; done) & echo $! > {child_pid}; exit 4"
    await runtime.start(make_attempt(command=["sh", "-c", script]))
    try:
        assert await asyncio.wait_for(runtime.wait("att-1"), 30) == 4
        pid = int(child_pid.read_text())
        await eventually(lambda: not _running(pid))
        # How much of the child's output is in the log depends on how fast it ran; never past the cap.
        assert (await collect_logs(runtime, "att-1", "stdout"))[0] == (0, "main done")
        assert (runtime.root / "att-1" / "stdout.log").stat().st_size <= CAP + 1 + len(dropped_note(CAP))
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(child_pid.read_text()), signal.SIGKILL)


@pytest.mark.asyncio
async def test_a_restarted_runtime_reads_the_capped_log_of_a_running_attempt(tmp_path: Path) -> None:
    """The wrapper, not the agent, copies the output: a new runtime on the same state directory
    finds the log, cut at the cap, and the attempt's exit code."""
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "print('first', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "sys.stdout.write('y' * 99 + '\\n')\n"
        "sys.stdout.write(('z' * 99 + '\\n') * 1000)\n"
        "sys.exit(6)\n"
    )
    first = capped_runtime(tmp_path, log_max_bytes=1000)
    await first.start(make_attempt(command=[PY, "-c", script]))
    stdout = first.root / "att-1" / "stdout.log"
    await eventually(lambda: stdout.read_bytes() == b"first\n")
    del first  # the agent is gone; the attempt is not

    second = capped_runtime(tmp_path, log_max_bytes=1000)
    go.touch()
    assert await asyncio.wait_for(second.wait("att-1"), 30) == 6
    lines = [text for _, text in await collect_logs(second, "att-1", "stdout")]
    assert lines[:2] == ["first", "y" * 99] and lines[-1] == dropped_note(1000).decode().rstrip("\n")
    assert len(stdout.read_bytes()) == 1000 + 1 + len(dropped_note(1000))


@pytest.mark.asyncio
async def test_the_portal_receives_the_note_as_the_last_line(tmp_path: Path) -> None:
    async with FakePortal() as portal:
        config = parse_args(
            [
                "--portal",
                portal.url,
                "--token-file",
                str(_token_file(tmp_path)),
                "--runtime",
                "process",
                "--simulate",
                "dgx-a100",
                "--state-dir",
                str(tmp_path / "state"),
                "--log-max-bytes",
                str(CAP),
            ]
        )
        agent = Agent(config, SimulatedBackend(load_description("dgx-a100"), "n"), build_runtime(config))
        portal.desired = [make_attempt(command=[PY, "-c", PRINTS, "1000"])]
        task = asyncio.create_task(agent.run())
        try:
            await wait_for(lambda: (s := portal.last_status("att-1")) is not None and s.state.is_terminal)
            assert portal.last_status("att-1").exit_code == 3
            await wait_for(lambda: NOTE in portal.log_lines("att-1").values())
            lines = portal.log_lines("att-1")
            assert lines[0] == line(0) and lines[max(lines)] == NOTE and len(lines) == 102
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    return path

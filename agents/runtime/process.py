"""ProcessRuntime: each attempt is a process group on the host, for hosts without Docker and tests.

Layout of ``<state-dir>/process/<attempt-id>/``:

- ``record.json``: attempt id, job id, GPU uuids, wrapper pid and its start time (guards
  against pid reuse), written before the agent reports the attempt as started
- ``stdout.log``, ``stderr.log``: the command's output. The wrapper copies it from pipes and
  keeps at most ``log_max_bytes`` of each stream, then one line that says the rest was dropped
  (see agents.runtime.wrapper); with ``log_max_bytes`` 0 the command appends to them itself
- ``exit.json.ready``: created by the wrapper once its signal handlers are installed and
  the command runs (before that the attempt is starting)
- ``exit.json``: ``{"exit_code": N}``, written atomically by the wrapper (or by the agent
  after it had to SIGKILL the group)

Everything the runtime knows is in these files, so a new instance on the same state
directory (a restarted agent) reattaches to running attempts, tails their logs and
learns their exit codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from agents.protocol import AttemptState, DesiredAttempt, RuntimeInfo
from agents.runtime import (
    DEFAULT_LOG_MAX_BYTES,
    LineNumbering,
    LogLine,
    LogStream,
    ObservedAttempt,
    RuntimeFailure,
    UnknownAttemptError,
)
from agents.runtime.policy import HostPolicy, PolicyError, prepare
from agents.runtime.shell import (
    READ_BYTES,
    SHELL_TERM,
    ShellEnded,
    ShellProcess,
    close_shell,
    stat_fields,
)
from agents.runtime.wrapper import exit_code_of, write_exit_code

WRAPPER = Path(__file__).with_name("wrapper.py")
SHELL_LAUNCHER = Path(__file__).with_name("shell_launcher.py")
# How long the last output of a shell that exited may take to reach the terminal's master
# side (the kernel hands it over asynchronously), and so how long it is waited for.
SHELL_DRAIN_S = 0.1
POLL_S = 0.05
SIGKILL_EXIT_CODE = 128 + signal.SIGKILL
START_TIMEOUT_S = 30.0
LOG_READ_BYTES = 1 << 16  # read from a log file at a time, with a turn of the event loop after each


class ProcessRuntime:
    kind: Literal["process"] = "process"

    def __init__(
        self,
        state_dir: Path,
        policy: HostPolicy,
        base_env: dict[str, str] | None = None,
        log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
    ) -> None:
        """``log_max_bytes``: how much of each stream of an attempt's output is kept on the host;
        0 keeps all of it."""
        if log_max_bytes < 0:
            raise ValueError(f"log_max_bytes must be 0 (no cap) or more, not {log_max_bytes}")
        self.root = Path(state_dir) / "process"
        self.root.mkdir(parents=True, exist_ok=True)
        self.policy = policy
        # The command does not inherit the agent's environment (it may hold secrets), only PATH.
        default_env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
        self.base_env = base_env if base_env is not None else default_env
        self.log_max_bytes = log_max_bytes
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    async def info(self) -> RuntimeInfo:
        return RuntimeInfo(kind="process")

    async def start(self, attempt: DesiredAttempt) -> None:
        directory = self._dir(attempt.attempt_id)
        if directory.exists():
            raise RuntimeFailure(f"attempt {attempt.attempt_id} was already started on this node")
        if attempt.mounts:
            # Without a mount namespace a "mount" would silently be just a host path; refuse instead.
            raise PolicyError("the process runtime cannot mount volumes; this job needs a Docker node")
        plan = prepare(attempt, self.policy)
        directory.mkdir(parents=True)
        env = {**self.base_env, "HOME": str(directory), **plan.env}
        with open(directory / "stdout.log", "ab") as stdout, open(directory / "stderr.log", "ab") as stderr:
            wrapper = [
                sys.executable,
                "-I",
                str(WRAPPER),
                str(directory / "exit.json"),
                str(self.log_max_bytes),
            ]
            child = subprocess.Popen(
                [*wrapper, "--", *attempt.command],
                env=env,
                cwd=directory,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                close_fds=True,
            )
        self._children[attempt.attempt_id] = child
        record = {
            "attempt_id": attempt.attempt_id,
            "job_id": attempt.job_id,
            "gpu_uuids": [gpu.uuid for gpu in attempt.gpus],
            "pid": child.pid,
            "start_ticks": _start_ticks(child.pid),
        }
        _write_json_atomically(directory / "record.json", record)
        await self._wait_until_ready(attempt.attempt_id, record)

    async def list_attempts(self) -> list[ObservedAttempt]:
        observed = []
        for directory in sorted(self.root.iterdir()):
            record = _read_json(directory / "record.json")
            if record is not None:
                observed.append(self._observe(record))
        return observed

    async def signal(self, attempt_id: str, signal_name: str) -> None:
        record = self._live_record(attempt_id)
        signum = signal.Signals[signal_name]
        exit_path = self._dir(attempt_id) / "exit.json"
        if signum == signal.SIGKILL and not exit_path.exists():
            write_exit_code(str(exit_path), SIGKILL_EXIT_CODE)  # SIGKILL takes the wrapper along
        _kill_group(record["pid"], signum)

    async def suspend(self, attempt_id: str) -> None:
        record = self._live_record(attempt_id)
        _kill_group(record["pid"], signal.SIGSTOP)
        await self._wait_for_state(record, {AttemptState.SUSPENDED})

    async def resume(self, attempt_id: str) -> None:
        record = self._live_record(attempt_id)
        _kill_group(record["pid"], signal.SIGCONT)
        await self._wait_for_state(record, {AttemptState.RUNNING})

    async def stop(self, attempt_id: str, grace_s: float) -> int | None:
        """SIGTERM to the group (continued if suspended), SIGKILL after ``grace_s``."""
        record = self._record(attempt_id)
        with contextlib.suppress(RuntimeFailure):  # on timeout the group is killed already
            await self._wait_until_ready(attempt_id, record)
        if self._observe(record).state.is_live:
            _kill_group(record["pid"], signal.SIGTERM)
            _kill_group(record["pid"], signal.SIGCONT)  # a stopped group cannot act on SIGTERM
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            while self._observe(record).state.is_live and loop.time() < deadline:
                await asyncio.sleep(POLL_S)
        exit_path = self._dir(attempt_id) / "exit.json"
        if self._observe(record).state.is_live and not exit_path.exists():
            # Written before the kill, so that nobody ever sees the group dead without a code.
            write_exit_code(str(exit_path), SIGKILL_EXIT_CODE)
        # Also reaps anything the command left behind in its group.
        _kill_group(record["pid"], signal.SIGKILL)
        await self._wait_until_dead(record)
        return self._observe(record).exit_code

    async def wait(self, attempt_id: str) -> int | None:
        record = self._record(attempt_id)
        while (observed := self._observe(record)).state.is_live:
            await asyncio.sleep(POLL_S)
        return observed.exit_code

    async def logs(self, attempt_id: str, stream: LogStream, from_seq: int = 0) -> AsyncIterator[LogLine]:
        record = self._record(attempt_id)
        path = self._dir(attempt_id) / f"{stream}.log"
        numbering = LineNumbering(stream, from_seq)
        with open(path, "rb") as file:
            while True:
                ended = not self._observe(record).state.is_live  # checked before reading: no lost tail
                data = file.read(LOG_READ_BYTES)
                if data:
                    for line in numbering.feed(data):
                        yield line
                    # A job that writes fast (or a long log read again after a restart) always has
                    # more: without this the loop would never give the event loop a turn, and
                    # heartbeats, telemetry and every other attempt would stop.
                    await asyncio.sleep(0)
                    continue
                if ended:
                    for line in numbering.finish():
                        yield line
                    return
                await asyncio.sleep(POLL_S)

    def attempt_of_pid(self, pid: int) -> str | None:
        """Every process of an attempt is in the wrapper's process group; those started from a
        shell in it are not (the shell leads a session of its own) and are attributed to none."""
        try:
            group = os.getpgid(pid)
        except (ProcessLookupError, PermissionError):
            return None
        for directory in self.root.iterdir():
            record = _read_json(directory / "record.json")
            if record is not None and record["pid"] == group:
                return str(record["attempt_id"])
        return None

    async def open_shell(self, attempt_id: str, command: list[str], cols: int, rows: int) -> ShellProcess:
        """A shell in the attempt's directory with the environment its command got (read from the
        wrapper, so it is exact after an agent restart too), as the agent's user."""
        record = self._record(attempt_id)
        state = self._observe(record).state
        if state != AttemptState.RUNNING:
            raise RuntimeFailure(f"attempt {attempt_id} is {state}, not running")
        env = {**_environment_of(record), "TERM": SHELL_TERM}
        try:
            return await PtyShell.spawn(command, env, self._dir(attempt_id), cols, rows)
        except OSError as error:
            raise RuntimeFailure(f"cannot open a shell in attempt {attempt_id}: {error}") from error

    async def remove(self, attempt_id: str) -> None:
        directory = self._dir(attempt_id)
        record = _read_json(directory / "record.json")
        if record is not None and self._observe(record).state.is_live:
            raise RuntimeFailure(f"attempt {attempt_id} is still running; stop it first")
        if record is not None:
            _kill_leftovers(record["pid"], record["start_ticks"])
        self._children.pop(attempt_id, None)
        shutil.rmtree(directory, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------

    def _dir(self, attempt_id: str) -> Path:
        return self.root / attempt_id

    def _record(self, attempt_id: str) -> dict[str, Any]:
        record = _read_json(self._dir(attempt_id) / "record.json")
        if record is None:
            raise UnknownAttemptError(f"attempt {attempt_id} is not known to the process runtime")
        return record

    def _live_record(self, attempt_id: str) -> dict[str, Any]:
        record = self._record(attempt_id)
        if not self._observe(record).state.is_live:
            raise RuntimeFailure(f"attempt {attempt_id} is no longer running")
        return record

    def _observe(self, record: dict[str, Any]) -> ObservedAttempt:
        attempt_id = record["attempt_id"]
        # Process first, exit file second: the wrapper writes the file before it exits, so a
        # dead wrapper without the file really died without an exit code.
        process_state = _process_state(record["pid"], record["start_ticks"])
        exit_record = _read_json(self._dir(attempt_id) / "exit.json")
        common = {
            "attempt_id": attempt_id,
            "job_id": record["job_id"],
            "gpu_uuids": tuple(record["gpu_uuids"]),
        }
        if process_state in (None, "Z"):
            # Before the reap: while the wrapper is a zombie its pid cannot be reused.
            _kill_leftovers(record["pid"], record["start_ticks"])
            self._reap(attempt_id, record["pid"])
            if exit_record is not None:
                return ObservedAttempt(
                    state=AttemptState.EXITED, exit_code=exit_record["exit_code"], **common
                )
            return ObservedAttempt(state=AttemptState.VANISHED, **common)
        if not (self._dir(attempt_id) / "exit.json.ready").exists():
            return ObservedAttempt(state=AttemptState.STARTING, **common)
        if process_state in ("T", "t"):
            return ObservedAttempt(state=AttemptState.SUSPENDED, **common)
        return ObservedAttempt(state=AttemptState.RUNNING, **common)

    def _reap(self, attempt_id: str, pid: int) -> None:
        child = self._children.get(attempt_id)
        if child is not None:
            child.poll()
            return
        # A wrapper started by an earlier runtime instance of this same process.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

    async def _wait_until_ready(self, attempt_id: str, record: dict[str, Any]) -> None:
        """Return once the wrapper can take signals, or the command already ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while self._observe(record).state == AttemptState.STARTING:
            if loop.time() > deadline:
                _kill_group(record["pid"], signal.SIGKILL)
                raise RuntimeFailure(f"attempt {attempt_id} did not start within {START_TIMEOUT_S:g}s")
            await asyncio.sleep(POLL_S / 5)

    async def _wait_for_state(self, record: dict[str, Any], states: set[AttemptState]) -> None:
        for _ in range(200):
            observed = self._observe(record)
            if observed.state in states or not observed.state.is_live:
                return
            await asyncio.sleep(POLL_S / 5)
        raise RuntimeFailure(f"attempt {record['attempt_id']} did not reach {sorted(states)}")

    async def _wait_until_dead(self, record: dict[str, Any]) -> None:
        while _process_state(record["pid"], record["start_ticks"]) not in (None, "Z"):
            await asyncio.sleep(POLL_S / 5)
        self._reap(record["attempt_id"], record["pid"])


class PtyShell:
    """A shell on a pseudo-terminal of the host, leading its own session (see agents.runtime.shell).

    Output is read from the terminal's master side with the event loop's reader, so a shell
    that writes nothing holds no thread, and one whose output is not collected is held up by
    the terminal instead of filling the agent's memory.
    """

    def __init__(self, process: asyncio.subprocess.Process, master: int) -> None:
        self.process = process
        self.master = master
        self._exited = asyncio.ensure_future(process.wait())
        self._hung_up: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing: asyncio.Future[int | None] | None = None
        self._output_deadline: float | None = None  # set once the shell exited

    @classmethod
    async def spawn(
        cls, command: list[str], env: dict[str, str], cwd: Path, cols: int, rows: int
    ) -> PtyShell:
        master, terminal = os.openpty()
        try:
            set_terminal_size(master, cols, rows)
            os.set_blocking(master, False)
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                str(SHELL_LAUNCHER),
                *command,
                stdin=terminal,
                stdout=terminal,
                stderr=terminal,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(terminal)  # the shell holds it now; the master sees EIO once every holder let go
        return cls(process, master)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def read(self) -> bytes:
        loop = asyncio.get_running_loop()
        while not self._hung_up.done():
            try:
                return os.read(self.master, READ_BYTES)
            except BlockingIOError:
                pass
            except OSError:  # EIO: no process has the terminal open any more
                return b""
            if not self._exited.done():
                await self._wait_readable(None)
                continue
            if self._output_deadline is None:
                self._output_deadline = loop.time() + SHELL_DRAIN_S
            # Processes the shell left behind may still write; they are hung up on at close.
            remaining = self._output_deadline - loop.time()
            if remaining <= 0 or not await self._wait_readable(remaining):
                return b""
        return b""

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._hung_up.done():
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                await self._wait_writable()
            except OSError as error:
                raise RuntimeFailure(f"cannot write to the shell's terminal: {error}") from error

    async def resize(self, cols: int, rows: int) -> None:
        if not self._hung_up.done():
            set_terminal_size(self.master, cols, rows)

    async def close(self) -> int | None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._hang_up())
        return await asyncio.shield(self._closing)

    async def _hang_up(self) -> int | None:
        loop = asyncio.get_running_loop()
        self._hung_up.set_result(None)  # from here on the master is closed (it runs once)
        loop.remove_reader(self.master)
        loop.remove_writer(self.master)
        os.close(self.master)  # the kernel hangs up the terminal: SIGHUP to the shell
        ended = await close_shell(self.pid, self._exit_status)  # no bound: a killed child ends
        return None if ended is None else ended.exit_code

    async def _exit_status(self) -> ShellEnded | None:
        return ShellEnded(exit_code_of(self._exited.result())) if self._exited.done() else None

    async def _wait_readable(self, timeout: float | None) -> bool:
        """Wait until the master has output, the shell exited or is being closed; True when there
        is output."""
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        events = [readable, self._hung_up] + ([] if self._exited.done() else [self._exited])
        loop.add_reader(self.master, _settle, readable)
        try:
            await asyncio.wait(events, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not self._hung_up.done():
                loop.remove_reader(self.master)
            readable.cancel()
        return readable.done() and not readable.cancelled()

    async def _wait_writable(self) -> None:
        loop = asyncio.get_running_loop()
        writable: asyncio.Future[None] = loop.create_future()
        loop.add_writer(self.master, _settle, writable)
        try:
            await asyncio.wait([writable, self._hung_up], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not self._hung_up.done():
                loop.remove_writer(self.master)
            writable.cancel()


def set_terminal_size(fd: int, cols: int, rows: int) -> None:
    """TIOCSWINSZ on a terminal; the kernel tells the terminal's foreground programs (SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _environment_of(record: dict[str, Any]) -> dict[str, str]:
    """The environment the wrapper was started with, which its command inherited."""
    attempt_id = record["attempt_id"]
    try:
        raw = Path(f"/proc/{record['pid']}/environ").read_bytes()
    except OSError as error:
        raise RuntimeFailure(f"cannot read the environment of attempt {attempt_id}: {error}") from error
    if _process_state(record["pid"], record["start_ticks"]) is None:  # the pid was reused meanwhile
        raise RuntimeFailure(f"attempt {attempt_id} is no longer running")
    names_and_values = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {os.fsdecode(name): os.fsdecode(value) for name, _, value in names_and_values}


def kill_recorded_attempts(state_dir: Path) -> int:
    """SIGKILLs what is left of every attempt recorded under an agent's state directory and
    returns how many still ran. For stopping a demo for good: attempts outlive their agent on
    purpose (the next agent on the directory adopts them), so once the agents are gone nothing
    else ends them. The record's start time keeps a reused pid safe, as in _kill_leftovers."""
    running = 0
    for path in sorted((Path(state_dir) / "process").glob("*/record.json")):
        record = _read_json(path)
        if record is None or "pid" not in record:
            continue
        if _process_state(record["pid"], record["start_ticks"]) is not None:
            running += 1
        _kill_leftovers(record["pid"], record["start_ticks"])
    return running


def _kill_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def _kill_leftovers(pid: int, start_ticks: int) -> None:
    """SIGKILL what is left of an ended attempt's process group: a command that exits by itself
    may leave background children running (and holding its GPUs) in the group.

    The group's id is the wrapper's pid. Linux never hands out a number still in use as a
    process group id, so while leftovers live the number is theirs; once the wrapper is gone
    and no leftover remains, a new process may get it and lead a group of its own. So the group
    is killed only when no process has that pid or the one that has it is still the wrapper
    (same start time, a zombie); a process with another start time means the number was reused
    and the group is someone else's."""
    fields = stat_fields(pid)
    if fields is not None and int(fields[19]) != start_ticks:
        return
    _kill_group(pid, signal.SIGKILL)


def _start_ticks(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[19]) if fields else -1


def _process_state(pid: int, start_ticks: int) -> str | None:
    """The /proc state letter of ``pid`` if it is still the process we started, else None."""
    fields = stat_fields(pid)
    if fields is None or int(fields[19]) != start_ticks:
        return None
    return fields[0]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)

"""ProcessRuntime: each attempt is a process group on the host, for hosts without Docker and tests.

Layout of ``<state-dir>/process/<attempt-id>/``:

- ``record.json``: attempt id, job id, GPU uuids, wrapper pid and its start time (guards
  against pid reuse), written before the agent reports the attempt as started
- ``stdout.log``, ``stderr.log``: the command's output, appended by the command itself
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
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from agents.protocol import AttemptState, DesiredAttempt, RuntimeInfo
from agents.runtime import (
    LineNumbering,
    LogLine,
    LogStream,
    ObservedAttempt,
    RuntimeFailure,
    UnknownAttemptError,
)
from agents.runtime.policy import HostPolicy, PolicyError, prepare
from agents.runtime.wrapper import write_exit_code

WRAPPER = Path(__file__).with_name("wrapper.py")
POLL_S = 0.05
SIGKILL_EXIT_CODE = 128 + signal.SIGKILL
START_TIMEOUT_S = 30.0


class ProcessRuntime:
    kind: Literal["process"] = "process"

    def __init__(self, state_dir: Path, policy: HostPolicy, base_env: dict[str, str] | None = None) -> None:
        self.root = Path(state_dir) / "process"
        self.root.mkdir(parents=True, exist_ok=True)
        self.policy = policy
        # The command does not inherit the agent's environment (it may hold secrets), only PATH.
        default_env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
        self.base_env = base_env if base_env is not None else default_env
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
            child = subprocess.Popen(
                [sys.executable, "-I", str(WRAPPER), str(directory / "exit.json"), "--", *attempt.command],
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
                data = file.read(1 << 16)
                if data:
                    for line in numbering.feed(data):
                        yield line
                    continue
                if ended:
                    for line in numbering.finish():
                        yield line
                    return
                await asyncio.sleep(POLL_S)

    def attempt_of_pid(self, pid: int) -> str | None:
        """Every process of an attempt is in the wrapper's process group."""
        try:
            group = os.getpgid(pid)
        except (ProcessLookupError, PermissionError):
            return None
        for directory in self.root.iterdir():
            record = _read_json(directory / "record.json")
            if record is not None and record["pid"] == group:
                return str(record["attempt_id"])
        return None

    async def remove(self, attempt_id: str) -> None:
        directory = self._dir(attempt_id)
        record = _read_json(directory / "record.json")
        if record is not None and self._observe(record).state.is_live:
            raise RuntimeFailure(f"attempt {attempt_id} is still running; stop it first")
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


def _kill_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses; split after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def _start_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else -1


def _process_state(pid: int, start_ticks: int) -> str | None:
    """The /proc state letter of ``pid`` if it is still the process we started, else None."""
    fields = _stat_fields(pid)
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

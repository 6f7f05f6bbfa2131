"""Runtimes: where attempts actually run (Docker containers or plain process groups).

Both implement :class:`Runtime`. Every runtime keeps enough on the host (container labels,
files in the agent's state directory) that a restarted agent finds what it started
before, so no attempt state lives only in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

from agents.protocol import AttemptState, DesiredAttempt, LogChunk, RuntimeInfo
from agents.runtime.shell import ShellProcess

LogStream = Literal["stdout", "stderr"]
LOG_STREAMS: tuple[LogStream, ...] = ("stdout", "stderr")
# Bytes of output one log line holds at most. Longer lines are split at a character boundary
# (each piece counts as a line), and split as their bytes arrive: a job that never writes a
# newline (a progress bar redrawn with carriage returns, binary data) is seen live and never
# makes the agent hold its output in memory.
MAX_LOG_LINE = 16384
MAX_CHUNK_CHARS = 256 * 1024  # well below the protocol's limit for one log message
# Bytes of an attempt's output, per stream, the node keeps on its disk (--log-max-bytes; 0: no
# cap), so that a job that prints in a loop cannot fill the host's disk. It is the portal's
# default LOG_MAX_BYTES_PER_ATTEMPT: the process runtime keeps the first bytes, as the portal
# does, and so can always read again every line the portal could still want.
DEFAULT_LOG_MAX_BYTES = 100 * 1024 * 1024


class RuntimeFailure(Exception):
    """The runtime could not carry out an operation on an attempt."""


class UnknownAttemptError(RuntimeFailure):
    """No process or container for this attempt exists on this node."""


@dataclass(frozen=True)
class ObservedAttempt:
    """What the runtime finds for one attempt it started (live or ended, not yet removed)."""

    attempt_id: str
    job_id: str
    state: AttemptState  # STARTING, RUNNING, SUSPENDED, EXITED or VANISHED
    exit_code: int | None = None
    gpu_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogLine:
    stream: LogStream
    seq: int  # 0-based line number in this stream of this attempt
    text: str  # without the trailing newline


class Runtime(Protocol):
    """The one interface the agent uses to run attempts.

    Contract for implementations:
    - ``start`` starts an attempt once; a second start of the same attempt id raises.
      Policy problems raise ``agents.runtime.policy.PolicyError`` and start nothing.
    - ``stop``, ``signal``, ``suspend``, ``resume`` raise UnknownAttemptError for an attempt
      they do not know; ``stop`` of an attempt that already ended returns its exit code.
    - ``list_attempts`` is the recovery point after an agent restart: it finds attempts by
      label or marker file, not from memory.
    - ``logs`` yields complete lines from ``from_seq`` on and ends after the attempt ended
      and its output was read; it may be started again at any time (after a restart).
    - ``remove`` forgets an ended attempt (container, files); it is idempotent.
    - ``attempt_of_pid`` is cheap and never raises; it may only know attempts that
      ``list_attempts`` has seen.
    - ``open_shell`` starts ``command`` on a new pseudo-terminal of ``cols`` x ``rows`` in a
      running attempt (its container, or its directory and environment), with
      ``TERM=xterm-256color``; it raises RuntimeFailure (UnknownAttemptError for an attempt
      it does not know) when the attempt is not running. See agents.runtime.shell.
    """

    @property
    def kind(self) -> Literal["docker", "process"]: ...

    async def info(self) -> RuntimeInfo: ...

    async def start(self, attempt: DesiredAttempt) -> None: ...

    async def signal(self, attempt_id: str, signal_name: str) -> None: ...

    async def stop(self, attempt_id: str, grace_s: float) -> int | None: ...

    async def suspend(self, attempt_id: str) -> None: ...

    async def resume(self, attempt_id: str) -> None: ...

    async def list_attempts(self) -> list[ObservedAttempt]: ...

    async def wait(self, attempt_id: str) -> int | None: ...

    def logs(self, attempt_id: str, stream: LogStream, from_seq: int = 0) -> AsyncIterator[LogLine]: ...

    async def remove(self, attempt_id: str) -> None: ...

    def attempt_of_pid(self, pid: int) -> str | None:
        """Which attempt a host pid belongs to (labels GPU processes in telemetry); None if none."""
        ...

    async def open_shell(self, attempt_id: str, command: list[str], cols: int, rows: int) -> ShellProcess: ...


def _piece_end(raw: bytes) -> int:
    """Where the first piece of a line longer than MAX_LOG_LINE ends: after its last carriage
    return, so that a progress bar's pieces hold whole redraws; without one at MAX_LOG_LINE,
    moved back before a character cut in two (UTF-8 continuation bytes, at most three)."""
    if (cr := raw.rfind(b"\r", 0, MAX_LOG_LINE)) > 0:  # not a piece of a lone "\r"
        return cr + 1
    end = MAX_LOG_LINE
    while end > MAX_LOG_LINE - 3 and raw[end] & 0xC0 == 0x80:
        end -= 1
    return end


def split_long_line(raw: bytes) -> tuple[list[bytes], bytes]:
    """The pieces cut off the front of `raw` while it is longer than MAX_LOG_LINE, and the rest.
    They depend on the bytes alone, so a line is cut the same whether it came whole or in reads."""
    pieces = []
    while len(raw) > MAX_LOG_LINE:
        end = _piece_end(raw)
        pieces.append(raw[:end])
        raw = raw[end:]
    return pieces, raw


class LineNumbering:
    """Cuts one stream's output, as its bytes arrive, into numbered lines (longer ones split at
    MAX_LOG_LINE) and keeps those from `from_seq` on. Every runtime reads output this way, so a
    line has the same number however the bytes came in, and a reader that resumes from a
    number gets the rest without a gap or a repeat."""

    def __init__(self, stream: LogStream, from_seq: int = 0) -> None:
        self.stream = stream
        self.from_seq = from_seq
        self.seq = 0
        self._partial = b""

    def feed(self, data: bytes) -> list[LogLine]:
        """The lines that `data` completes, and the pieces of a long line it is still writing."""
        *complete, partial = (self._partial + data).split(b"\n")
        pieces = []
        for raw in complete:
            front, rest = split_long_line(raw)
            pieces += [*front, rest]
        front, self._partial = split_long_line(partial)
        return self._number(pieces + front)

    def finish(self) -> list[LogLine]:
        """The last line, when the output ended without a newline."""
        rest, self._partial = self._partial, b""
        return self._number([rest] if rest else [])

    def _number(self, pieces: list[bytes]) -> list[LogLine]:
        lines = []
        for piece in pieces:
            if self.seq >= self.from_seq:
                lines.append(LogLine(self.stream, self.seq, piece.decode("utf-8", "replace")))
            self.seq += 1
        return lines


def chunk_lines(attempt_id: str, lines: list[LogLine]) -> list[LogChunk]:
    """Group consecutive lines of one stream into log chunks of at most MAX_CHUNK_CHARS."""
    chunks: list[LogChunk] = []
    run: list[LogLine] = []
    size = 0
    for line in lines:
        follows = run and line.stream == run[-1].stream and line.seq == run[-1].seq + 1
        if run and (not follows or size + len(line.text) + 1 > MAX_CHUNK_CHARS):
            chunks.append(_chunk(attempt_id, run))
            run, size = [], 0
        run.append(line)
        size += len(line.text) + 1
    if run:
        chunks.append(_chunk(attempt_id, run))
    return chunks


def _chunk(attempt_id: str, run: list[LogLine]) -> LogChunk:
    text = "".join(line.text + "\n" for line in run)
    return LogChunk(attempt_id=attempt_id, stream=run[0].stream, seq=run[0].seq, text=text)

"""Runs one attempt's command, bounds its output and records its exit code in a file.

The process runtime starts ``python -I wrapper.py EXIT_FILE LOG_MAX_BYTES -- COMMAND...`` as
the leader of a new session, with its stdout and stderr on the attempt's ``stdout.log`` and
``stderr.log``. Once its signal handlers are in place and the command runs, it creates
``EXIT_FILE.ready``: until then the runtime reports the attempt as starting and sends it
no signals (a signal that arrived before the handlers would kill the wrapper itself and
lose the exit code). The wrapper is what lets an attempt outlive the agent: when the agent
restarts, the command keeps running under the wrapper, and the exit code still lands in
EXIT_FILE (written atomically) for the new agent to read.

Output: with LOG_MAX_BYTES 0 the command writes to the log files itself. Otherwise it writes
to pipes, and the wrapper copies each one to its file until the file holds LOG_MAX_BYTES of
output; then it writes one line saying the rest was dropped, and from there on reads the pipe
and discards what it reads, so the command never blocks on a full pipe and the host's disk
never fills however much a job prints. The first bytes are kept, not the last: the portal
keeps an attempt's first LOG_MAX_BYTES_PER_ATTEMPT too, so the node still has every line the
portal could want when it reads a log again (after an agent restart or an outage).

Signals the agent sends go to the whole process group, so the command receives them
directly; the wrapper only has to survive them. It installs handlers rather than
ignoring the signals, because an ignored disposition would be inherited by the command.
SIGSTOP and SIGCONT stop and continue the wrapper with its command. Standard library only:
this file runs without the agent package on the path.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

SURVIVED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
READ_BYTES = 1 << 16
# How often the copy loop looks whether the command has exited while its pipes are still open:
# background children it left hold them, and only end when the runtime kills them, which it
# does once the wrapper has exited.
EXIT_POLL_S = 0.1
# After the command exited, output that is still arriving (from those background children) is
# copied for at most this long; what the command itself wrote is in the pipes already.
DRAIN_S = 1.0


def exit_code_of(returncode: int) -> int:
    """Shell and Docker convention: 128+N when signal N ended the process."""
    return returncode if returncode >= 0 else 128 - returncode


def write_exit_code(path: str, exit_code: int) -> None:
    # The agent may write the file too (a stop's kill): a temporary file of each writer's own, so
    # neither replaces the other's half-written one or finds it gone.
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as file:
        json.dump({"exit_code": exit_code}, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def dropped_note(max_bytes: int) -> bytes:
    """The last line of a log file that reached its cap; the user reads it in the portal."""
    return f"gpuportal: output beyond {max_bytes} bytes was dropped by the node (--log-max-bytes)\n".encode()


class CappedLog:
    """One log file that takes at most ``max_bytes`` of the command's output, then the note."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd = fd
        self.max_bytes = max_bytes
        self.written = 0
        self.full = False
        self.at_line_start = True  # so the note starts a line of its own

    def write(self, data: bytes) -> None:
        if self.full:
            return
        kept = data[: self.max_bytes - self.written]
        if kept:
            self.written += write_all(self.fd, kept)
            self.at_line_start = kept.endswith(b"\n")
        if len(kept) < len(data):
            self.full = True
            write_all(self.fd, (b"" if self.at_line_start else b"\n") + dropped_note(self.max_bytes))


def write_all(fd: int, data: bytes) -> int:
    """Write ``data``; how many bytes were written. A failed write (a full disk) drops the rest
    instead of raising: the wrapper must outlive its command, whatever happens to its files."""
    view = memoryview(data)
    written = 0
    while view:
        try:
            count = os.write(fd, view)
        except OSError:
            break
        view = view[count:]
        written += count
    return written


def copy_output(child: subprocess.Popen[bytes], logs: dict[int, CappedLog]) -> None:
    """Copy the command's pipes to their logs until both end, or until the command exited and
    what it left in them was read. Background children may hold a pipe open for as long as
    they live, and the runtime kills them only after the wrapper exited: waiting for the end
    of such a pipe would wait for ever."""
    selector = selectors.DefaultSelector()
    for fd in logs:
        selector.register(fd, selectors.EVENT_READ)
    exited_at: float | None = None
    while selector.get_map():
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and time.monotonic() - exited_at > DRAIN_S:
            break
        events = selector.select(0 if exited_at is not None else EXIT_POLL_S)
        if not events and exited_at is not None:
            break  # the pipes are empty, and the command is gone
        for key, _ in events:
            data = os.read(key.fd, READ_BYTES)
            if data:
                logs[key.fd].write(data)
            else:
                selector.unregister(key.fd)
    selector.close()


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--" or not argv[2].isdigit():
        sys.stderr.write("usage: wrapper.py EXIT_FILE LOG_MAX_BYTES -- COMMAND [ARG...]\n")
        return 2
    exit_file, max_bytes, command = argv[1], int(argv[2]), argv[4:]
    for signum in SURVIVED_SIGNALS:
        signal.signal(signum, lambda _signum, _frame: None)
    output = subprocess.PIPE if max_bytes else None  # None: the command inherits the log files
    try:
        child = subprocess.Popen(command, stdout=output, stderr=output)
    except OSError as error:
        sys.stderr.write(f"gpuportal: cannot run {command[0]!r}: {error}\n")
        write_exit_code(exit_file, 127)
        return 0
    with open(f"{exit_file}.ready", "w"):
        pass
    if child.stdout is not None and child.stderr is not None:
        # The wrapper's own stdout and stderr (fds 1 and 2) are the log files.
        logs = {
            child.stdout.fileno(): CappedLog(1, max_bytes),
            child.stderr.fileno(): CappedLog(2, max_bytes),
        }
        copy_output(child, logs)
        # Nobody reads them from here on: a background child that still writes gets EPIPE (or
        # SIGPIPE) at once, rather than blocking on a full pipe until the runtime kills it.
        child.stdout.close()
        child.stderr.close()
    write_exit_code(exit_file, exit_code_of(child.wait()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

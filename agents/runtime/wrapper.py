"""Runs one attempt's command and records its exit code in a file.

The process runtime starts ``python -I wrapper.py EXIT_FILE -- COMMAND...`` as the leader
of a new session. Once its signal handlers are in place and the command runs, it creates
``EXIT_FILE.ready``: until then the runtime reports the attempt as starting and sends it
no signals (a signal that arrived before the handlers would kill the wrapper itself and
lose the exit code). The wrapper is what lets an attempt outlive the agent: when the agent
restarts, the command keeps running under the wrapper, and the exit code still lands in
EXIT_FILE (written atomically) for the new agent to read.

Signals the agent sends go to the whole process group, so the command receives them
directly; the wrapper only has to survive them. It installs handlers rather than
ignoring the signals, because an ignored disposition would be inherited by the command.
Standard library only: this file runs without the agent package on the path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

SURVIVED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


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


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: wrapper.py EXIT_FILE -- COMMAND [ARG...]\n")
        return 2
    exit_file, command = argv[1], argv[3:]
    for signum in SURVIVED_SIGNALS:
        signal.signal(signum, lambda _signum, _frame: None)
    try:
        child = subprocess.Popen(command)
    except OSError as error:
        sys.stderr.write(f"gpuportal: cannot run {command[0]!r}: {error}\n")
        write_exit_code(exit_file, 127)
        return 0
    with open(f"{exit_file}.ready", "w"):
        pass
    write_exit_code(exit_file, exit_code_of(child.wait()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""Makes the terminal on stdin the controlling terminal of this new session, then becomes COMMAND.

The process runtime starts ``python -I shell_launcher.py COMMAND...`` as the leader of a new
session with a pseudo-terminal on stdin, stdout and stderr. ``subprocess`` cannot make that
terminal the session's controlling terminal, and without one the terminal's control keys
reach nobody (Ctrl-C would not interrupt the foreground program, shells turn job control
off) and hanging up the terminal would not send SIGHUP. A ``preexec_fn`` could, but it is
not safe in a process with threads, as the agent is.

It also gives the shell every signal's default disposition and an empty signal mask: an
ignored signal survives exec, so a shell would otherwise ignore what the agent ignored (SIGHUP
under ``nohup``, SIGINT and SIGQUIT when started in the background, SIGPIPE as every Python
process does) and outlive its hang-up until it is killed.

Standard library only: this file runs without the agent package on the path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import termios


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: shell_launcher.py COMMAND [ARG...]\n")
        return 2
    command = argv[1:]
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP cannot be set
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        sys.stderr.write(f"gpuportal: cannot run {command[0]!r}: {error}\r\n")
    return 127


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

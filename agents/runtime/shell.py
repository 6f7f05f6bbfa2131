"""Interactive shells in attempts: what both runtimes hand the agent, and what they share.

A shell runs on a pseudo-terminal as the leader of its own session (in the attempt's
container for Docker, on the host for the process runtime). Closing it hangs up that
session: every process still in it gets SIGHUP and SIGCONT, and SIGKILL after
:data:`HANGUP_GRACE_S`. Processes that the shell started in the background are part of
the session, so nothing a user started by hand outlives the session it was started in
(unless it left the session itself, with ``setsid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

SHELL_TERM = "xterm-256color"
READ_BYTES = 16384
HANGUP_GRACE_S = 2.0
POLL_S = 0.05


class ShellProcess(Protocol):
    """One shell on a pseudo-terminal, as the agent's shell sessions drive it.

    - ``read`` returns what the terminal wrote next, and ``b""`` once the shell has exited
      and its output has been read, or the shell is being closed. It may be cancelled
      without losing output. One reader at a time.
    - ``write`` sends bytes to the terminal as if typed; ``resize`` sets its size (the
      programs in its foreground get SIGWINCH).
    - ``close`` hangs up the session, kills what is left after :data:`HANGUP_GRACE_S`,
      and returns the shell's exit code (128+N when signal N ended it; None when the
      runtime cannot tell). It may be called any number of times, also after the shell
      exited by itself, and every call returns the same code.
    """

    async def read(self) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def resize(self, cols: int, rows: int) -> None: ...

    async def close(self) -> int | None: ...


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when the
    process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses; split after the last ')'.
    return text[text.rindex(")") + 2 :].split()


@dataclass(frozen=True)
class ShellEnded:
    """How a shell ended, as its runtime reports it."""

    exit_code: int | None  # 128+N when signal N ended it; None when the runtime cannot tell


def session_leader_runs(session_id: int) -> bool:
    """Whether the process that leads the session still runs, as the host's /proc shows it (a
    zombie does not)."""
    try:
        fields = stat_fields(session_id)
    except OSError:  # unreadable while it ended
        return False
    return fields is not None and fields[0] not in ("Z", "X") and int(fields[3]) == session_id


def session_members(session_id: int, belongs: Callable[[int], bool] | None = None) -> list[int]:
    """The living processes of a session (zombies excluded), as the host's /proc shows them.

    ``belongs`` narrows the answer further: a Docker shell's session id is a host pid that
    must also lie in the container's cgroup before the agent signals anything.
    """
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            fields = stat_fields(pid)
        except OSError:  # unreadable while it ended
            continue
        if fields is None:  # ended while we looked
            continue
        alive = fields[0] not in ("Z", "X")
        if int(fields[3]) == session_id and alive and (belongs is None or belongs(pid)):
            members.append(pid)
    return members


def signal_session(
    session_id: int, signals: tuple[signal.Signals, ...], belongs: Callable[[int], bool] | None = None
) -> None:
    for pid in session_members(session_id, belongs):
        for signum in signals:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


async def hang_up_session(
    session_id: int,
    ended: Callable[[], Awaitable[bool]],
    belongs: Callable[[int], bool] | None = None,
) -> None:
    """SIGHUP (and SIGCONT, so that a stopped job can act on it) to every process of the session,
    then SIGKILL to whatever is left after :data:`HANGUP_GRACE_S`; the wait ends early once the
    shell has ended (``ended``) and nothing is left in its session.

    Looking through /proc takes a while on a busy host, so it runs off the event loop.
    """
    await asyncio.to_thread(signal_session, session_id, (signal.SIGHUP, signal.SIGCONT), belongs)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANGUP_GRACE_S
    while loop.time() < deadline:
        if await ended() and not await asyncio.to_thread(session_members, session_id, belongs):
            return  # an empty session stays empty: a last look could only find a reused id
        await asyncio.sleep(POLL_S)
    await asyncio.to_thread(signal_session, session_id, (signal.SIGKILL,), belongs)


async def close_shell(
    session_id: int,
    exit_status: Callable[[], Awaitable[ShellEnded | None]],
    belongs: Callable[[int], bool] | None = None,
    exit_wait_s: float | None = None,
) -> ShellEnded | None:
    """The close path of both runtimes' shells: hang up the session the shell leads
    (:func:`hang_up_session`; a session id of 0, unknown, hangs up nothing), then wait for the
    shell's end and return it; None when it did not come within ``exit_wait_s`` of the hangup
    (None: wait as long as it takes, for a runtime whose killed shells surely end).

    ``exit_status`` returns None while the shell runs. It may cost a request to an engine, so
    during the hangup it is asked only once the session's leader is gone from the host's /proc,
    and the answer that showed the end is returned instead of being asked for again.
    """
    ended: ShellEnded | None = None

    async def shell_ended() -> bool:
        nonlocal ended
        if session_leader_runs(session_id):
            return False
        ended = await exit_status()
        return ended is not None

    if session_id > 0:
        await hang_up_session(session_id, shell_ended, belongs)
    loop = asyncio.get_running_loop()
    deadline = None if exit_wait_s is None else loop.time() + exit_wait_s
    while ended is None and (ended := await exit_status()) is None:
        if deadline is not None and loop.time() > deadline:
            return None
        await asyncio.sleep(POLL_S)
    return ended

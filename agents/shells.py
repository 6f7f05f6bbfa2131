"""Interactive shell sessions in running attempts, relayed over the portal connection.

The portal opens a session with shell_open, types with shell_input, resizes with
shell_resize and ends it with shell_close; the agent answers with shell_output messages
(numbered from 0 per session) and exactly one shell_exit, also when it refuses to open
the session. A session lives only as long as the connection that opened it: the portal
cannot hear a session after a reconnect, so a lost connection closes every session and
their messages are never queued for the next one (unlike logs).

One task per session runs its whole life (open, relay, close) and ends it with its
shell_exit whatever goes wrong, so one session's failure never reaches the agent or the
other sessions.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agents.protocol import (
    AgentToPortal,
    AttemptState,
    ShellClose,
    ShellExit,
    ShellInput,
    ShellMessage,
    ShellOpen,
    ShellOutput,
    ShellResize,
)
from agents.runtime import Runtime, RuntimeFailure
from agents.runtime.shell import ShellProcess

log = logging.getLogger("agents")

MAX_SHELLS_PER_ATTEMPT = 4
MAX_SHELLS_PER_NODE = 16
# Output is collected for this long after its first byte, or up to this many bytes, before it
# is sent: a shell that prints a line at a time gets about one message per keystroke, one
# that prints a lot gets few large messages.
OUTPUT_DELAY_S = 0.02
MAX_OUTPUT_BYTES = 32 * 1024
# Input the shell has not taken yet; more is dropped (a shell that does not read its terminal).
MAX_PENDING_INPUT_BYTES = 1024 * 1024
# How long a suspension waits for the attempt's sessions to close, and shutdown for all of them.
SUSPEND_WAIT_S = 10.0
SHUTDOWN_WAIT_S = 15.0
# A session without input this long is closed by the agent itself. The portal closes idle
# sessions much sooner (SHELL_IDLE_TIMEOUT_S); this catches those it can no longer close, say
# after the web process that held the browser's socket died, so they do not hold the node's
# session slots until their attempt ends.
IDLE_LIMIT_S = 4 * 3600.0

SHELL_EXITED = "the shell exited"
CLOSED = "closed"
PORTAL_LOST = "the portal connection was lost"
AGENT_SHUTTING_DOWN = "the agent is shutting down"
# Why the sessions of an attempt end when it leaves the running state.
ATTEMPT_LEFT_RUNNING = {
    AttemptState.SUSPENDED: "the job's attempt was suspended",
    AttemptState.CHECKPOINTING: "the job's attempt is being checkpointed and stopped",
    AttemptState.STOPPING: "the job's attempt is being stopped",
    AttemptState.EXITED: "the job's attempt ended",
    AttemptState.VANISHED: "the job's attempt ended",
}

Resize = tuple[int, int]  # cols, rows


@dataclass(eq=False)
class ShellSession:
    request: ShellOpen
    # Keystrokes (bytes) and resizes (cols, rows) in the order the portal sent them.
    commands: asyncio.Queue[bytes | Resize] = field(default_factory=asyncio.Queue)
    pending_input_bytes: int = 0
    process: ShellProcess | None = None
    end_reason: str | None = None  # set once something outside the shell ends the session
    silent: bool = False  # the connection that opened it is gone: send nothing more
    next_seq: int = 0
    task: asyncio.Task[None] | None = None  # its whole life; done once its shell_exit was sent
    last_input: float = field(default_factory=time.monotonic)

    @property
    def session_id(self) -> str:
        return self.request.session

    @property
    def attempt_id(self) -> str:
        return self.request.attempt_id


class ShellSessions:
    """The shell sessions open on this node, by the portal's session id.

    ``why_not_open(attempt_id)`` says why an attempt cannot have a shell now (None when it
    can); ``output_room()`` returns once the connection can take more output, so a shell
    that prints without pause is held up by its terminal instead of filling the outbox.
    """

    def __init__(
        self,
        runtime: Runtime,
        send: Callable[[AgentToPortal], None],
        why_not_open: Callable[[str], str | None],
        output_room: Callable[[], Awaitable[None]],
    ) -> None:
        self.runtime = runtime
        self.send = send
        self.why_not_open = why_not_open
        self.output_room = output_room
        self.sessions: dict[str, ShellSession] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ portal messages

    def handle(self, message: ShellMessage) -> None:
        """Synchronous, so that keystrokes and resizes keep the order they arrived in."""
        if isinstance(message, ShellOpen):
            self.open(message)
        elif isinstance(message, ShellInput):
            self.input(message.session, message.data)
        elif isinstance(message, ShellResize):
            self.resize(message.session, message.cols, message.rows)
        elif isinstance(message, ShellClose):
            self.close(message.session, CLOSED)

    def open(self, request: ShellOpen) -> None:
        if request.session in self.sessions:
            log.warning("shell session %s is open already; ignoring another shell_open", request.session)
            return
        problem = self.why_not_open(request.attempt_id) or self._limit_problem(request.attempt_id)
        if problem is not None:
            log.info("shell session %s refused: %s", request.session, problem)
            self.send(ShellExit(session=request.session, reason=problem))
            return
        session = ShellSession(request)
        self.sessions[request.session] = session  # counted at once: limits hold while it opens
        session.task = self._spawn(self._run(session))

    def input(self, session_id: str, data: str) -> None:
        session = self._find(session_id, "input")
        if session is None or session.end_reason is not None:
            return
        raw = data.encode("utf-8", "replace")
        if session.pending_input_bytes + len(raw) > MAX_PENDING_INPUT_BYTES:
            log.warning("shell session %s does not read its input; dropping %d bytes", session_id, len(raw))
            return
        session.pending_input_bytes += len(raw)
        session.last_input = time.monotonic()
        session.commands.put_nowait(raw)

    def resize(self, session_id: str, cols: int, rows: int) -> None:
        session = self._find(session_id, "resize")
        if session is not None and session.end_reason is None:
            session.commands.put_nowait((cols, rows))

    def close(self, session_id: str, reason: str) -> None:
        session = self._find(session_id, "close")
        if session is not None:
            self._end(session, reason)

    # ------------------------------------------------------------------ the agent's events

    def attempt_changed(self, attempt_id: str, state: AttemptState) -> None:
        """A session lives only while its attempt runs."""
        reason = ATTEMPT_LEFT_RUNNING.get(state)
        if reason is not None:
            self._end_all(reason, attempt_id)

    async def suspending(self, attempt_id: str) -> None:
        """End the attempt's sessions and wait until they are gone (bounded): once the attempt
        is frozen, its shells could not act on the hangup any more."""
        tasks = [session.task for session in self.of_attempt(attempt_id) if session.task is not None]
        self._end_all(ATTEMPT_LEFT_RUNNING[AttemptState.SUSPENDED], attempt_id)
        if tasks:
            await asyncio.wait(tasks, timeout=SUSPEND_WAIT_S)

    def portal_lost(self) -> None:
        for session in self.sessions.values():
            session.silent = True
        self._end_all(PORTAL_LOST)

    async def shutdown(self) -> None:
        """Close every session and wait for them (bounded), so no shell outlives the agent."""
        for session in self.sessions.values():
            session.silent = True
        self._end_all(AGENT_SHUTTING_DOWN)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=SHUTDOWN_WAIT_S)
        for task in self._tasks:
            task.cancel()

    def close_idle(self, idle_limit_s: float = IDLE_LIMIT_S) -> None:
        """End the sessions that got no input for `idle_limit_s` (see IDLE_LIMIT_S)."""
        now = time.monotonic()
        for session in list(self.sessions.values()):
            if now - session.last_input >= idle_limit_s:
                self._end(session, f"no input for {idle_limit_s:.0f} s: closed by the agent")

    def of_attempt(self, attempt_id: str) -> list[ShellSession]:
        return [session for session in self.sessions.values() if session.attempt_id == attempt_id]

    # ------------------------------------------------------------------ one session

    async def _run(self, session: ShellSession) -> None:
        """The whole life of one session; whatever happens, it ends with one shell_exit."""
        request = session.request
        reason, exit_code = SHELL_EXITED, None
        try:
            try:
                session.process = await self.runtime.open_shell(
                    request.attempt_id, list(request.command), request.cols, request.rows
                )
            except RuntimeFailure as error:
                reason = f"cannot open a shell: {error}"
            else:
                if session.end_reason is None:  # not ended while it opened
                    await self._relay(session)
        except Exception as error:
            log.exception("shell session %s failed", session.session_id)
            reason = f"the shell session failed: {error}"
        finally:
            try:
                if session.process is not None:
                    exit_code = await self._close_quietly(session.process)
            finally:
                self.sessions.pop(session.session_id, None)
                final = (session.end_reason or reason)[:4096]
                if not session.silent:
                    self.send(ShellExit(session=session.session_id, exit_code=exit_code, reason=final))
                log.info("shell session %s in %s ended: %s", session.session_id, session.attempt_id, final)

    async def _relay(self, session: ShellSession) -> None:
        """Until the shell's output ends: output to the portal, the portal's input to the shell."""
        feeder = asyncio.create_task(self._feed(session))
        try:
            await self._pump_output(session)
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)

    async def _feed(self, session: ShellSession) -> None:
        assert session.process is not None
        try:
            while True:
                command = await session.commands.get()
                if isinstance(command, bytes):
                    session.pending_input_bytes -= len(command)
                    await session.process.write(command)
                else:
                    await session.process.resize(*command)
        except Exception as error:  # the session ends; the agent and other sessions go on
            if not isinstance(error, RuntimeFailure):
                log.exception("shell session %s: input failed", session.session_id)
            self._end(session, f"the shell's terminal failed: {error}")

    async def _pump_output(self, session: ShellSession) -> None:
        """Send what the terminal writes, in order, as few messages as a short delay allows.

        The decoder keeps the bytes of a character that a read cut in two until the rest
        arrives, so no character is ever broken across messages. One read is always in flight and
        is not cancelled between messages, so no output is lost between two of them.
        """
        assert session.process is not None
        process = session.process
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        loop = asyncio.get_running_loop()
        reading = asyncio.ensure_future(process.read())
        try:
            while data := await reading:
                pending = bytearray(data)
                reading = asyncio.ensure_future(process.read())
                deadline = loop.time() + OUTPUT_DELAY_S
                while len(pending) < MAX_OUTPUT_BYTES:
                    done, _ = await asyncio.wait({reading}, timeout=max(0.0, deadline - loop.time()))
                    if not done or not (more := reading.result()):
                        break  # on the end of output, the finished read ends the outer loop
                    pending += more
                    reading = asyncio.ensure_future(process.read())
                for start in range(0, len(pending), MAX_OUTPUT_BYTES):
                    await self._send_output(
                        session, decoder.decode(pending[start : start + MAX_OUTPUT_BYTES])
                    )
        finally:
            reading.cancel()
        await self._send_output(session, decoder.decode(b"", final=True))

    async def _send_output(self, session: ShellSession, text: str) -> None:
        if not text:
            return
        await self.output_room()
        if session.silent:
            return
        self.send(ShellOutput(session=session.session_id, seq=session.next_seq, data=text))
        session.next_seq += 1

    # ------------------------------------------------------------------ helpers

    def _limit_problem(self, attempt_id: str) -> str | None:
        if len(self.of_attempt(attempt_id)) >= MAX_SHELLS_PER_ATTEMPT:
            return f"attempt {attempt_id} already has {MAX_SHELLS_PER_ATTEMPT} shell sessions, the limit"
        if len(self.sessions) >= MAX_SHELLS_PER_NODE:
            return f"this node already has {MAX_SHELLS_PER_NODE} shell sessions, the limit"
        return None

    def _find(self, session_id: str, what: str) -> ShellSession | None:
        session = self.sessions.get(session_id)
        if session is None:
            log.debug("ignoring shell %s for unknown session %s", what, session_id)
        return session

    def _end(self, session: ShellSession, reason: str) -> None:
        """End a session from outside: the first reason stands; the shell is hung up on, and its
        task sends the shell_exit once the shell is gone."""
        if session.end_reason is None:
            session.end_reason = reason
        if session.process is not None:
            self._spawn(self._close_quietly(session.process))
        # else the session is still opening; its task closes the shell once it is open

    def _end_all(self, reason: str, attempt_id: str | None = None) -> None:
        for session in list(self.sessions.values()):
            if attempt_id is None or session.attempt_id == attempt_id:
                self._end(session, reason)

    async def _close_quietly(self, process: ShellProcess) -> int | None:
        try:
            return await process.close()
        except Exception:
            log.exception("closing a shell failed")
            return None

    def _spawn[T](self, awaitable: Awaitable[T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

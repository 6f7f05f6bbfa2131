"""``gpuportal shell``: a terminal in your own running job, as the web UI's shell panel opens.

It speaks the portal's shell websocket (docs/api.md, *Shell*), signed in with the API token:
``Authorization: Bearer`` and no ``Origin``, which is how the portal tells a client that is not a
browser (a browser always sends an Origin, and cannot send Authorization on a websocket).

Once the portal says the shell is open, the local terminal is put in raw mode so that every key,
Ctrl-C and Ctrl-D included, goes to the shell in the job instead of acting here; it is restored
however the session ends, also on an error, an exception or SIGINT, SIGTERM or SIGHUP. Until then
the terminal stays as it was, so Ctrl-C stops a connection that hangs.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from gpuportal.client import USER_AGENT, PortalClient, Unreachable

DEFAULT_SIZE = (80, 24)  # columns, rows: for a terminal that reports no size
MAX_SIZE = 1000  # columns or rows, the most the portal takes
READ_BYTES = 4096  # read from the keyboard at once: well under the 65,536 characters of a frame
OPEN_TIMEOUT_S = 30.0  # for the websocket handshake, as the REST calls' timeout
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # SIGINT: asyncio.run cancels the session itself

CLOSE_NORMAL = 1000
CLOSE_FORBIDDEN = 4403


@dataclass(frozen=True)
class Ending:
    """How a session ended: the CLI's exit status and the line that says why. `error`: the line
    is an error (a refusal, a lost connection), not the shell's own end."""

    status: int
    message: str
    error: bool = True


def close_message(code: int | None, job_id: int) -> str:
    """The close codes of the shell socket in words; the portal's exit reason is used instead
    when it sent one."""
    messages = {
        4401: "the token is invalid, expired or revoked: sign in again with `gpuportal login`",
        4403: "only the job's owner can open a shell (and not as a viewer of its tenant)",
        4404: f"job {job_id} not found",
        4409: f"job {job_id} is not running",
        4429: "too many shells open; close one first",
        4504: "the node's agent did not answer",
        1006: "the connection to the portal was lost",
        None: "the connection to the portal was lost",
        CLOSE_NORMAL: "the portal closed the shell",
    }
    return messages.get(code, f"the portal closed the shell (code {code})")


def ending(job_id: int, code: int | None, exit_frame: dict[str, Any] | None, opened: bool) -> Ending:
    """What the session's close code and last `exit` frame (if any) mean for the user. A shell
    that ended (1000 with an exit frame) gives its exit code, 1 when it has none; anything else
    exits with 1."""
    reason = str(exit_frame.get("reason") or "") if exit_frame is not None else ""
    if code == CLOSE_NORMAL and exit_frame is not None:
        exit_code = exit_frame.get("exit_code")
        status = 1  # no exit code (the agent's connection was lost, the shell idled out), or none valid
        if isinstance(exit_code, int) and not isinstance(exit_code, bool) and 0 <= exit_code <= 255:
            status = exit_code
        return Ending(status, reason or "the shell ended", error=False)
    if code == CLOSE_FORBIDDEN and opened:  # refused at the opening, or closed since: not the same
        return Ending(1, reason or "the shell was closed: the token was revoked, or your access changed")
    return Ending(1, reason or close_message(code, job_id))


def terminal_size(fd: int) -> tuple[int, int]:
    """The terminal's columns and rows, held to what the portal takes; 80 x 24 for one that
    reports no size (a new pseudo-terminal reports 0 x 0)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return DEFAULT_SIZE
    cols, rows = size.columns or DEFAULT_SIZE[0], size.lines or DEFAULT_SIZE[1]
    return min(cols, MAX_SIZE), min(rows, MAX_SIZE)


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """The terminal in raw mode for the block: no echo, no line editing, no signals from keys;
    its settings are put back at the end however the block ends (a terminal hung up cannot be
    restored, and is not an error)."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_shell(client: PortalClient, job_id: int, replica: int) -> Ending:
    """Open a shell in replica `replica` of the job, relay it between this terminal (standard
    input must be one) and the portal until it ends, and say how it ended."""
    return asyncio.run(Session(client, job_id, replica).run())


class Session:
    """One shell: the websocket, the terminal and what the portal said so far."""

    def __init__(self, client: PortalClient, job_id: int, replica: int) -> None:
        self.client, self.job_id, self.replica = client, job_id, replica
        self.stdin = sys.stdin.fileno()
        self.stdout = sys.stdout.buffer
        self.outgoing: asyncio.Queue[str] = asyncio.Queue()
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.opened = False
        self.exit_frame: dict[str, Any] | None = None
        self.close_code: int | None = None  # the portal's; 1006 when the connection was lost
        self.input_ended = False
        self.stopped_by: int | None = None  # the signal that ended the session

    async def run(self) -> Ending:
        """The session, ended by SIGTERM or SIGHUP too: they cancel it like SIGINT does, so that
        the terminal is restored and the portal told to close the shell on the way out, where
        their default action would leave a raw terminal and an open shell behind."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def stop(signum: int) -> None:
            self.stopped_by = signum
            task.cancel()

        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, stop, signum)
        try:
            return await self.connected()
        except asyncio.CancelledError:
            if self.stopped_by is None:
                raise  # SIGINT: asyncio.run turns it into KeyboardInterrupt
            name = signal.Signals(self.stopped_by).name
            return Ending(128 + self.stopped_by, f"the shell was closed: gpuportal got {name}")
        finally:
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)

    async def connected(self) -> Ending:
        """Opens the socket with the terminal's size and relays until it closes. A refused
        handshake (HTTP 4xx) and one that finds no portal or a server error (5xx) are told
        apart: only the second is `Unreachable`, exit 5 as for every command."""
        cols, rows = terminal_size(self.stdin)
        url = self.client.websocket_url(
            f"/ws/jobs/{self.job_id}/shell/", {"replica": self.replica, "cols": cols, "rows": rows}
        )
        headers = {"Authorization": f"Bearer {self.client.token}"}
        try:
            websocket = await connect(
                url,
                additional_headers=headers,
                user_agent_header=USER_AGENT,
                open_timeout=OPEN_TIMEOUT_S,
                compression=None,  # keystrokes and terminal output: small, and latency matters
            )
        except InvalidStatus as error:
            status = error.response.status_code
            if status >= 500:  # a server error, as Unreachable counts it for every command
                raise Unreachable(f"{self.client.url} failed (HTTP {status})") from None
            return Ending(1, f"the portal refused the shell's connection (HTTP {status})")
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as error:
            raise Unreachable(f"cannot reach {self.client.url}: {error}") from None
        async with websocket:
            sender = asyncio.create_task(self.send_all(websocket))
            try:
                await self.relay(websocket)
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
            if self.input_ended and self.exit_frame is None:
                return Ending(1, "the shell was closed: the terminal's input ended")
            return ending(self.job_id, self.close_code, self.exit_frame, self.opened)

    async def relay(self, websocket: ClientConnection) -> None:
        """Frames from the portal until the socket closes; from the `opened` frame on, the
        terminal is raw and the keyboard and window size go the other way."""
        with contextlib.ExitStack() as stack:
            while True:
                try:
                    text = await websocket.recv()
                except ConnectionClosed as closed:
                    self.close_code = closed.rcvd.code if closed.rcvd is not None else 1006
                    return
                try:
                    frame = json.loads(text)
                except ValueError:
                    continue
                kind = frame.get("type") if isinstance(frame, dict) else None
                if kind == "output" and isinstance(frame.get("data"), str):
                    self.stdout.write(frame["data"].encode("utf-8", "replace"))
                    self.stdout.flush()
                elif kind == "opened" and not self.opened:
                    self.opened = True
                    stack.enter_context(raw_terminal(self.stdin))
                    stack.enter_context(self.keyboard())
                    self.resized()  # the size may have changed since the handshake gave it
                elif kind == "exit":
                    self.exit_frame = frame
                elif kind == "error":  # a frame the portal did not understand: a bug here
                    os.write(sys.stderr.fileno(), f"gpuportal: {frame.get('error')}\r\n".encode())

    @contextlib.contextmanager
    def keyboard(self) -> Iterator[None]:
        """Keystrokes become input frames and window changes resize frames, while the block
        lasts."""
        loop = asyncio.get_running_loop()
        loop.add_reader(self.stdin, self.typed)
        loop.add_signal_handler(signal.SIGWINCH, self.resized)
        try:
            yield
        finally:
            loop.remove_reader(self.stdin)
            loop.remove_signal_handler(signal.SIGWINCH)

    def typed(self) -> None:
        """The keyboard has bytes: sent as text, UTF-8 decoded across reads. Its end (the
        terminal gone) closes the session, as the shell would see its input end."""
        try:
            data = os.read(self.stdin, READ_BYTES)
        except OSError:  # the terminal went away
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.stdin)
            self.input_ended = True
            self.outgoing.put_nowait("")  # the end of input: the session closes
            return
        text = self.decoder.decode(data)  # a character split across reads waits for its rest
        if text:
            self.outgoing.put_nowait(json.dumps({"type": "input", "data": text}))

    def resized(self) -> None:
        """SIGWINCH: the shell in the job gets the window's new size, as a local one would."""
        cols, rows = terminal_size(self.stdin)
        self.outgoing.put_nowait(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def send_all(self, websocket: ClientConnection) -> None:
        """Sends what the keyboard and the window gave, in order; an empty frame closes."""
        while True:
            frame = await self.outgoing.get()
            try:
                if not frame:
                    await websocket.close()
                    return
                await websocket.send(frame)
            except ConnectionClosed:
                return

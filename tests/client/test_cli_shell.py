"""`gpuportal shell`: the CLI opens a shell in a running job with its API token.

Offline: what it refuses before it sends anything, and how the socket's ends read. Against a real
server (uvicorn, the `shell_server` fixture) with fake agents on real websockets, the command runs
on a pseudo-terminal of its own, as a person would run it: what is typed reaches the agent, what
the agent answers reaches the terminal, the shell's exit code is the command's, and the terminal
is put back as it was however the session ends.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from agents.protocol import ShellExit, ShellOutput, encode
from gpuportal import cli
from gpuportal.client import PortalClient, PortalError
from gpuportal.shell import Ending, ending
from portal.accounts.models import AuditEntry
from portal.accounts.services import create_api_token, revoke_api_token
from tests.client.conftest import REPO, cli_env
from tests.conftest import free_port
from tests.portal.test_shell import real_running_job, real_shell_message, submitted

# ---------------------------------------------------------------------------
# Offline
# ---------------------------------------------------------------------------


def run_offline(
    tmp_path: Path, *args: str, stdin: Any = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuportal", *args],
        env=cli_env(tmp_path, "http://127.0.0.1:1", "gpp_x"),
        cwd=tmp_path,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_needs_a_terminal(tmp_path: Path) -> None:
    for stdin in (subprocess.DEVNULL, subprocess.PIPE):
        result = run_offline(tmp_path, "shell", "12", stdin=stdin)
        assert result.returncode == cli.USAGE
        assert result.stderr.splitlines() == [
            "error: gpuportal shell needs a terminal: standard input is not one"
        ]


def test_a_job_and_a_replica_are_numbers(tmp_path: Path) -> None:
    for args, words in (
        ((), "the following arguments are required: job_id"),
        (("twelve",), "a job id is a number, not 'twelve'"),
        (("12", "--replica", "-1"), "a replica is a number from 0, not '-1'"),
        (("12", "--replica", "first"), "a replica is a number from 0, not 'first'"),
    ):
        result = run_offline(tmp_path, "shell", *args)
        assert result.returncode == cli.USAGE and words in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_the_socket_address_follows_the_portals() -> None:
    query = {"replica": 1, "cols": 80, "rows": 24}
    for url, expected in (
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/jobs/7/shell/?replica=1&cols=80&rows=24"),
        ("https://gpus.example.org/", "wss://gpus.example.org/ws/jobs/7/shell/?replica=1&cols=80&rows=24"),
        (
            "HTTPS://gpus.example.org/portal",
            "wss://gpus.example.org/portal/ws/jobs/7/shell/?replica=1&cols=80&rows=24",
        ),
    ):
        with PortalClient(url, "gpp_x") as client:
            assert client.websocket_url("/ws/jobs/7/shell/", query) == expected, url
    with PortalClient("ftp://gpus.example.org", "gpp_x") as client, pytest.raises(PortalError):
        client.websocket_url("/ws/jobs/7/shell/")


def test_each_end_of_the_socket_reads_as_one_line() -> None:
    exited = {"type": "exit", "exit_code": 3, "reason": "the shell exited"}
    assert ending(12, 1000, exited, True) == Ending(3, "the shell exited", error=False)
    idle = {"type": "exit", "exit_code": None, "reason": "closed after 30 minutes without input"}
    assert ending(12, 1000, idle, True) == Ending(1, "closed after 30 minutes without input", error=False)
    # The portal's reason when it gave one, else the code's meaning; always 1.
    pending = {"type": "exit", "exit_code": None, "reason": "job 12 is pending, not running"}
    assert ending(12, 4409, pending, False) == Ending(1, "job 12 is pending, not running")
    assert ending(12, 4409, None, False) == Ending(1, "job 12 is not running")
    assert ending(12, 4404, None, False) == Ending(1, "job 12 not found")
    assert ending(12, 4429, None, False) == Ending(1, "too many shells open; close one first")
    assert ending(12, 4504, None, True) == Ending(1, "the node's agent did not answer")
    assert ending(12, 4401, None, False).message.startswith("the token is invalid, expired or revoked")
    assert ending(12, 4403, None, False).message.startswith("only the job's owner can open a shell")
    assert ending(12, 4403, None, True).message.startswith("the shell was closed: the token was revoked")
    expired = {"type": "exit", "exit_code": None, "reason": "the token cli expired; sign in again"}
    assert ending(12, 4403, expired, True) == Ending(1, "the token cli expired; sign in again")
    assert ending(12, 1006, None, True) == Ending(1, "the connection to the portal was lost")
    assert ending(12, 1011, None, True) == Ending(1, "the portal closed the shell (code 1011)")
    # An exit code the CLI cannot exit with gives 1.
    assert ending(12, 1000, {"type": "exit", "exit_code": 300, "reason": "x"}, True).status == 1
    assert ending(12, 1000, {"type": "exit", "exit_code": True, "reason": "x"}, True).status == 1


# ---------------------------------------------------------------------------
# On a terminal
# ---------------------------------------------------------------------------


class TerminalCli:
    """`gpuportal ARGS` with a pseudo-terminal for its standard input and output (standard error
    apart): this test holds the terminal's other end, types into it and reads what it shows."""

    def __init__(
        self, proc: asyncio.subprocess.Process, master: int, slave: int, settings: list[Any]
    ) -> None:
        self.proc, self.master, self.slave = proc, master, slave
        self.settings = settings  # the terminal's before the command started
        self.screen = b""

    @classmethod
    async def start(
        cls, home: Path, url: str, token: str | None, *args: str, cols: int = 100, rows: int = 30
    ) -> TerminalCli:
        master, slave = os.openpty()
        set_size(slave, cols, rows)
        settings = termios.tcgetattr(slave)
        # The command starts as from a terminal, with SIGINT's default action: a suite started in
        # the background (`make test &`) runs with SIGINT ignored, which every child would keep
        # (Python leaves an inherited SIG_IGN alone), and Ctrl-C would not reach the command.
        # A handled signal is reset to its default in the child.
        inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuportal",
                *args,
                stdin=slave,
                stdout=slave,
                stderr=subprocess.PIPE,
                env=cli_env(home, url, token),
                cwd=REPO,
            )
        finally:
            signal.signal(signal.SIGINT, inherited)
        return cls(proc, master, slave, settings)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    async def shows(self, wanted: bytes, timeout: float = 10) -> None:
        """Waits until the terminal has shown `wanted` since it started."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while wanted not in self.screen:
            left = deadline - loop.time()
            assert left > 0, f"the terminal showed {self.screen!r}, not {wanted!r}"
            readable, _, _ = await asyncio.to_thread(select.select, [self.master], [], [], min(left, 0.2))
            if readable:
                self.screen += os.read(self.master, 65536)

    def is_raw(self) -> bool:
        lflag = termios.tcgetattr(self.slave)[3]
        return not lflag & (termios.ECHO | termios.ICANON | termios.ISIG)

    async def until_raw(self) -> None:
        for _ in range(100):
            if self.is_raw():
                return
            await asyncio.sleep(0.05)
        pytest.fail("the command did not put the terminal in raw mode")

    async def finish(self, timeout: float = 20) -> tuple[int, str]:
        """The exit status and standard error, once the command ended; the terminal closed."""
        try:
            _, stderr = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise
        assert self.proc.returncode is not None
        return self.proc.returncode, stderr.decode()

    def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        for fd in (self.master, self.slave):
            os.close(fd)


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@pytest.mark.asyncio
async def test_not_signed_in_or_no_portal_on_a_terminal(tmp_path: Path) -> None:
    for url, token, code, words in (
        ("http://127.0.0.1:1", None, cli.AUTH, "not signed in"),
        (f"http://127.0.0.1:{free_port()}", "gpp_x", cli.UNREACHABLE, "cannot reach"),
    ):
        terminal = await TerminalCli.start(tmp_path, url, token, "shell", "12")
        try:
            status, stderr = await terminal.finish()
            assert status == code and words in stderr and "Traceback" not in stderr, stderr
            assert termios.tcgetattr(terminal.slave) == terminal.settings
        finally:
            terminal.close()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_shell_on_a_terminal_through_a_real_server(
    users: Any, paused_loop: Any, shell_server: str, tmp_path: Path
) -> None:
    running = await real_running_job(shell_server, users["alice"])
    token, raw = await sync_to_async(create_api_token)(users["alice"], "laptop")
    agent = running.agent(1)
    terminal = await TerminalCli.start(
        tmp_path, f"http://{shell_server}", raw, "shell", str(running.job.pk), "--replica", "1"
    )
    try:
        opened = await real_shell_message(agent)
        assert opened.type == "shell_open" and opened.attempt_id == running.attempt_id(1)
        assert (opened.cols, opened.rows) == (100, 30)  # the terminal's size
        resize = await real_shell_message(agent)  # and again once open: it may have changed since
        assert (resize.type, resize.cols, resize.rows) == ("shell_resize", 100, 30)
        await terminal.until_raw()
        session = opened.session

        await agent.send(encode(ShellOutput(session=session, seq=0, data="$ ")))
        await terminal.shows(b"$ ")
        terminal.type(b"echo hi\r")
        typed = await real_shell_message(agent)
        assert (typed.type, typed.data) == ("shell_input", "echo hi\r")
        # Keys that would act here in a cooked terminal go to the job's shell: Ctrl-C, Ctrl-D.
        terminal.type(b"\x03")
        assert (await real_shell_message(agent)).data == "\x03"
        # UTF-8 split across reads arrives whole.
        terminal.type("é".encode()[:1])
        await asyncio.sleep(0.3)
        terminal.type("é".encode()[1:] + b"\x04")
        assert (await real_shell_message(agent)).data == "é\x04"
        await agent.send(encode(ShellOutput(session=session, seq=1, data="echo hi\r\nhi\r\n$ ")))
        await terminal.shows(b"echo hi\r\nhi\r\n$ ")

        # The window changes size.
        set_size(terminal.slave, 132, 43)
        terminal.proc.send_signal(signal.SIGWINCH)
        resized = await real_shell_message(agent)
        assert (resized.type, resized.cols, resized.rows) == ("shell_resize", 132, 43)

        await agent.send(encode(ShellExit(session=session, exit_code=3, reason="the shell exited")))
        status, stderr = await terminal.finish()
        assert status == 3, stderr
        assert stderr.strip() == "the shell exited"
        assert termios.tcgetattr(terminal.slave) == terminal.settings  # as it was
    finally:
        terminal.close()
    (entry,) = [
        e async for e in AuditEntry.objects.filter(action="job.shell.open", object_id=str(running.job.pk))
    ]
    assert entry.detail.endswith(f"token {token}")
    await running.close()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_what_the_cli_says_when_the_portal_refuses_or_ends_the_shell(
    users: Any, paused_loop: Any, shell_server: str, tmp_path: Path
) -> None:
    running = await real_running_job(shell_server, users["alice"])
    url = f"http://{shell_server}"
    pending = await sync_to_async(submitted)(users["alice"])
    revoked, revoked_raw = await sync_to_async(create_api_token)(users["alice"], "old")
    await sync_to_async(revoke_api_token)(revoked, users["alice"])
    alices, alice = await sync_to_async(create_api_token)(users["alice"], "cli")
    _, bob = await sync_to_async(create_api_token)(users["bob"], "cli")
    _, carol = await sync_to_async(create_api_token)(users["carol"], "cli")
    for token, job_id, words in (
        (carol, running.job.pk, f"error: job {running.job.pk} not found"),  # another tenant's
        (alice, 10**9, f"error: job {10**9} not found"),
        (bob, running.job.pk, "error: only the job's owner can open a shell"),
        (revoked_raw, running.job.pk, "error: the token is invalid, expired or revoked"),
        (alice, pending, f"error: job {pending} is pending, not running"),
    ):
        terminal = await TerminalCli.start(tmp_path, url, token, "shell", str(job_id))
        try:
            status, stderr = await terminal.finish()
            assert status == 1 and stderr.startswith(words), (words, stderr)
            assert len(stderr.splitlines()) == 1, stderr
            assert termios.tcgetattr(terminal.slave) == terminal.settings
        finally:
            terminal.close()

    # Open, then its token is revoked: the portal closes it, and the CLI says why.
    terminal = await TerminalCli.start(tmp_path, url, alice, "shell", str(running.job.pk))
    try:
        opened = await real_shell_message(running.agent(0))
        assert (await real_shell_message(running.agent(0))).type == "shell_resize"
        await terminal.until_raw()
        await sync_to_async(revoke_api_token)(alices, users["alice"])
        status, stderr = await terminal.finish()
        assert status == 1 and stderr.startswith("error: the shell was closed: the token was revoked"), stderr
        assert termios.tcgetattr(terminal.slave) == terminal.settings
        closed = await real_shell_message(running.agent(0))
        assert (closed.type, closed.session) == ("shell_close", opened.session)
    finally:
        terminal.close()
    await running.close()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_signal_closes_the_shell_and_restores_the_terminal(
    users: Any, paused_loop: Any, shell_server: str, tmp_path: Path
) -> None:
    running = await real_running_job(shell_server, users["alice"])
    _, raw = await sync_to_async(create_api_token)(users["alice"], "cli")
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        terminal = await TerminalCli.start(
            tmp_path, f"http://{shell_server}", raw, "shell", str(running.job.pk)
        )
        try:
            opened = await real_shell_message(running.agent(0))
            assert (await real_shell_message(running.agent(0))).type == "shell_resize"
            await terminal.until_raw()
            terminal.proc.send_signal(signum)
            status, stderr = await terminal.finish()
            if signum == signal.SIGINT:  # as for every command: Ctrl-C, were it not sent to the job
                assert (status, stderr.strip()) == (cli.INTERRUPTED, "interrupted")
            else:
                assert status == 128 + signum, stderr
                assert f"gpuportal got {signal.Signals(signum).name}" in stderr
            assert termios.tcgetattr(terminal.slave) == terminal.settings
            closed = await real_shell_message(running.agent(0))  # the portal ends it on the agent
            assert (closed.type, closed.session) == ("shell_close", opened.session)
        finally:
            terminal.close()
    await running.close()

"""What the fault tests break: a portal of their own (web, worker, beat) with a Redis of its own,
the test PostgreSQL, and a TCP proxy that can cut an agent off from the portal.

The session's live stack serves the other live tests and is never killed here. This stack shares
only the test database with it (the session's stack stays paused while these tests run, see
background_only_in_live_tests), so killing its processes or restarting its Redis hurts nobody else.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

from portal.devstack import Services, pg_os_user, portal_commands, postgres_bin, start_redis
from tests.conftest import REPO, free_port, wait_for

PROCESSES = ("web", "worker", "beat")


class PortalStack:
    """uvicorn, a Celery worker and beat, each in its own process group so a test can SIGKILL one
    of them (with every child) and start it again on the same port and Redis."""

    worker_prefix = "faults"  # the worker is PREFIX-PORT@host

    def __init__(self, env: dict[str, str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.port = free_port()
        self.redis = Services(run_dir=run_dir)
        self.redis_port = free_port()
        start_redis(self.redis, self.redis_port)
        self.env = {**env, "REDIS_URL": self.redis.env["REDIS_URL"]}
        self.http = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.starts = 0
        self._celery: Any = None

    def command(self, name: str) -> list[str]:
        commands = portal_commands(
            "127.0.0.1", self.port, f"{self.worker_prefix}-{self.port}", self.run_dir / "beat-schedule"
        )
        return commands[name]

    @property
    def worker(self) -> str:
        """The worker's Celery node name, as it expands `-n PREFIX-PORT@%h`. Asked by name, the
        worker alone answers and the question ends with its answer, instead of waiting out the
        timeout for answers from any others."""
        return f"{self.worker_prefix}-{self.port}@{socket.gethostname()}"

    def inspect(self, timeout: float) -> Any:
        return self.celery().control.inspect([self.worker], timeout=timeout, limit=1)

    def start(self, *names: str) -> None:
        """Starts the named processes (all by default) and waits until each one serves."""
        for name in names or PROCESSES:
            assert name not in self.procs, f"{name} is already running"
            self.starts += 1
            self.logs[name] = self.run_dir / f"{name}-{self.starts}.log"
            with open(self.logs[name], "wb") as out:
                self.procs[name] = subprocess.Popen(
                    self.command(name),
                    env=self.env,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        if "web" in (names or PROCESSES):
            wait_for(lambda: self.port_open(self.port), 30, "the web server")
        if "worker" in (names or PROCESSES):
            wait_for(lambda: self.inspect(timeout=0.5).ping(), 60, "the Celery worker")

    def kill(self, *names: str) -> None:
        """SIGKILL, without warning, of the named processes and their children (all by default)."""
        for name in names or PROCESSES:
            proc = self.procs.pop(name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()
        self.redis.stop()

    def restart_redis(self) -> None:
        """Redis stops without saving (everything in it is lost) and comes back on the same port."""
        self.redis.stop()
        wait_for(lambda: not self.port_open(self.redis_port), 10, "Redis to stop")
        start_redis(self.redis, self.redis_port)

    def redis_client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.env["REDIS_URL"])

    def celery(self) -> Any:
        """A Celery client on this stack's broker, for pinging and inspecting its worker."""
        if self._celery is None:
            from celery import Celery

            self._celery = Celery("faults-probe", broker=self.env["REDIS_URL"])
        return self._celery

    def set_paused(self, paused: bool) -> None:
        """The same switch as scheduler.tasks.set_loop_paused, on this stack's Redis."""
        from scheduler.tasks import PAUSE_KEY

        if paused:
            self.redis_client().set(PAUSE_KEY, 1)
        else:
            self.redis_client().delete(PAUSE_KEY)

    def idle(self) -> bool:
        """Whether the worker answered and runs no task; a worker that did not answer (None) may
        be busy."""
        answers = self.inspect(timeout=1).active()
        return answers is not None and answers.get(self.worker) == []

    def wait_idle(self) -> None:
        if "worker" not in self.procs:
            return
        wait_for(self.idle, 30, "the worker to go idle")

    def log(self, name: str, offset: int = 0) -> str:
        """What the named process has written since it was last started (from `offset` on)."""
        with open(self.logs[name], "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_size(self, name: str) -> int:
        return self.logs[name].stat().st_size

    def task_succeeded(self, task: str, offset: int = 0) -> bool:
        """Whether the worker, since it was last started (or its log reached `offset`), finished
        `task` (its dotted name)."""
        pattern = rf"Task {re.escape(task)}\[[^\]]+\] succeeded in"
        return re.search(pattern, self.log("worker", offset)) is not None

    @staticmethod
    def port_open(port: int) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
        return False


def restart_postgres() -> None:
    """Restarts the test PostgreSQL (fast shutdown: every session is cut) with its own options.

    The caller's connection is closed first and reopens on its next query."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        data = cursor.fetchone()[0]
    connection.close()
    cmd = [str(postgres_bin() / "pg_ctl"), "-D", data, "restart", "-m", "fast", "-w", "-t", "60"]
    user = pg_os_user()
    subprocess.run(
        ["runuser", "-u", user, "--", *cmd] if user else cmd,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class PartitionProxy:
    """A TCP proxy on loopback between an agent and the portal.

    partition() resets every connection through it and refuses new ones, as a firewall that
    rejects would; heal() lets connections through again. Bytes are forwarded unchanged.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.http = f"http://127.0.0.1:{self.port}"
        self.cut = False
        self.accepted = 0
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self.accepted += 1
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 0.5)
                if self.cut or self._closed:
                    break
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):  # a socket partition() closed under us
            pass
        finally:
            _reset(a)
            _reset(b)
            with self._lock, contextlib.suppress(ValueError):
                self._pairs.remove((a, b))

    def partition(self) -> None:
        self.cut = True
        with self._lock:
            pairs = list(self._pairs)
        for a, b in pairs:
            _reset(a)
            _reset(b)

    def heal(self) -> None:
        self.cut = False

    def close(self) -> None:
        self._closed = True
        self.partition()
        self.listener.close()


def _reset(sock: socket.socket) -> None:
    """Closes with RST (linger 0), so the peer sees the connection die, not end cleanly."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.close()

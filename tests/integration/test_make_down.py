"""`make down` (`python -m portal.devstack down`) from another terminal stops a running `make up`
and everything it runs before it stops PostgreSQL and Redis: stopping those under a live `up`
left its web server, worker and agents running, failing on every request.

The `up` here is the real one (portal.devstack.main) in a process of its own, with the slow
parts left out: no PostgreSQL or Redis to start, no migrations, and small stand-ins for the web
server, the worker and an agent, which its real supervisor runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from portal import devstack
from tests.conftest import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
StartUp = Callable[[str], subprocess.Popen[bytes]]

# argv: the directory that stands in for the repository (its var/ is the run directory), the web
# port, and whether the web server answers ("serves") or never does ("hangs").
UP = """
import sys
from pathlib import Path
from portal import devstack

devstack.REPO = Path(sys.argv[1])
devstack.create_database = lambda url: None
devstack.manage = lambda env, *args: None
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
web = [sys.executable, "-m", "http.server", sys.argv[2], "--bind", "127.0.0.1"]
devstack.portal_commands = lambda host, port, worker, beat: {
    "web": web if sys.argv[3] == "serves" else sleeper,
    "worker": sleeper,
}
devstack.demo_agent_commands = lambda port, run_dir: [("a100-node-1", sleeper)]
sys.exit(devstack.main(["up", "--port", sys.argv[2]]))
"""


def children_of(pid: int) -> list[int]:
    children = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if f"\nPPid:\t{pid}\n" in status.read_text():
                children.append(int(status.parent.name))
        except OSError:
            continue  # it ended meanwhile
    return children


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[StartUp]:
    """start_up("serves" | "hangs") -> the `up` process, on tmp_path/var; its output in tmp_path/up.log."""
    started: list[subprocess.Popen[bytes]] = []
    # Set, so that `up` uses them as they are and starts no PostgreSQL or Redis of its own.
    env = {**os.environ, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "REDIS_URL": "redis://none"}

    def start(web: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / "up.log", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", UP, str(tmp_path), str(free_port()), web],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        for child in children_of(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)  # each leads a group of its own
        proc.kill()
        proc.wait()


@pytest.fixture
def stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """`down` on tmp_path/var, with PostgreSQL and Redis said to run there; records which it
    stops and whether `up` was still running at the time."""
    recorded: list[tuple[str, bool]] = []
    (tmp_path / "var" / "pg").mkdir(parents=True)
    (tmp_path / "var" / "pg" / "postmaster.pid").write_text("4242\n")
    monkeypatch.setattr(devstack, "REPO", tmp_path)
    monkeypatch.setattr(devstack, "postgres_bin", lambda: Path("/pg/bin"))
    monkeypatch.setattr(devstack, "pg_os_user", lambda: None)
    monkeypatch.setattr(devstack, "port_open", lambda port, host="127.0.0.1": port == 56379)

    def run(cmd: list[str], **kwargs: object) -> None:
        recorded.append((Path(cmd[0]).name, devstack.running_up(tmp_path / "var") is not None))

    monkeypatch.setattr(devstack.subprocess, "run", run)
    return recorded


def test_down_stops_a_running_up_and_what_it_runs_then_postgresql_and_redis(
    start_up: StartUp, stops: list[tuple[str, bool]], tmp_path: Path
) -> None:
    up = start_up("serves")
    wait_for(lambda: "GPU Portal is running" in (tmp_path / "up.log").read_text(), 30, "`up` to start")
    children = children_of(up.pid)
    assert len(children) == 3  # web, worker, agent

    second = start_up("serves")
    assert second.wait(timeout=30) == 1  # refused: it would start a second cluster on the same ports
    assert f"`make up` already runs on {tmp_path / 'var'} (pid {up.pid})" in (tmp_path / "up.log").read_text()
    assert set(children_of(up.pid)) == set(children)

    assert devstack.main(["down"]) == 0
    assert up.wait(timeout=5) == 0
    assert stops == [("pg_ctl", False), ("redis-cli", False)]  # after `up` had stopped, not under it
    assert not [child for child in children if alive(child)]
    assert "Traceback" not in (tmp_path / "up.log").read_text()
    assert (tmp_path / "var" / "devstack.pid").read_text() == ""


def test_down_stops_an_up_that_is_still_starting(
    start_up: StartUp, stops: list[tuple[str, bool]], tmp_path: Path
) -> None:
    up = start_up("hangs")  # `up` waits for the web server to answer
    wait_for(lambda: len(children_of(up.pid)) == 2, 30, "`up` to start the web server and the worker")
    children = children_of(up.pid)
    started = time.monotonic()
    assert devstack.main(["down"]) == 0
    assert time.monotonic() - started < 15  # not after `up` gave up waiting for the web server
    assert up.wait(timeout=5) == 0
    assert not [child for child in children if alive(child)]
    log = (tmp_path / "up.log").read_text()
    assert "stopped before the demo had started" in log and "Traceback" not in log
    assert stops == [("pg_ctl", False), ("redis-cli", False)]


def test_down_signals_no_process_a_stale_pid_file_names(
    stops: list[tuple[str, bool]], tmp_path: Path
) -> None:
    """A pid file of an `up` that was killed names a pid that may belong to anyone by now."""
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        (tmp_path / "var" / devstack.UP_PID_FILE).write_text(f"{bystander.pid}\n")
        assert devstack.main(["down"]) == 0
        assert bystander.poll() is None
        assert stops == [("pg_ctl", False), ("redis-cli", False)]
    finally:
        bystander.kill()
        bystander.wait()

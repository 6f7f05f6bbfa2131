"""The supervisor behind `make up`: Ctrl-C (SIGINT) or SIGTERM stops it and every process it
runs, also when a shell started it in the background with SIGINT ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DRIVER = """
import os, sys
from portal.devstack import Supervisor
supervisor = Supervisor(dict(os.environ))
supervisor.start("sleeper", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"])
try:
    code = supervisor.wait()
finally:
    supervisor.stop()
print("stopped", code, supervisor.procs[0][1].pid, flush=True)
"""


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell does for `cmd &`


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_background_supervisor_stops_on_sigint_and_sigterm(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "sleeper | up"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    stopped, code, child = out.split()[-3:]
    assert (stopped, code) == ("stopped", "0"), out
    with pytest.raises(ProcessLookupError):
        os.kill(int(child), 0)  # the process it ran is gone too


def test_down_stops_the_postgresql_and_redis_that_up_leaves_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C stops what the supervisor runs; `make up` keeps its PostgreSQL and Redis for the
    next start, and `make down` (`python -m portal.devstack down`) is what stops them."""
    from portal import devstack

    data = tmp_path / "var" / "pg"
    data.mkdir(parents=True)
    (data / "postmaster.pid").write_text("4242\n")
    ran: list[list[str]] = []
    monkeypatch.setattr(devstack, "REPO", tmp_path)
    monkeypatch.setattr(devstack, "postgres_bin", lambda: Path("/pg/bin"))
    monkeypatch.setattr(devstack, "pg_os_user", lambda: None)
    monkeypatch.setattr(devstack, "port_open", lambda port, host="127.0.0.1": port == 56379)
    monkeypatch.setattr(devstack.subprocess, "run", lambda cmd, **kwargs: ran.append(cmd))

    assert devstack.main(["down"]) == 0
    assert ran == [
        ["/pg/bin/pg_ctl", "-D", str(data), "stop", "-m", "fast"],
        ["redis-cli", "-p", "56379", "shutdown", "nosave"],
    ]

    ran.clear()
    (data / "postmaster.pid").unlink()
    monkeypatch.setattr(devstack, "port_open", lambda port, host="127.0.0.1": False)
    assert devstack.main(["down"]) == 0
    assert ran == []  # nothing running: nothing to stop


def test_down_stops_the_job_processes_the_demo_agents_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job outlives its agent on purpose (the next agent adopts it), so after Ctrl-C the demo's
    jobs ran on with nothing to end them; `make down` ends them, and only them."""
    from agents.runtime.shell import stat_fields
    from portal import devstack

    job = subprocess.Popen(["sleep", "600"], start_new_session=True)
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        for name, pid in (("att-1.0", job.pid), ("att-2.0", bystander.pid)):
            attempt = tmp_path / "var" / "agents" / "a100-node-1" / "process" / name
            attempt.mkdir(parents=True)
            # The second record's start time is not its process's: its pid was reused.
            ticks = int(stat_fields(pid)[19]) + (0 if name == "att-1.0" else 1)
            (attempt / "record.json").write_text(json.dumps({"pid": pid, "start_ticks": ticks}))
        monkeypatch.setattr(devstack, "REPO", tmp_path)
        monkeypatch.setattr(devstack, "port_open", lambda port, host="127.0.0.1": False)

        assert devstack.main(["down"]) == 0
        assert job.wait(timeout=30) == -signal.SIGKILL
        assert bystander.poll() is None  # a reused pid is someone else's
    finally:
        for process in (job, bystander):
            process.kill()
            process.wait()

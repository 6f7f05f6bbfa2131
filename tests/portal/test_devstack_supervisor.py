"""The supervisor behind `make up`: Ctrl-C (SIGINT) or SIGTERM stops it and every process it
runs, also when a shell started it in the background with SIGINT ignored."""

from __future__ import annotations

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

"""The in-job checkpoint helper against the agent's side of the contract (agents.checkpoint).

The helper reimplements the marker format on purpose (a job image has no agent code), so
these tests feed what it writes to the agent's own reader and waiter.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import checkpoint as agent_side
from gpuportal import checkpoint
from gpuportal.checkpoint import Checkpointer, CheckpointError
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_counter.py"


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    directory = tmp_path / "ckpt"
    monkeypatch.setenv("GPUPORTAL_CHECKPOINT_DIR", str(directory))
    monkeypatch.setenv("GPUPORTAL_RESUME", "0")
    monkeypatch.setenv("GPUPORTAL_CHECKPOINT_SIGNAL", "SIGUSR1")
    return directory


def test_the_agent_reads_what_the_helper_saves(job_env: Path) -> None:
    ckpt = Checkpointer(register=False)
    assert ckpt.directory == job_env and job_env.is_dir()
    before = agent_side.marker_identity(job_env)
    assert before is None

    saved = ckpt.save_json(40, {"step": 40, "weights": [1, 2, 3]})
    found = agent_side.read_marker(job_env)
    assert found.step == 40
    assert found.path == saved.resolve() and found.size_bytes == saved.stat().st_size
    assert found.time.tzinfo is not None

    # Every save is a new marker file, which is how the agent tells "after my request".
    first = agent_side.marker_identity(job_env)
    ckpt.save_json(41, {"step": 41})
    assert agent_side.marker_identity(job_env) != first
    assert agent_side.read_marker(job_env).step == 41
    assert ckpt.latest() is not None and ckpt.latest().step == 41
    assert ckpt.load_json() == {"step": 41}


def test_a_checkpoint_directory_written_by_a_framework(job_env: Path) -> None:
    ckpt = Checkpointer(register=False)
    with ckpt.saving(7) as target:
        target.mkdir()
        (target / "model.bin").write_bytes(b"w" * 1000)
        (target / "optimizer.bin").write_bytes(b"o" * 500)
    found = agent_side.read_marker(job_env)
    assert found.step == 7 and found.path == (job_env / "step-7").resolve() and found.size_bytes == 1500

    with pytest.raises(RuntimeError), ckpt.saving(8) as target:
        target.write_bytes(b"half")
        raise RuntimeError("the save failed half-way")
    assert agent_side.read_marker(job_env).step == 7, "a failed save leaves the last good checkpoint"
    assert not [p for p in job_env.iterdir() if p.name.endswith(".tmp")]


def test_the_metric_reaches_the_agent_and_the_portal_prunes_unless_told_otherwise(job_env: Path) -> None:
    ckpt = Checkpointer(register=False)
    for step in range(1, 4):
        ckpt.save_json(step, {"step": step}, metric=1 / step, metric_mode="min")
    found = agent_side.read_marker(job_env)
    assert (found.step, found.metric, found.metric_mode) == (3, 1 / 3, "min")
    assert sorted(p.name for p in job_env.iterdir()) == [
        "checkpoint.json",
        "step-1.json",
        "step-2.json",
        "step-3.json",
    ]
    with pytest.raises(CheckpointError, match="metric_mode"):
        checkpoint.write_marker(job_env, 4, "step-3.json", metric=0.1, metric_mode="lower")


def test_only_the_newest_checkpoints_are_kept(job_env: Path) -> None:
    ckpt = Checkpointer(register=False, keep=2)
    for step in range(1, 6):
        ckpt.save_bytes(step, f"state {step}".encode())
        time.sleep(0.01)
    assert sorted(p.name for p in job_env.iterdir()) == ["checkpoint.json", "step-4", "step-5"]


def test_the_environment_decides_resume_signal_and_directory(
    job_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert checkpoint.is_resume() is False
    monkeypatch.setenv("GPUPORTAL_RESUME", "1")
    assert checkpoint.is_resume() is True
    monkeypatch.setenv("GPUPORTAL_CHECKPOINT_SIGNAL", "SIGUSR2")
    assert checkpoint.checkpoint_signal() is signal.SIGUSR2
    monkeypatch.setenv("GPUPORTAL_CHECKPOINT_SIGNAL", "")
    assert checkpoint.checkpoint_signal() is signal.SIGUSR1
    monkeypatch.setenv("GPUPORTAL_CHECKPOINT_SIGNAL", "SIGNOPE")
    with pytest.raises(CheckpointError, match="SIGNOPE"):
        checkpoint.checkpoint_signal()
    monkeypatch.delenv("GPUPORTAL_CHECKPOINT_DIR")
    with pytest.raises(CheckpointError, match="GPUPORTAL_CHECKPOINT_DIR"):
        Checkpointer(register=False)


def test_markers_must_stay_inside_the_directory(tmp_path: Path) -> None:
    for bad in ("/etc/passwd", "../elsewhere", ""):
        with pytest.raises(CheckpointError):
            checkpoint.write_marker(tmp_path, 1, bad)
    with pytest.raises(CheckpointError):
        checkpoint.write_marker(tmp_path, -1, "step-1")
    (tmp_path / "checkpoint.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid"):
        checkpoint.read_marker(tmp_path)


def test_the_signal_only_sets_a_flag(job_env: Path) -> None:
    calls: list[bool] = []
    ckpt = Checkpointer(on_request=lambda: calls.append(True))
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        assert not ckpt.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for(lambda: ckpt.requested, 5, "the handler to run")
        assert calls == [True]
        assert agent_side.marker_identity(job_env) is None, "saving is the training loop's business"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def run_example(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--step-seconds", "0.01", *args],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_example_saves_on_the_signal_as_the_agent_expects_and_resumes(tmp_path: Path) -> None:
    """The agent's sequence without the portal: note the marker, signal, wait for a new one."""
    directory = tmp_path / "job-1"
    env = {"GPUPORTAL_CHECKPOINT_DIR": str(directory), "GPUPORTAL_RESUME": "0"}
    first = run_example(env, "--steps", "100000", "--save-every", "25", "--report-every", "1")
    assert first.stdout is not None
    seen: list[str] = []
    while not any(line.startswith("saved step 25") for line in seen):
        line = first.stdout.readline()
        assert line, "the example ended early: " + "".join(seen)
        seen.append(line)
    before = agent_side.marker_identity(directory)
    assert before is not None

    first.send_signal(signal.SIGUSR1)

    async def still_running() -> bool:
        return first.poll() is None

    found = asyncio.run(agent_side.wait_for_new_marker(directory, before, 20, still_running))
    output = "".join(seen) + first.stdout.read()
    assert first.wait(10) == 0
    assert found is not None, output
    assert f"checkpoint requested at step {found.step}: saving and exiting" in output
    assert found.step > 25
    assert json.loads(found.path.read_text())["step"] == found.step

    second = run_example({**env, "GPUPORTAL_RESUME": "1"}, "--steps", str(found.step + 30))
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0
    assert out.splitlines()[0] == f"resumed from step {found.step}"
    assert out.splitlines()[-1] == f"done at step {found.step + 30}"

"""ProcessRuntime with real processes: lifecycle, logs, signals, suspend, stop, reattach."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from agent_builders import collect_logs, eventually, make_attempt

from agents.protocol import AttemptState, GpuRef, Mount
from agents.runtime import RuntimeFailure, UnknownAttemptError
from agents.runtime.policy import HostPolicy, PolicyError
from agents.runtime.process import ProcessRuntime

PY = sys.executable


@pytest.fixture
def runtime(tmp_path: Path) -> ProcessRuntime:
    policy = HostPolicy(checkpoint_roots=(tmp_path / "ckpt",))
    return ProcessRuntime(tmp_path / "state", policy)


async def observed(runtime: ProcessRuntime, attempt_id: str):
    return next(item for item in await runtime.list_attempts() if item.attempt_id == attempt_id)


@pytest.mark.asyncio
async def test_it_streams_numbered_lines_per_stream_and_reports_the_exit_code(
    runtime: ProcessRuntime,
) -> None:
    attempt = make_attempt(
        command=["sh", "-c", "echo out-1; echo err-1 >&2; echo out-2; printf tail; exit 3"]
    )
    await runtime.start(attempt)
    assert await runtime.wait("att-1") == 3
    assert await collect_logs(runtime, "att-1", "stdout") == [(0, "out-1"), (1, "out-2"), (2, "tail")]
    assert await collect_logs(runtime, "att-1", "stderr") == [(0, "err-1")]
    assert await collect_logs(runtime, "att-1", "stdout", from_seq=1) == [(1, "out-2"), (2, "tail")]
    final = await observed(runtime, "att-1")
    assert (final.state, final.exit_code, final.job_id) == (AttemptState.EXITED, 3, "job-1")


@pytest.mark.asyncio
async def test_the_command_gets_its_allocation_and_not_the_agent_environment(
    runtime: ProcessRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SECRET", "do-not-leak")
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    attempt = make_attempt(
        command=[PY, "-c", script],
        env={"EPOCHS": "3"},
        gpus=[GpuRef(uuid="GPU-a", index=2), GpuRef(uuid="GPU-b", index=3)],
        checkpoint_dir=str(tmp_path / "ckpt" / "job-1"),
        resume=True,
        replica=1,
        replicas=3,
        replica_nodes=["node-a", "node-b", "node-c"],
    )
    await runtime.start(attempt)
    assert await runtime.wait("att-1") == 0
    ((_, text),) = await collect_logs(runtime, "att-1", "stdout")
    env = json.loads(text)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env["GPUPORTAL_JOB_ID"] == "job-1"
    assert env["GPUPORTAL_ATTEMPT_ID"] == "att-1"
    assert env["GPUPORTAL_CHECKPOINT_DIR"] == str(tmp_path / "ckpt" / "job-1")
    assert env["GPUPORTAL_RESUME"] == "1"
    assert (env["GPUPORTAL_REPLICA"], env["GPUPORTAL_REPLICAS"]) == ("1", "3")
    assert env["GPUPORTAL_REPLICA_NODES"] == "node-a,node-b,node-c"
    assert env["EPOCHS"] == "3"
    assert "AGENT_SECRET" not in env
    assert (tmp_path / "ckpt" / "job-1").is_dir()


@pytest.mark.asyncio
async def test_the_command_runs_in_its_own_process_group(runtime: ProcessRuntime) -> None:
    await runtime.start(make_attempt(command=[PY, "-c", "import os; print(os.getpgid(0), os.getsid(0))"]))
    await runtime.wait("att-1")
    ((_, text),) = await collect_logs(runtime, "att-1", "stdout")
    process_group, session = map(int, text.split())
    assert process_group == session != os.getpgid(0)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "fields",
    [
        {"env": {"LD_PRELOAD": "/tmp/evil.so"}},
        {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
        {"env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}},
        {"env": {"GPUPORTAL_RESUME": "1"}},
        {"checkpoint_dir": "/etc/cron.d"},
        {"mounts": [Mount(source="/srv/data", target="/data")]},
    ],
    ids=["ld-preload", "nvidia-visible", "cuda-visible", "gpuportal", "checkpoint-outside-root", "mounts"],
)
async def test_it_refuses_a_policy_violation_and_starts_nothing(runtime: ProcessRuntime, fields) -> None:
    with pytest.raises(PolicyError):
        await runtime.start(make_attempt(**fields))
    assert await runtime.list_attempts() == []


@pytest.mark.asyncio
async def test_an_attempt_starts_only_once(runtime: ProcessRuntime) -> None:
    await runtime.start(make_attempt())
    await runtime.wait("att-1")
    with pytest.raises(RuntimeFailure, match="already started"):
        await runtime.start(make_attempt())


TICKER = """
import sys, time
path = sys.argv[1]
n = 0
while True:
    n += 1
    with open(path, "w") as f:
        f.write(str(n))
    time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_suspend_stops_the_group_and_resume_continues_it(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    counter = tmp_path / "counter"
    await runtime.start(make_attempt(command=[PY, "-c", TICKER, str(counter)]))
    await eventually(lambda: counter.exists() and counter.read_text() != "")
    await runtime.suspend("att-1")
    assert (await observed(runtime, "att-1")).state == AttemptState.SUSPENDED
    frozen = counter.read_text()
    for _ in range(5):  # a stopped group makes no progress, however long we look
        await runtime.list_attempts()
        assert counter.read_text() == frozen
    await runtime.resume("att-1")
    assert (await observed(runtime, "att-1")).state == AttemptState.RUNNING
    await eventually(lambda: counter.read_text() not in ("", frozen))
    assert await runtime.stop("att-1", grace_s=5) == 128 + signal.SIGTERM


GRACEFUL = """
import os, signal, sys, time
def on_term(signum, frame):
    os.write(1, b"saving and leaving\\n")  # print() in a handler may re-enter a print in progress
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


async def _first_line_is_ready(runtime: ProcessRuntime) -> bool:
    path = runtime.root / "att-1" / "stdout.log"
    return path.exists() and path.read_text().startswith("ready")


@pytest.mark.asyncio
async def test_stop_sends_sigterm_and_the_job_may_exit_cleanly(runtime: ProcessRuntime) -> None:
    await runtime.start(make_attempt(command=[PY, "-c", GRACEFUL]))
    await eventually(lambda: _first_line_is_ready(runtime))
    assert await runtime.stop("att-1", grace_s=10) == 0
    assert await collect_logs(runtime, "att-1", "stdout") == [(0, "ready"), (1, "saving and leaving")]


@pytest.mark.asyncio
async def test_stop_kills_a_job_that_ignores_sigterm_after_the_grace_period(runtime: ProcessRuntime) -> None:
    await runtime.start(make_attempt(command=[PY, "-c", STUBBORN]))
    await eventually(lambda: _first_line_is_ready(runtime))
    assert await runtime.stop("att-1", grace_s=0.2) == 128 + signal.SIGKILL
    final = await observed(runtime, "att-1")
    assert (final.state, final.exit_code) == (AttemptState.EXITED, 137)
    assert await runtime.stop("att-1", grace_s=0.2) == 137  # idempotent


@pytest.mark.asyncio
async def test_stop_of_a_suspended_job_still_lets_it_handle_sigterm(runtime: ProcessRuntime) -> None:
    await runtime.start(make_attempt(command=[PY, "-c", GRACEFUL]))
    await eventually(lambda: _first_line_is_ready(runtime))
    await runtime.suspend("att-1")
    assert await runtime.stop("att-1", grace_s=10) == 0


@pytest.mark.asyncio
async def test_signal_reaches_the_command(runtime: ProcessRuntime) -> None:
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR2, lambda s, f: (os.write(1, b'got usr2\\n'), sys.exit(5)))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.01)\n"
    )
    await runtime.start(make_attempt(command=[PY, "-c", script]))
    await eventually(lambda: _first_line_is_ready(runtime))
    await runtime.signal("att-1", "SIGUSR2")
    exit_code = await runtime.wait("att-1")
    assert (exit_code, await collect_logs(runtime, "att-1", "stderr")) == (5, [])
    assert (1, "got usr2") in await collect_logs(runtime, "att-1", "stdout")


@pytest.mark.asyncio
async def test_unknown_attempts_and_missing_commands(runtime: ProcessRuntime) -> None:
    with pytest.raises(UnknownAttemptError):
        await runtime.signal("nope", "SIGTERM")
    await runtime.start(make_attempt(command=["/nonexistent/binary"]))
    assert await runtime.wait("att-1") == 127
    assert "cannot run" in (await collect_logs(runtime, "att-1", "stderr"))[0][1]


RESTARTABLE = """
import os, sys, time
go = sys.argv[1]
for i in range(3):
    print(f"before {i}", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
for i in range(2):
    print(f"after {i}", flush=True)
sys.exit(7)
"""


@pytest.mark.asyncio
async def test_a_new_runtime_on_the_same_state_dir_reattaches_to_a_running_attempt(tmp_path: Path) -> None:
    """A restarted agent finds the process, streams the rest of its log and learns its exit code."""
    policy = HostPolicy()
    first = ProcessRuntime(tmp_path / "state", policy)
    go = tmp_path / "go"
    await first.start(make_attempt(command=[PY, "-c", RESTARTABLE, str(go)]))
    stream = first.logs("att-1", "stdout")
    seen = [await anext(stream) for _ in range(3)]
    await stream.aclose()
    assert [line.text for line in seen] == ["before 0", "before 1", "before 2"]
    del first  # the agent is gone; the attempt is not

    second = ProcessRuntime(tmp_path / "state", policy)
    (found,) = await second.list_attempts()
    assert (found.attempt_id, found.state) == ("att-1", AttemptState.RUNNING)
    go.touch()
    rest = await collect_logs(second, "att-1", "stdout", from_seq=3)
    assert rest == [(3, "after 0"), (4, "after 1")]
    assert await second.wait("att-1") == 7
    await second.remove("att-1")
    assert await second.list_attempts() == []


@pytest.mark.asyncio
async def test_an_attempt_whose_wrapper_died_without_an_exit_code_is_vanished(
    runtime: ProcessRuntime,
) -> None:
    await runtime.start(make_attempt(command=[PY, "-c", STUBBORN]))
    await eventually(lambda: _first_line_is_ready(runtime))
    record = json.loads((runtime.root / "att-1" / "record.json").read_text())
    os.killpg(record["pid"], signal.SIGKILL)  # e.g. the OOM killer took the whole group
    await eventually(lambda: _is_vanished(runtime))


async def _is_vanished(runtime: ProcessRuntime) -> bool:
    return (await observed(runtime, "att-1")).state == AttemptState.VANISHED


@pytest.mark.asyncio
async def test_it_tells_which_attempt_a_pid_belongs_to(runtime: ProcessRuntime) -> None:
    script = "import os, time\nprint(os.getpid(), flush=True)\nwhile True: time.sleep(0.02)\n"
    await runtime.start(make_attempt(command=[PY, "-c", script]))
    await eventually(lambda: (runtime.root / "att-1" / "stdout.log").read_text().strip() != "")
    job_pid = int((runtime.root / "att-1" / "stdout.log").read_text())
    assert runtime.attempt_of_pid(job_pid) == "att-1"
    assert runtime.attempt_of_pid(os.getpid()) is None
    await runtime.stop("att-1", grace_s=5)
    assert runtime.attempt_of_pid(job_pid) is None


@pytest.mark.asyncio
async def test_a_sigkill_request_still_leaves_an_exit_code(runtime: ProcessRuntime) -> None:
    await runtime.start(make_attempt(command=[PY, "-c", STUBBORN]))
    await eventually(lambda: _first_line_is_ready(runtime))
    await runtime.signal("att-1", "SIGKILL")
    assert await runtime.wait("att-1") == 137


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait a moment for its reaper)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text[text.rindex(")") + 2] != "Z"


@pytest.mark.asyncio
async def test_background_children_of_a_command_that_exited_are_killed(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    """A command that ends by itself may leave children in its group; they must not keep
    running (and holding the attempt's GPUs) after the attempt is reported ended."""
    child_pid = tmp_path / "child.pid"
    script = f"sleep 4242 & echo $! > {child_pid}; echo main done"
    await runtime.start(make_attempt(command=["sh", "-c", script]))
    assert await runtime.wait("att-1") == 0
    pid = int(child_pid.read_text())
    try:
        await eventually(lambda: _not_running(pid))
        assert (await observed(runtime, "att-1")).exit_code == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _not_running(pid: int) -> bool:
    return not _running(pid)


@pytest.mark.asyncio
async def test_reading_a_long_log_gives_the_event_loop_turns(runtime: ProcessRuntime) -> None:
    """Without a turn between reads, a job that writes fast (``yes``) or a long log read again
    after a restart holds the event loop: no heartbeats, no other attempt served."""
    script = "import sys\nline = 'x' * 99 + '\\n'\nsys.stdout.write(line * 40_000)\n"  # about 4 MB
    await runtime.start(make_attempt(command=[PY, "-c", script]))
    assert await runtime.wait("att-1") == 0
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    turns_before = turns
    lines = 0
    async for _ in runtime.logs("att-1", "stdout"):  # what the agent's log pump does
        lines += 1
    counter.cancel()
    assert lines == 40_000
    assert turns - turns_before >= 4_000_000 // (1 << 16) // 2  # about one per 64 KiB read

"""The agent against a fake portal on loopback: hello, desired set, logs, status, resync, requests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from agent_builders import make_attempt
from fake_portal import TOKEN, FakePortal, wait_for

from agents.agent import Agent
from agents.config import AgentConfig
from agents.devices.simulated import SimulatedBackend, load_description
from agents.protocol import (
    AttemptState,
    CheckpointDone,
    CheckpointRequest,
    DesiredAttempt,
    ExitReason,
    GpuProcess,
    GpuRef,
    GpuSample,
    Heartbeat,
    RequestAck,
    RequestReject,
    ResumeRequest,
    SignalRequest,
    StopRequest,
    SuspendRequest,
    TelemetryBatch,
)
from agents.runtime import RuntimeFailure
from agents.runtime.policy import HostPolicy
from agents.runtime.process import ProcessRuntime

PY = sys.executable

WAIT_FOR_GO = """
import os, sys, time
go = sys.argv[1]
for i in range(3):
    print(f"before {i}", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
print("after", flush=True)
"""

FOREVER = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.02)\n"


def make_agent(portal_url: str, state_dir: Path, token: str = TOKEN) -> Agent:
    config = AgentConfig(
        portal_url=f"{portal_url.replace('http', 'ws')}/ws/agent/",
        token=token,
        runtime="process",
        simulate="dgx-a100",
        state_dir=state_dir,
        node_name="node-1",
        telemetry_interval_s=1,
        heartbeat_interval_s=1,
        monitor_interval_s=0.05,
        checkpoint_roots=(state_dir.parent / "ckpt",),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    backend = SimulatedBackend(load_description("dgx-a100"), "node-1", seed=1)
    runtime = ProcessRuntime(state_dir, HostPolicy(checkpoint_roots=config.checkpoint_roots))
    return Agent(config, backend, runtime)


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def gpu(agent: Agent, index: int) -> GpuRef:
    return GpuRef(uuid=agent.backend.inventory()[index].uuid, index=index)


def kill_leftovers(state_dir: Path) -> None:
    """Attempts outlive agents by design; tests clean up the process groups they leave."""
    for record in (state_dir / "process").glob("*/record.json"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)


@pytest.fixture
def state_dir(tmp_path: Path):
    directory = tmp_path / "state"
    yield directory
    kill_leftovers(directory)


@pytest.mark.asyncio
async def test_it_runs_the_desired_attempt_streams_logs_and_resyncs_after_a_dropped_connection(
    state_dir: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        attempt = make_attempt("att-1", command=[PY, "-c", WAIT_FOR_GO, str(go)], gpus=[gpu(agent, 0)])
        portal.desired = [attempt]
        async with running(agent):
            # hello -> welcome -> desired set -> the attempt runs and its output arrives
            await wait_for(lambda: len(portal.hellos) == 1)
            hello = portal.hellos[0]
            assert (hello.node_name, len(hello.gpus), hello.runtime.kind, hello.drain_reason) == (
                "node-1",
                8,
                "process",
                None,
            )
            assert hello.attempts == []
            await wait_for(lambda: len(portal.log_lines("att-1")) == 3)
            assert portal.log_lines("att-1") == {0: "before 0", 1: "before 1", 2: "before 2"}
            assert portal.last_status("att-1").state == AttemptState.RUNNING

            # telemetry follows the attempt: its GPU is busy, the others idle
            await wait_for(lambda: portal.of_type(TelemetryBatch) and portal.of_type(Heartbeat))
            samples = {sample.gpu_uuid: sample for sample in portal.of_type(TelemetryBatch)[-1].samples}
            assert samples[gpu(agent, 0).uuid].utilization_pct > 50
            assert samples[gpu(agent, 1).uuid].utilization_pct == 0

            # the connection drops; the agent reconnects and reports what it runs
            await portal.drop()
            await wait_for(lambda: len(portal.hellos) == 2)
            (reported,) = portal.hellos[1].attempts
            assert (reported.attempt_id, reported.state) == ("att-1", AttemptState.RUNNING)
            assert reported.gpu_uuids == [gpu(agent, 0).uuid]

            go.touch()
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            final = portal.last_status("att-1")
            assert (final.exit_code, final.reason) == (0, ExitReason.SUCCEEDED)
            await wait_for(lambda: 3 in portal.log_lines("att-1"))
            assert portal.log_lines("att-1")[3] == "after"
            assert agent.sessions == 2

            # the portal drops it from the desired set: the agent forgets it
            await portal.set_desired([])
            await wait_for(lambda: agent.store.get("att-1") is None)
            assert await agent.runtime.list_attempts() == []


LOUD_AFTER_GO = """
import os, sys, time
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.02)
for i in range(2000):
    print(f"line {i:04d} of the output written while the portal was away", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.asyncio
async def test_output_the_outbox_dropped_in_an_outage_is_sent_again_once_the_portal_is_back(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agents.agent.OUTBOX_LOG_BYTES", 4000)  # about 60 lines
    go = tmp_path / "go"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        portal.desired = [
            make_attempt("att-1", command=[PY, "-c", LOUD_AFTER_GO, str(go)], gpus=[gpu(agent, 0)])
        ]
        async with running(agent):
            await wait_for(lambda: portal.last_status("att-1") is not None)
            portal.refuse_all = True
            await portal.drop()
            go.touch()
            await wait_for(lambda: agent.outbox_dropped > 0 and agent.lost_logs)
            await asyncio.sleep(0.5)  # the job has written all its lines by now
            portal.refuse_all = False
            await wait_for(lambda: len(portal.log_lines("att-1")) == 2000)
    lines = portal.log_lines("att-1")
    assert [lines[i] for i in range(2000)] == [
        f"line {i:04d} of the output written while the portal was away" for i in range(2000)
    ]
    assert agent.lost_logs == {}


LOUD_AT_ONCE = """
import os, sys, time
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.02)
sys.stdout.write("".join(f"line {i:04d} written faster than the outbox takes it\\n" for i in range(2000)))
sys.stdout.flush()
while True:
    time.sleep(0.05)
"""


@pytest.mark.asyncio
async def test_output_the_outbox_dropped_while_connected_is_sent_again_in_the_same_session(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst larger than the outbox is trimmed even while the portal is connected; the lines
    it dropped are read again once the outbox has drained, not only after a reconnect."""
    monkeypatch.setattr("agents.agent.OUTBOX_LOG_BYTES", 4000)  # about 60 lines
    go = tmp_path / "go"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        portal.desired = [
            make_attempt("att-1", command=[PY, "-c", LOUD_AT_ONCE, str(go)], gpus=[gpu(agent, 0)])
        ]
        async with running(agent):
            await wait_for(lambda: portal.last_status("att-1") is not None)
            go.touch()
            await wait_for(lambda: agent.outbox_dropped > 0)
            await wait_for(lambda: len(portal.log_lines("att-1")) == 2000)
            assert agent.sessions == 1  # no reconnect was needed
    lines = portal.log_lines("att-1")
    assert [lines[i] for i in range(2000)] == [
        f"line {i:04d} written faster than the outbox takes it" for i in range(2000)
    ]


@pytest.mark.asyncio
async def test_a_log_pump_hands_on_its_lines_without_waiting_for_the_monitor(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a pump holds in memory is bounded: a job writing fast (or a long log read again
    after a restart) must not pile up lines until the next monitor round flushes them."""
    monkeypatch.setattr("agents.agent.LOG_BUFFER_CHARS", 1000)
    go = tmp_path / "go"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        agent.config = dataclasses.replace(agent.config, monitor_interval_s=3600)  # no flush by the monitor
        portal.desired = [
            make_attempt("att-1", command=[PY, "-c", LOUD_AT_ONCE, str(go)], gpus=[gpu(agent, 0)])
        ]
        async with running(agent):
            await wait_for(lambda: portal.last_status("att-1") is not None)
            go.touch()
            await wait_for(lambda: len(portal.log_lines("att-1")) >= 1900)
            held = sum(len(line.text) + 1 for lines in agent.log_buffers.values() for line in lines)
            assert held < 2 * 1000


IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, lambda signum, frame: None)
print("up", flush=True)
while True:
    time.sleep(0.02)
"""


@pytest.mark.asyncio
async def test_a_long_stop_holds_back_only_the_starts_that_need_its_gpus(state_dir: Path) -> None:
    """A stop may take the attempt's grace period (up to an hour); other tenants' attempts on
    the node must start meanwhile, and only one given the stopping attempt's GPU waits for it."""
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        stubborn = make_attempt(
            "att-stubborn", command=[PY, "-c", IGNORES_SIGTERM], gpus=[gpu(agent, 0)], grace_period_s=600
        )
        portal.desired = [stubborn]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-stubborn").get(0) == "up")
            other = make_attempt("att-other", command=[PY, "-c", FOREVER], gpus=[gpu(agent, 1)])
            successor = make_attempt("att-successor", command=[PY, "-c", FOREVER], gpus=[gpu(agent, 0)])
            await portal.set_desired([other, successor])
            await wait_for(lambda: portal.last_status("att-stubborn").state == AttemptState.STOPPING)
            await wait_for(
                lambda: (
                    (s := portal.last_status("att-other")) is not None and s.state == AttemptState.RUNNING
                ),
                timeout_s=10,
            )
            await portal.set_desired([other, successor])  # a later set is applied meanwhile too
            await asyncio.sleep(0.5)
            assert portal.last_status("att-stubborn").state == AttemptState.STOPPING
            assert portal.last_status("att-successor").state == AttemptState.STARTING  # its GPU is held
            assert not (state_dir / "process" / "att-successor").exists()
            await portal.send(StopRequest(attempt_id="att-stubborn", grace_period_s=0))
            await wait_for(
                lambda: (
                    (s := portal.last_status("att-successor")) is not None and s.state == AttemptState.RUNNING
                )
            )
            stopped = portal.last_status("att-stubborn")
            assert (stopped.state, stopped.exit_code) == (AttemptState.EXITED, 137)
            assert stopped.time <= portal.last_status("att-successor").time


@pytest.mark.asyncio
async def test_a_restarted_agent_reattaches_stops_what_moved_and_reports_what_vanished(
    state_dir: Path, tmp_path: Path
) -> None:
    async with FakePortal() as portal:
        first = make_agent(portal.url, state_dir)
        moved = make_attempt("att-moved", command=[PY, "-c", FOREVER], gpus=[gpu(first, 0)])
        lost = make_attempt("att-lost", command=[PY, "-c", FOREVER], gpus=[gpu(first, 1)])
        kept = make_attempt("att-kept", command=[PY, "-c", FOREVER], gpus=[gpu(first, 2)])
        portal.desired = [moved, lost, kept]
        async with running(first):
            await wait_for(
                lambda: all(
                    (status := portal.last_status(a.attempt_id)) and status.state == AttemptState.RUNNING
                    for a in (moved, lost, kept)
                )
            )
        # The agent is gone (e.g. upgraded); its attempts are not. One of them dies meanwhile.
        record = json.loads((state_dir / "process" / "att-lost" / "record.json").read_text())
        os.killpg(record["pid"], signal.SIGKILL)
        await wait_for(lambda: not Path(f"/proc/{record['pid']}").exists() or _is_zombie(record["pid"]))

        fresh = make_attempt("att-new", command=[PY, "-c", FOREVER], gpus=[gpu(first, 0)])
        portal.desired = [lost, kept, fresh]  # att-moved now runs elsewhere
        portal.revision += 1
        second = make_agent(portal.url, state_dir)
        async with running(second):
            await wait_for(lambda: len(portal.hellos) == 2)
            reported = {item.attempt_id: item.state for item in portal.hellos[1].attempts}
            assert reported == {
                "att-moved": AttemptState.RUNNING,
                "att-kept": AttemptState.RUNNING,
                "att-lost": AttemptState.VANISHED,
            }
            await wait_for(lambda: portal.last_status("att-moved").state == AttemptState.EXITED)
            assert portal.last_status("att-moved").reason == ExitReason.STOPPED
            assert portal.last_status("att-lost").reason == ExitReason.VANISHED
            await wait_for(
                lambda: (s := portal.last_status("att-new")) is not None and s.state == AttemptState.RUNNING
            )
            assert portal.last_status("att-kept").state == AttemptState.RUNNING
            # the vanished attempt is never restarted under the same id
            assert [s.state for s in portal.statuses("att-lost")][-1] == AttemptState.VANISHED
            assert not (state_dir / "process" / "att-lost" / "exit.json").exists()
            # the reattached attempt's log is streamed again from line 0 (idempotent by seq)
            await wait_for(lambda: portal.log_lines("att-kept").get(0) == "up")


def _is_zombie(pid: int) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True


CHECKPOINTING_JOB = """
import json, os, signal, sys, time
directory = os.environ["GPUPORTAL_CHECKPOINT_DIR"]
step = 0
def save(signum, frame):
    path = os.path.join(directory, f"step-{step}")
    with open(path, "wb") as f:
        f.write(b"x" * 1000)
    tmp = os.path.join(directory, ".checkpoint.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "path": f"step-{step}"}, f)
    os.replace(tmp, os.path.join(directory, "checkpoint.json"))
    os.write(1, f"saved {step}\\n".encode())  # not print(): the handler may interrupt one
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
print("resume=" + os.environ["GPUPORTAL_RESUME"], flush=True)
while True:
    step += 1
    time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_requests_checkpoint_suspend_resume_signal_stop(state_dir: Path, tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "ckpt" / "job-1"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        job = make_attempt(
            "att-ckpt",
            command=[PY, "-c", CHECKPOINTING_JOB],
            checkpoint_dir=str(checkpoint_dir),
            resume=True,
            gpus=[gpu(agent, 0)],
        )
        other = make_attempt(
            "att-other", command=[PY, "-c", FOREVER], gpus=[gpu(agent, 1)], grace_period_s=0.2
        )
        portal.desired = [job, other]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-ckpt").get(0) == "resume=1")
            await wait_for(
                lambda: (s := portal.last_status("att-other")) is not None and s.state == AttemptState.RUNNING
            )

            def answer(request_id):
                answers = portal.of_type(RequestAck) + portal.of_type(RequestReject)
                return next((m for m in answers if m.request_id == request_id), None)

            # suspend / resume: acknowledged, visible as states with growing generations
            suspend = SuspendRequest(attempt_id="att-other")
            await portal.send(suspend)
            await wait_for(lambda: isinstance(answer(suspend.id), RequestAck))
            await wait_for(lambda: portal.last_status("att-other").state == AttemptState.SUSPENDED)
            resume = ResumeRequest(attempt_id="att-other")
            await portal.send(resume)
            await wait_for(lambda: isinstance(answer(resume.id), RequestAck))
            await wait_for(lambda: portal.last_status("att-other").state == AttemptState.RUNNING)
            generations = [s.generation for s in portal.statuses("att-other")]
            assert generations == sorted(generations) and len(set(generations)) == len(generations)

            # a duplicated request is answered again, not carried out again
            await portal.send(suspend)
            await wait_for(lambda: [m.request_id for m in portal.of_type(RequestAck)].count(suspend.id) == 2)
            assert portal.last_status("att-other").state == AttemptState.RUNNING

            # checkpoint: signal, marker, stop, checkpoint_done then ack
            checkpoint = CheckpointRequest(attempt_id="att-ckpt", grace_period_s=20)
            await portal.send(checkpoint)
            await wait_for(lambda: answer(checkpoint.id) is not None)
            assert isinstance(answer(checkpoint.id), RequestAck)
            (done,) = portal.of_type(CheckpointDone)
            assert done.request_id == checkpoint.id
            assert done.size_bytes == 1000 and done.step > 0
            assert done.path == str(checkpoint_dir / f"step-{done.step}")
            await wait_for(lambda: portal.last_status("att-ckpt").state == AttemptState.EXITED)
            assert portal.last_status("att-ckpt").reason == ExitReason.CHECKPOINTED
            assert AttemptState.CHECKPOINTING in [s.state for s in portal.statuses("att-ckpt")]

            # requests for attempts that do not run here are rejected
            late = SignalRequest(attempt_id="att-ckpt", signal="SIGUSR2")
            await portal.send(late)
            await wait_for(lambda: isinstance(answer(late.id), RequestReject))

            # stop with grace: SIGTERM (the job dies of it), reported as stopped
            stop = StopRequest(attempt_id="att-other", grace_period_s=5)
            await portal.send(stop)
            await wait_for(lambda: isinstance(answer(stop.id), RequestAck))
            final = portal.last_status("att-other")
            assert (final.state, final.reason, final.exit_code) == (
                AttemptState.EXITED,
                ExitReason.STOPPED,
                143,
            )


@pytest.mark.asyncio
async def test_a_checkpoint_without_a_marker_stops_the_job_and_rejects_the_request(
    state_dir: Path, tmp_path: Path
) -> None:
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        ignoring = (
            "import signal, time\nsignal.signal(signal.SIGUSR1, lambda s, f: None)\nprint('up', flush=True)\n"
        )
        ignoring += "while True: time.sleep(0.02)\n"
        portal.desired = [
            make_attempt("att-1", command=[PY, "-c", ignoring], checkpoint_dir=str(tmp_path / "ckpt" / "j"))
        ]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-1").get(0) == "up")
            request = CheckpointRequest(attempt_id="att-1", grace_period_s=0.3)
            await portal.send(request)
            await wait_for(lambda: portal.of_type(RequestReject))
            assert "no new checkpoint marker" in portal.of_type(RequestReject)[0].reason
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            assert portal.last_status("att-1").reason == ExitReason.STOPPED
            assert not portal.of_type(CheckpointDone)


@pytest.mark.asyncio
async def test_a_policy_violation_is_reported_as_a_start_failure(state_dir: Path) -> None:
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        portal.desired = [make_attempt("att-1", env={"LD_PRELOAD": "/tmp/x.so"})]
        async with running(agent):
            await wait_for(lambda: (s := portal.last_status("att-1")) is not None and s.state.is_terminal)
            status = portal.last_status("att-1")
            assert (status.state, status.reason) == (AttemptState.EXITED, ExitReason.START_FAILED)
            assert "LD_PRELOAD" in status.message


@pytest.mark.asyncio
async def test_a_wrong_token_is_refused_and_the_agent_keeps_retrying(state_dir: Path) -> None:
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir, token="stolen-or-stale")
        async with running(agent):
            await wait_for(lambda: portal.refused >= 3)
        assert portal.hellos == [] and agent.sessions == 0


@pytest.mark.asyncio
async def test_gpu_faults_mark_the_gpu_unhealthy_and_telemetry_gaps_are_counted(state_dir: Path) -> None:
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        async with running(agent):
            await wait_for(lambda: portal.of_type(TelemetryBatch))
            assert all(sample.healthy for sample in portal.of_type(TelemetryBatch)[0].samples)
            faulty = gpu(agent, 2).uuid
            agent.backend.inject_fault(2, xid=79)

            def faulty_sample():
                return [
                    sample
                    for batch in portal.of_type(TelemetryBatch)
                    for sample in batch.samples
                    if sample.gpu_uuid == faulty
                ]

            await wait_for(lambda: any(not sample.healthy for sample in faulty_sample()))
            bad = next(sample for sample in faulty_sample() if not sample.healthy)
            assert bad.xid_events == [79] and "fallen off the bus" in bad.health_reason

            # The portal goes away for more than a telemetry interval, then comes back.
            portal.refuse_all = True
            await portal.drop()
            await wait_for(lambda: agent.dropped_samples > 0 and portal.refused >= 1)
            portal.refuse_all = False
            await wait_for(lambda: len(portal.hellos) == 2)
            (again,) = [item for item in portal.hellos[1].gpus if item.uuid == faulty]
            assert not again.healthy and "xid 79" in again.health_reason
            await wait_for(lambda: any(batch.dropped_samples > 0 for batch in portal.of_type(TelemetryBatch)))


class StopRefusingOnce(ProcessRuntime):
    """A runtime whose first stop fails, as a busy container engine might."""

    refused = 0

    async def stop(self, attempt_id: str, grace_s: float) -> int | None:
        if not self.refused:
            self.refused += 1
            raise RuntimeFailure("engine busy")
        return await super().stop(attempt_id, grace_s)


@pytest.mark.asyncio
async def test_a_failed_action_is_retried_by_the_periodic_resync(state_dir: Path) -> None:
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        agent.config = dataclasses.replace(agent.config, resync_interval_s=0.3)
        agent.runtime = StopRefusingOnce(state_dir, HostPolicy())
        portal.desired = [make_attempt("att-1", command=[PY, "-c", FOREVER])]
        async with running(agent):
            await wait_for(
                lambda: (s := portal.last_status("att-1")) is not None and s.state == AttemptState.RUNNING
            )
            await portal.set_desired([])
            await wait_for(lambda: agent.runtime.refused == 1)
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            assert portal.last_status("att-1").reason == ExitReason.STOPPED


@pytest.mark.asyncio
async def test_a_suspended_attempt_is_resumed_to_checkpoint(state_dir: Path, tmp_path: Path) -> None:
    """Time slicing: the portal suspends via run_state, later preempts with a checkpoint."""
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        job = make_attempt(
            "att-1", command=[PY, "-c", CHECKPOINTING_JOB], checkpoint_dir=str(tmp_path / "ckpt" / "j")
        )
        portal.desired = [job]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-1").get(0) == "resume=0")
            await portal.set_desired([job.model_copy(update={"run_state": "suspended"})])
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.SUSPENDED)
            request = CheckpointRequest(attempt_id="att-1", grace_period_s=20)
            await portal.send(request)
            await wait_for(lambda: portal.of_type(RequestAck) or portal.of_type(RequestReject))
            assert [ack.request_id for ack in portal.of_type(RequestAck)] == [request.id]
            (done,) = portal.of_type(CheckpointDone)
            assert done.size_bytes == 1000
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            assert portal.last_status("att-1").reason == ExitReason.CHECKPOINTED


@pytest.mark.asyncio
async def test_a_job_that_exits_on_the_signal_without_a_marker_is_not_reported_checkpointed(
    state_dir: Path, tmp_path: Path
) -> None:
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        quits = "import signal, sys, time\nsignal.signal(signal.SIGUSR1, lambda s, f: sys.exit(0))\n"
        quits += "print('up', flush=True)\nwhile True: time.sleep(0.02)\n"
        portal.desired = [
            make_attempt("att-1", command=[PY, "-c", quits], checkpoint_dir=str(tmp_path / "ckpt" / "j"))
        ]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-1").get(0) == "up")
            await portal.send(CheckpointRequest(attempt_id="att-1", grace_period_s=10))
            await wait_for(lambda: portal.of_type(RequestReject))
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            final = portal.last_status("att-1")
            assert (final.exit_code, final.reason) == (0, ExitReason.STOPPED)
            assert not portal.of_type(CheckpointDone)


@pytest.mark.asyncio
async def test_gpu_processes_are_labelled_with_their_attempt(state_dir: Path) -> None:
    agent = make_agent("http://127.0.0.1:9", state_dir)  # never connects: only the labelling is used
    script = "import os, time\nprint(os.getpid(), flush=True)\nwhile True: time.sleep(0.02)\n"
    await agent.runtime.start(make_attempt("att-1", command=[PY, "-c", script]))
    stdout = state_dir / "process" / "att-1" / "stdout.log"
    await wait_for(lambda: stdout.read_text().strip() != "")
    job_pid = int(stdout.read_text())
    sample = GpuSample(
        gpu_uuid="GPU-x",
        time=datetime.now(UTC),
        processes=[
            GpuProcess(pid=job_pid, used_memory_mib=100),
            GpuProcess(pid=os.getpid(), used_memory_mib=5),
        ],
    )
    labelled = agent._attribute(sample)
    assert [process.attempt_id for process in labelled.processes] == ["att-1", None]


@pytest.mark.asyncio
async def test_checkpoint_and_stop_in_the_desired_set_preempts_without_a_request(
    state_dir: Path, tmp_path: Path
) -> None:
    """The level-triggered preemption: nothing is lost if a request would have been."""
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        job = make_attempt(
            "att-1", command=[PY, "-c", CHECKPOINTING_JOB], checkpoint_dir=str(tmp_path / "ckpt" / "j")
        )
        portal.desired = [job]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-1").get(0) == "resume=0")
            preempt = job.model_copy(update={"checkpoint_and_stop": True})
            await portal.set_desired([preempt])
            await portal.set_desired([preempt])  # repeated sets do not start a second checkpoint
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            final = portal.last_status("att-1")
            # The job exits by itself after saving, or the agent's stop (SIGTERM, 143) reaches it
            # first once the marker is there: which one wins is a race, both end checkpointed.
            assert final.reason == ExitReason.CHECKPOINTED and final.exit_code in (0, 143)
            (done,) = portal.of_type(CheckpointDone)
            assert done.request_id is None and done.size_bytes == 1000
            assert not portal.of_type(RequestAck) and not portal.of_type(RequestReject)


@pytest.mark.asyncio
async def test_an_attempt_cancelled_while_its_checkpoint_is_checked_never_starts(
    state_dir: Path, tmp_path: Path
) -> None:
    """A resume checks the checkpoint's files first, which takes a while for a large one; a
    cancel that comes meanwhile finds no process to stop, so the start must not make one."""
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        checked = asyncio.Event()
        release = asyncio.Event()

        async def slow_resume_check(attempt: DesiredAttempt) -> None:
            checked.set()
            await release.wait()

        agent._prepare_resume = slow_resume_check  # type: ignore[method-assign]
        marker = tmp_path / "started"
        command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close(); import time; time.sleep(60)"]
        portal.desired = [make_attempt("att-1", command=command)]
        async with running(agent):
            await asyncio.wait_for(checked.wait(), 20)
            await portal.set_desired([])  # the job was cancelled
            stopping = AttemptState.STOPPING
            await wait_for(lambda: getattr(portal.last_status("att-1"), "state", None) == stopping)
            release.set()
            await wait_for(lambda: (s := portal.last_status("att-1")) is not None and s.state.is_terminal)
            status = portal.last_status("att-1")
            assert (status.state, status.reason) == (AttemptState.EXITED, ExitReason.STOPPED)
            await asyncio.sleep(0.5)
            assert not marker.exists()  # the command never ran
            assert await agent.runtime.list_attempts() == []


@pytest.mark.asyncio
async def test_the_connected_file_exists_exactly_while_the_agent_is_connected(state_dir: Path) -> None:
    """docker-compose.yml's health check looks for it: one left by an agent that died while
    connected is removed at start, it appears with the welcome and goes with the connection."""
    marker = state_dir / "connected"
    state_dir.mkdir(parents=True)
    marker.touch()
    async with FakePortal() as portal:
        portal.refuse_all = True
        agent = make_agent(portal.url, state_dir)
        async with running(agent):
            await wait_for(lambda: portal.refused >= 2)
            assert not marker.exists()
            portal.refuse_all = False
            await wait_for(lambda: agent.connected)
            assert marker.exists()
            await portal.drop()
            portal.refuse_all = True
            await wait_for(lambda: portal.refused >= 3)
            assert not agent.connected and not marker.exists()


class LaggingReader(ProcessRuntime):
    """Reads a log a moment after asked to, as a busy host's log pump may."""

    async def logs(self, attempt_id, stream, from_seq=0):  # type: ignore[no-untyped-def,override]
        await asyncio.sleep(1.0)
        async for line in super().logs(attempt_id, stream, from_seq):
            yield line


@pytest.mark.asyncio
async def test_an_attempt_removed_at_once_after_its_end_still_delivers_its_last_lines(
    state_dir: Path,
) -> None:
    """The portal drops an ended attempt from the desired set as soon as it hears of the end;
    the lines the job printed last must not be lost with its log pump."""
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        agent.runtime = LaggingReader(state_dir, HostPolicy(checkpoint_roots=agent.config.checkpoint_roots))
        attempt = make_attempt(
            "att-1", command=[PY, "-c", "print('last words', flush=True)"], gpus=[gpu(agent, 0)]
        )
        portal.desired = [attempt]
        async with running(agent):
            await wait_for(
                lambda: (s := portal.last_status("att-1")) is not None and s.state == AttemptState.EXITED
            )
            await portal.set_desired([])
            await wait_for(lambda: agent.store.get("att-1") is None)
            await wait_for(lambda: portal.log_lines("att-1") == {0: "last words"}, 10)


class HeldReader(ProcessRuntime):
    """Reads one attempt's log only once the test lets it: a log pump still busy with an ended
    attempt's last output."""

    held_attempt = "att-1"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()

    async def logs(self, attempt_id, stream, from_seq=0):  # type: ignore[no-untyped-def,override]
        if attempt_id == self.held_attempt:
            await self.release.wait()
        async for line in super().logs(attempt_id, stream, from_seq):
            yield line


@pytest.mark.asyncio
async def test_a_removal_waiting_for_its_log_pump_does_not_hold_up_the_next_desired_set(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal of an ended attempt waits for its log pump; a start that comes meanwhile must
    not wait with it. The pump here reads only once the second attempt has started, and removal
    would wait 60 s for it: holding the desired sets, it lost the first attempt's last line."""
    monkeypatch.setattr("agents.agent.LOG_DRAIN_ON_REMOVE_S", 60.0)
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        reader = HeldReader(state_dir, HostPolicy(checkpoint_roots=agent.config.checkpoint_roots))
        agent.runtime = reader
        first = make_attempt(
            "att-1", command=[PY, "-c", "print('last words', flush=True)"], gpus=[gpu(agent, 0)]
        )
        second = make_attempt("att-2", command=[PY, "-c", "print('next', flush=True)"], gpus=[gpu(agent, 0)])
        portal.desired = [first]
        async with running(agent):
            await wait_for(
                lambda: (s := portal.last_status("att-1")) is not None and s.state == AttemptState.EXITED
            )
            reports = len(portal.statuses("att-1"))
            await portal.set_desired([])
            await wait_for(lambda: len(portal.statuses("att-1")) > reports)  # reported again, then removed
            await portal.set_desired([second])
            await wait_for(lambda: portal.log_lines("att-2") == {0: "next"}, 20)
            assert agent.store.get("att-1") is not None  # its removal still waits for the pump
            reader.release.set()
            await wait_for(lambda: portal.log_lines("att-1") == {0: "last words"}, 20)
            await wait_for(lambda: agent.store.get("att-1") is None)


class StopsRecorded(ProcessRuntime):
    """A process runtime that notes the grace of every stop it is asked for."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.stop_graces: list[tuple[str, float]] = []

    async def stop(self, attempt_id: str, grace_s: float) -> int | None:
        self.stop_graces.append((attempt_id, grace_s))
        return await super().stop(attempt_id, grace_s)


@pytest.mark.asyncio
async def test_a_stop_learnt_from_the_desired_set_takes_the_newest_sets_grace(state_dir: Path) -> None:
    """The portal records the grace a stop was asked with and says it in the desired set too, so
    that an agent which missed the request (its connection lost) gives the job that grace, not
    the one of the set the attempt started from."""
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        agent.runtime = StopsRecorded(state_dir, HostPolicy())
        started = make_attempt("att-1", command=[PY, "-c", FOREVER], grace_period_s=600)
        portal.desired = [started]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-1").get(0) == "up")
            await portal.set_desired([started.model_copy(update={"grace_period_s": 7.5})])
            await wait_for(lambda: agent.desired_grace.get("att-1") == 7.5)  # applied, not skipped
            await portal.set_desired([])
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            assert agent.runtime.stop_graces == [("att-1", 7.5)]
            assert portal.last_status("att-1").reason == ExitReason.STOPPED

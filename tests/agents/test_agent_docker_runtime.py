"""DockerRuntime: the container template (pure) and the lifecycle against a real Docker engine.

The engine (tests/docker_engine.py) is started for this module (``dockerd`` with no bridge and
no iptables, in a temporary data root) and stopped at teardown. The image is built locally from
the busybox-static binary; nothing is pulled. Containers run with network "none". Where the
engine cannot start, the engine tests are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import docker
import pytest
from agent_builders import collect_logs, docker_agent, eventually, make_attempt
from fake_portal import TOKEN, FakePortal, wait_for

from agents.agent import Agent
from agents.config import AgentConfig
from agents.devices.simulated import SimulatedBackend, load_description
from agents.protocol import (
    AttemptState,
    CheckpointDone,
    CheckpointRequest,
    ExitReason,
    GpuRef,
    Mount,
    RequestAck,
    RequestReject,
)
from agents.runtime import LogLine, RuntimeFailure
from agents.runtime.docker import (
    CHECKPOINT_TARGET,
    LABEL_ATTEMPT,
    LABEL_JOB,
    SAFE_CAPABILITIES,
    DockerRuntime,
    container_config,
    device_requests,
)
from agents.runtime.policy import HostPolicy, PolicyError, VolumeRoot, prepare
from agents.versions import MinimumVersions
from tests.docker_engine import IMAGE, engine

__all__ = ["engine"]  # the module's fixture: one engine for all its tests


# -- the template, without an engine ---------------------------------------------


def test_device_requests_name_exactly_the_allocated_uuids() -> None:
    (request,) = device_requests(["GPU-aaaa", "GPU-bbbb"])
    assert request["Driver"] == "nvidia"
    assert request["DeviceIDs"] == ["GPU-aaaa", "GPU-bbbb"]
    assert request["Capabilities"] == [["gpu"]]
    assert request["Count"] == 0  # never "all"
    assert device_requests([]) == []


def test_container_config_is_the_fixed_template(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    policy = HostPolicy(volume_roots=(VolumeRoot(data),), checkpoint_roots=(tmp_path / "ckpt",))
    attempt = make_attempt(
        gpus=[GpuRef(uuid="GPU-x", index=4)],
        mounts=[Mount(source=str(data), target="/data")],
        checkpoint_dir=str(tmp_path / "ckpt" / "job-1"),
    )
    config = container_config(prepare(attempt, policy, checkpoint_target=CHECKPOINT_TARGET))
    assert config["privileged"] is False
    assert config["cap_drop"] == ["ALL"] and config["cap_add"] == list(SAFE_CAPABILITIES)
    assert config["security_opt"] == ["no-new-privileges:true"]
    assert config["network_mode"] == "none" and config["ipc_mode"] == "private"
    assert "pid_mode" not in config
    assert config["device_requests"][0]["DeviceIDs"] == ["GPU-x"]
    assert config["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-x"
    assert config["environment"]["GPUPORTAL_CHECKPOINT_DIR"] == CHECKPOINT_TARGET
    assert (config["nano_cpus"], config["mem_limit"], config["pids_limit"]) == (10**9, 256 * 2**20, 128)
    assert [(m["Target"], m["ReadOnly"]) for m in config["mounts"]] == [
        ("/data", True),
        (CHECKPOINT_TARGET, False),
    ]
    for mode in ("host", "container:other"):
        with pytest.raises(ValueError, match="not allowed"):
            container_config(prepare(attempt, policy), network_mode=mode)


def test_an_attempt_without_gpus_sees_none() -> None:
    config = container_config(prepare(make_attempt(gpus=[]), HostPolicy()))
    assert config["device_requests"] == []
    assert config["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert config["environment"]["CUDA_VISIBLE_DEVICES"] == ""


# -- a real engine -------------------------------------------------------------------


@pytest.fixture
def policy(tmp_path: Path) -> HostPolicy:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "input.txt").write_text("dataset\n")
    return HostPolicy(volume_roots=(VolumeRoot(tmp_path / "data"),), checkpoint_roots=(tmp_path / "ckpt",))


def _attempt(attempt_id: str, script: str, **fields):
    return make_attempt(attempt_id, image=IMAGE, command=["sh", "-c", script], **fields)


@pytest.mark.asyncio
async def test_the_container_runs_with_the_template_applied(
    engine, policy: HostPolicy, tmp_path: Path
) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False)  # this engine has no NVIDIA runtime
    attempt = _attempt(
        "dk-template",
        "cat /data/input.txt; env | sort; touch /data/x 2>&1 || echo read-only; echo done >&2; exit 4",
        mounts=[Mount(source=str(tmp_path / "data"), target="/data")],
        checkpoint_dir=str(tmp_path / "ckpt" / "job-1"),
        env={"EPOCHS": "3"},
    )
    await runtime.start(attempt)
    assert await bounded(runtime.wait("dk-template")) == 4
    stdout = [text for _, text in await collect_logs(runtime, "dk-template", "stdout")]
    assert stdout[0] == "dataset"
    assert "GPUPORTAL_ATTEMPT_ID=dk-template" in stdout and "EPOCHS=3" in stdout
    assert f"GPUPORTAL_CHECKPOINT_DIR={CHECKPOINT_TARGET}" in stdout
    assert "NVIDIA_VISIBLE_DEVICES=GPU-sim-0" in stdout
    assert stdout[-1] == "read-only" or "Read-only file system" in stdout[-1]
    assert await collect_logs(runtime, "dk-template", "stderr") == [(0, "done")]

    inspected = engine.api.inspect_container("gpuportal-dk-template")
    host = inspected["HostConfig"]
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == sorted(SAFE_CAPABILITIES)
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["NetworkMode"] == "none" and host["PidMode"] == "" and host["IpcMode"] == "private"
    assert (host["NanoCpus"], host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (
        10**9,
        256 * 2**20,
        256 * 2**20,
        128,
    )
    mounts = {mount["Destination"]: mount["RW"] for mount in inspected["Mounts"]}
    assert mounts == {"/data": False, CHECKPOINT_TARGET: True}
    labels = inspected["Config"]["Labels"]
    assert (labels[LABEL_ATTEMPT], labels[LABEL_JOB]) == ("dk-template", "job-1")
    (observed,) = [item for item in await runtime.list_attempts() if item.attempt_id == "dk-template"]
    assert (observed.state, observed.exit_code, observed.gpu_uuids) == (
        AttemptState.EXITED,
        4,
        ("GPU-sim-0",),
    )
    await runtime.remove("dk-template")
    assert not [item for item in await runtime.list_attempts() if item.attempt_id == "dk-template"]


@pytest.mark.asyncio
async def test_policy_violations_create_no_container(engine, policy: HostPolicy) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    with pytest.raises(PolicyError, match="outside the volumes"):
        await runtime.start(_attempt("dk-bad", "true", mounts=[Mount(source="/var/run", target="/x")]))
    with pytest.raises(PolicyError, match="reserved"):
        await runtime.start(_attempt("dk-bad", "true", env={"LD_PRELOAD": "/x.so"}))
    data = str(policy.volume_roots[0].path)
    for target in ("//etc", "//sys", "//dev/shm"):  # the engine reads these as /etc, /sys, /dev/shm
        with pytest.raises(PolicyError, match="system directory"):
            await runtime.start(_attempt("dk-bad", "true", mounts=[Mount(source=data, target=target)]))
    assert not engine.containers.list(all=True, sparse=True, filters={"name": "gpuportal-dk-bad"})


@pytest.mark.asyncio
async def test_a_missing_command_is_a_start_failure(engine, policy: HostPolicy) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    with pytest.raises(RuntimeFailure, match="cannot start"):
        await runtime.start(make_attempt("dk-nocmd", image=IMAGE, command=["/no/such/binary"]))
    assert not engine.containers.list(all=True, sparse=True, filters={"name": "gpuportal-dk-nocmd"})


@pytest.mark.asyncio
async def test_pause_resume_stop_and_reattach(engine, policy: HostPolicy) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    # The shell is PID 1 in its container: it only reacts to signals it traps.
    script = "trap 'echo bye; exit 0' TERM; trap 'exit 3' USR1; echo ready; while true; do sleep 0.05; done"
    await runtime.start(_attempt("dk-life", script))

    async def state() -> AttemptState:
        (item,) = [item for item in await runtime.list_attempts() if item.attempt_id == "dk-life"]
        return item.state

    await eventually(lambda: _logs_start_with(runtime, "dk-life", "ready"))
    await runtime.suspend("dk-life")
    assert await state() == AttemptState.SUSPENDED
    await runtime.resume("dk-life")
    assert await state() == AttemptState.RUNNING
    await runtime.signal("dk-life", "SIGUSR1")
    assert await bounded(runtime.wait("dk-life")) == 3
    for operation in (runtime.signal("dk-life", "SIGUSR1"), runtime.suspend("dk-life")):
        with pytest.raises(RuntimeFailure, match="not running"):  # engine errors become runtime errors
            await operation

    # A new runtime instance (a restarted agent) finds a running container by its labels.
    await runtime.start(_attempt("dk-again", script))
    restarted = DockerRuntime(engine, policy, request_gpus=False)
    found = {item.attempt_id: item.state for item in await restarted.list_attempts()}
    assert found["dk-again"] in (AttemptState.STARTING, AttemptState.RUNNING)
    await eventually(lambda: _logs_start_with(restarted, "dk-again", "ready"))
    container_pid = engine.api.inspect_container("gpuportal-dk-again")["State"]["Pid"]
    assert restarted.attempt_of_pid(container_pid) == "dk-again"  # found through the cgroup
    assert restarted.attempt_of_pid(os.getpid()) is None
    await restarted.suspend("dk-again")
    assert (
        await bounded(restarted.stop("dk-again", grace_s=10)) == 0
    )  # unpaused, then SIGTERM handled by the trap
    assert await collect_logs(restarted, "dk-again", "stdout") == [(0, "ready"), (1, "bye")]


@pytest.mark.asyncio
async def test_stop_kills_a_container_that_ignores_sigterm(engine, policy: HostPolicy) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    await runtime.start(_attempt("dk-stubborn", "trap '' TERM; echo ready; while true; do sleep 0.05; done"))
    await eventually(lambda: _logs_start_with(runtime, "dk-stubborn", "ready"))
    assert await bounded(runtime.stop("dk-stubborn", grace_s=1)) == 137


@pytest.mark.asyncio
async def test_a_container_left_created_is_removed_instead_of_waited_for(engine, policy: HostPolicy) -> None:
    """An agent killed (or timed out) between create and start leaves a container in "created".
    It never runs, so a stop or a wait for it would never end, and the stop is awaited while
    the agent holds its reconcile lock: the node would stop applying desired sets."""
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    for attempt_id in ("dk-created-1", "dk-created-2"):
        plan = prepare(_attempt(attempt_id, "sleep 100"), policy, CHECKPOINT_TARGET)
        await asyncio.to_thread(engine.containers.create, **container_config(plan, request_gpus=False))
    observed = {item.attempt_id: item.state for item in await runtime.list_attempts()}
    assert observed["dk-created-1"] == observed["dk-created-2"] == AttemptState.VANISHED
    assert await bounded(runtime.stop("dk-created-1", grace_s=1)) is None
    assert await bounded(runtime.wait("dk-created-2")) is None
    assert not engine.containers.list(all=True, sparse=True, filters={"name": "gpuportal-dk-created"})


@pytest.mark.asyncio
async def test_an_unreachable_engine_is_a_runtime_failure(policy: HostPolicy, tmp_path: Path) -> None:
    """Transport errors (a refused socket, a timeout) are not APIErrors; the agent handles
    RuntimeFailure only, and any other error would leave the attempt starting for ever."""
    client = docker.DockerClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.43")
    runtime = DockerRuntime(client, policy, request_gpus=False)
    with pytest.raises(RuntimeFailure, match="cannot look up image"):
        await runtime.start(_attempt("dk-nowhere", "true"))
    for operation in (runtime.list_attempts(), runtime.stop("dk-nowhere", 1), runtime.wait("dk-nowhere")):
        with pytest.raises(RuntimeFailure, match="cannot reach the Docker engine"):
            await operation


@pytest.mark.asyncio
async def test_info_reports_engine_and_runc_versions(engine, policy: HostPolicy) -> None:
    info = await DockerRuntime(engine, policy).info()
    assert info.kind == "docker" and info.version and info.runc_version


async def bounded[T](awaitable: Awaitable[T]) -> T:
    """Fail instead of hanging when a container never ends (the bound is not a timing assertion)."""
    return await asyncio.wait_for(awaitable, timeout=60)


async def _logs_start_with(runtime: DockerRuntime, attempt_id: str, first: str) -> bool:
    stream = runtime.logs(attempt_id, "stdout")
    try:
        line = await anext(stream)
    except StopAsyncIteration:
        return False
    finally:
        await stream.aclose()
    return line.text == first


@pytest.mark.asyncio
async def test_the_agent_with_docker_reports_the_version_gate_and_runs_an_attempt(
    engine, policy: HostPolicy, tmp_path: Path
) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    async with FakePortal() as portal:
        config = AgentConfig(
            portal_url=f"{portal.url.replace('http', 'ws')}/ws/agent/",
            token=TOKEN,
            runtime="docker",
            simulate="dgx-a100",
            state_dir=tmp_path / "state",
            node_name="docker-node",
            monitor_interval_s=0.05,
            minimum_versions=MinimumVersions(docker="999.0", runc=None, nvidia_container_toolkit=None),
        )
        agent = Agent(config, SimulatedBackend(load_description("dgx-a100"), "docker-node"), runtime)
        portal.desired = [_attempt("dk-agent", "echo hi; echo oops >&2; exit 3")]
        task = asyncio.create_task(agent.run())
        try:
            await wait_for(lambda: (s := portal.last_status("dk-agent")) is not None and s.state.is_terminal)
            hello = portal.hellos[0]
            engine_version = engine.version()["Version"]
            assert hello.runtime.kind == "docker" and hello.runtime.version == engine_version
            assert hello.drain_reason == f"Docker Engine {engine_version} is older than the required 999.0"
            final = portal.last_status("dk-agent")
            assert (final.state, final.exit_code, final.reason) == (AttemptState.EXITED, 3, ExitReason.FAILED)
            await wait_for(lambda: portal.log_lines("dk-agent") == {0: "hi"})
            await wait_for(lambda: portal.log_lines("dk-agent", "stderr") == {0: "oops"})
            await portal.set_desired([])
            await wait_for(
                lambda: (
                    not engine.containers.list(all=True, sparse=True, filters={"name": "gpuportal-dk-agent"})
                )
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


CONTAINER_CHECKPOINT = (
    "save() { echo weights > $GPUPORTAL_CHECKPOINT_DIR/step-7;"
    ' echo \'{"step": 7, "path": "step-7"}\' > $GPUPORTAL_CHECKPOINT_DIR/.marker.tmp;'
    " mv $GPUPORTAL_CHECKPOINT_DIR/.marker.tmp $GPUPORTAL_CHECKPOINT_DIR/checkpoint.json; exit 0; };"
    " trap save USR1; echo resume=$GPUPORTAL_RESUME; while true; do sleep 0.05; done"
)


@pytest.mark.asyncio
async def test_a_container_checkpoints_through_the_agent(engine, policy: HostPolicy, tmp_path: Path) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    checkpoint_dir = tmp_path / "ckpt" / "job-9"
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        portal.desired = [
            _attempt("dk-ckpt", CONTAINER_CHECKPOINT, checkpoint_dir=str(checkpoint_dir), resume=True)
        ]
        task = asyncio.create_task(agent.run())
        try:
            await wait_for(lambda: portal.log_lines("dk-ckpt").get(0) == "resume=1")
            await wait_for(lambda: portal.last_status("dk-ckpt").state == AttemptState.RUNNING)
            request = CheckpointRequest(attempt_id="dk-ckpt", grace_period_s=20)
            await portal.send(request)
            await wait_for(lambda: portal.of_type(RequestAck) or portal.of_type(RequestReject))
            assert [ack.request_id for ack in portal.of_type(RequestAck)] == [request.id]
            (done,) = portal.of_type(CheckpointDone)
            assert (done.step, done.size_bytes, done.path) == (
                7,
                len("weights\n"),
                str(checkpoint_dir / "step-7"),
            )
            await wait_for(lambda: portal.last_status("dk-ckpt").state == AttemptState.EXITED)
            final = portal.last_status("dk-ckpt")
            # The job's own exit after saving races the agent's stop (SIGTERM, 143); both are fine.
            assert final.reason == ExitReason.CHECKPOINTED and final.exit_code in (0, 143)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# -- the cap on a container's log (--log-max-bytes) ------------------------------------


def test_the_container_log_is_rotated_within_the_cap() -> None:
    config = container_config(prepare(make_attempt(), HostPolicy()), log_max_bytes=64 * 1024)
    assert config["log_config"] == {"Type": "json-file", "Config": {"max-size": "65536", "max-file": "2"}}
    assert "log_config" not in container_config(prepare(make_attempt(), HostPolicy()), log_max_bytes=0)


LOG_CAP = 64 * 1024
# Numbered lines (about 3,000 of 50 bytes, some 300 KB of the engine's JSON, several times the
# cap) once /data/go exists, with a short pause every 20 lines so that the reader keeps up.
FLOOD_AFTER_GO = (
    "echo ready; while [ ! -e /data/go ]; do sleep 0.02; done; i=0; while [ $i -lt 3000 ]; do "
    "echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); "
    "[ $((i % 20)) = 0 ] && sleep 0.005; done; echo end"
)


def _numbers_in_order(lines: list[str]) -> list[int]:
    """The line numbers as they come, less those that go back: Docker engines before 23.0 read
    the end of the log file again when it is rotated under a follower (their follow code was
    rewritten since), so a few lines come twice at each rotation."""
    numbers: list[int] = []
    for text in lines:
        number = int(text.split("-")[1])
        if not numbers or number > numbers[-1]:
            numbers.append(number)
    return numbers


@pytest.mark.asyncio
async def test_a_container_that_writes_more_than_the_cap_keeps_its_log_files_within_it(
    engine, policy: HostPolicy, tmp_path: Path
) -> None:
    """The engine rotates the log: its files hold at most twice the cap (both streams in one log)
    and it drops the oldest output. The agent's reader follows the log across the rotations
    to the container's last line."""
    runtime = DockerRuntime(engine, policy, request_gpus=False, log_max_bytes=LOG_CAP)
    attempt = _attempt(
        "dk-logcap", FLOOD_AFTER_GO, mounts=[Mount(source=str(tmp_path / "data"), target="/data")]
    )
    await runtime.start(attempt)
    inspected = engine.api.inspect_container("gpuportal-dk-logcap")
    assert inspected["HostConfig"]["LogConfig"] == {
        "Type": "json-file",
        "Config": {"max-file": "2", "max-size": str(LOG_CAP)},
    }
    stream = runtime.logs("dk-logcap", "stdout")  # following from the first line, as the agent does
    assert (await anext(stream)).text == "ready"
    (tmp_path / "data" / "go").touch()
    followed = [line.text async for line in bounded_stream(stream)]
    assert followed[-1] == "end"
    assert _numbers_in_order(followed[:-1]) == list(range(3000))
    assert await bounded(runtime.wait("dk-logcap")) == 0

    # The engine's data root is this test's own: its files can be measured. Each may pass the size
    # by the one entry (about 110 bytes here) that the engine wrote before it looked.
    log_path = Path(inspected["LogPath"])
    files = sorted(log_path.parent.glob(f"{log_path.name}*"))
    assert [file.name for file in files] == [log_path.name, f"{log_path.name}.1"]
    assert all(file.stat().st_size <= LOG_CAP + 200 for file in files)
    # Reading the log again finds only the newest output: the first lines are gone.
    kept = [text for _, text in await collect_logs(runtime, "dk-logcap", "stdout")]
    assert kept[-1] == "end" and kept[0].startswith("line-") and _numbers_in_order(kept[:-1])[0] > 1000


@pytest.mark.asyncio
async def test_a_cap_of_0_leaves_the_log_to_the_engine(engine, policy: HostPolicy) -> None:
    runtime = DockerRuntime(engine, policy, request_gpus=False, log_max_bytes=0)
    await runtime.start(_attempt("dk-nocap", "echo hi"))
    assert await bounded(runtime.wait("dk-nocap")) == 0
    # This engine has no log options in its configuration: the container gets its default.
    log_config = engine.api.inspect_container("gpuportal-dk-nocap")["HostConfig"]["LogConfig"]
    assert log_config == {"Type": "json-file", "Config": {}}
    assert await collect_logs(runtime, "dk-nocap", "stdout") == [(0, "hi")]


async def bounded_stream(stream: AsyncIterator[LogLine]) -> AsyncIterator[LogLine]:
    """The lines of a log stream, failing instead of hanging when the stream never ends."""
    while True:
        try:
            yield await asyncio.wait_for(anext(stream), timeout=60)
        except StopAsyncIteration:
            return

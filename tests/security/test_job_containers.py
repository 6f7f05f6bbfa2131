"""Job containers on a real Docker engine (reliability-security.md S12 and S15).

The portal places jobs of two tenants on one node; the desired set it would send that node's
agent is started with the agent's Docker runtime, on a private engine (tests/docker_engine.py:
no bridge, no iptables, nothing pulled; containers get network "none"). What a job could see of
another job, of the host and of the portal is probed from inside the containers.

This machine has no GPU: what a container is given for its GPUs is checked as the device request
and variables the agent hands to Docker (what ``docker inspect`` shows); ``nvidia-smi`` inside a
container needs a GPU host and is skipped here with the reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from agents.protocol import DesiredAttempt, Resources
from agents.runtime.docker import CHECKPOINT_TARGET, DockerRuntime, container_config
from agents.runtime.policy import HostPolicy, VolumeRoot, prepare
from portal.agentgw.desired import desired_set_for
from portal.cluster.models import Node, VirtualCluster
from portal.jobs.models import Allocation
from scheduler.tasks import run_cycle
from tests.conftest import database_url_of_tests, wait_for
from tests.docker_engine import IMAGE, engine

__all__ = ["engine"]  # one engine for the module's tests

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "a100-node-1"


@pytest.fixture
def host(users: dict[str, Any], tmp_path: Path, settings: Any) -> HostPolicy:
    """The node's policy as its agent would run it: each tenant's data volume under the volume
    root, every job's checkpoint directory under the checkpoint root (CHECKPOINT_ROOT)."""
    volumes = tmp_path / "volumes"
    for tenant in ("vision", "speech"):
        (volumes / tenant).mkdir(parents=True)
        (volumes / tenant / f"{tenant}-dataset.txt").write_text(f"{tenant} data\n")
    settings.CHECKPOINT_ROOT = str(tmp_path / "checkpoints")
    for tenant in ("vision", "speech"):
        VirtualCluster.objects.filter(name=tenant).update(
            allowed_mounts=[{"name": f"{tenant}-data", "host_path": str(volumes / tenant), "writable": False}]
        )
    return HostPolicy(volume_roots=(VolumeRoot(volumes),), checkpoint_roots=(tmp_path / "checkpoints",))


@pytest.fixture
def one_ready_node(users: dict[str, Any], paused_loop: None) -> Node:
    """Only one node takes work, so every job the test submits lands on it."""
    Node.objects.update(state="not-ready")
    Node.objects.filter(name=NODE).update(state="ready")
    return Node.objects.get(name=NODE)


def place(api_for: Any, username: str, vc: str, script: str, acknowledged: set[int]) -> int:
    """Submits a 2-GPU job that mounts its VC's volume; returns the job id once it is placed."""
    spec = {
        "name": f"{username}-job",
        "vc": vc,
        "flavor": "s-A100",
        "image": IMAGE,
        "command": ["sh", "-c", script],
        "mounts": [{"name": f"{vc}-data", "path": "/data"}],
    }
    response = api_for(username).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    job_id = int(response.json()["id"])
    acknowledged.add(job_id)
    run_cycle()
    assert Allocation.objects.filter(attempt__job_id=job_id, released_at__isnull=True).count() == 2
    return job_id


def desired(node: Node, job_id: int) -> DesiredAttempt:
    """The job's attempt as the portal would send it to the node's agent. The flavor's 64 CPUs
    and 256 GB are cut to what this small machine has: Docker refuses a CPU limit above the host's."""
    (attempt,) = [a for a in desired_set_for(node).attempts if a.job_id == str(job_id)]
    return attempt.model_copy(update={"resources": Resources(cpus=1, memory_mib=256, pids=128)})


def run(awaitable: Any) -> Any:
    return asyncio.run(asyncio.wait_for(awaitable, timeout=120))


async def output(runtime: DockerRuntime, attempt_id: str) -> list[str]:
    """The attempt's stdout so far, as the agent streams it."""
    stream = runtime.logs(attempt_id, "stdout")
    lines = []
    try:
        while True:
            line = await asyncio.wait_for(anext(stream), timeout=1)
            lines.append(line.text)
    except (StopAsyncIteration, TimeoutError):
        pass
    finally:
        await stream.aclose()
    return lines


def container_pid(engine: Any, attempt_id: str) -> int:
    return int(engine.api.inspect_container(f"gpuportal-{attempt_id}")["State"]["Pid"])


def namespace(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def files_named(root: str, name: str) -> list[Path]:
    return list(Path(root).rglob(name))


VISION_JOB = (
    "echo vision-secret > /tmp/vision-scratch;"
    " echo weights > $GPUPORTAL_CHECKPOINT_DIR/vision-weights;"
    " echo ready; exec sleep 1001"
)
# Shell builtins only, so that the probe's own process list is just its shell (PID 1).
SPEECH_PROBE = (
    'echo -n pids:; for p in /proc/[0-9]*; do echo -n " ${p#/proc/}"; done; echo;'
    ' echo -n comms:; for p in /proc/[0-9]*; do read c < $p/comm; echo -n " $c"; done; echo;'
    " find / -name 'vision-*' 2>/dev/null;"
    " ls /data;"
    " echo visible: $NVIDIA_VISIBLE_DEVICES"
)


def test_two_tenants_on_one_node_see_nothing_of_each_other(  # type: ignore[no-untyped-def]
    engine, host, one_ready_node, api_for, invariants_checked
) -> None:
    """S12: a vision job runs and writes to its scratch, its checkpoint directory and (read-only,
    so it cannot) its volume; a speech job on the same node looks for any of it and for its
    processes. Separate pid, mount, ipc and network namespaces; no file, mount or process of the
    other job; only its own volume and its own 2 GPUs by uuid."""
    runtime = DockerRuntime(engine, host, request_gpus=False)  # the engine has no NVIDIA runtime
    vision_job = place(api_for, "alice", "vision", VISION_JOB, invariants_checked)
    speech_job = place(api_for, "carol", "speech", SPEECH_PROBE, invariants_checked)
    vision, speech = desired(one_ready_node, vision_job), desired(one_ready_node, speech_job)
    assert not {g.uuid for g in vision.gpus} & {g.uuid for g in speech.gpus}

    run(runtime.start(vision))
    wait_for(lambda: run(output(runtime, vision.attempt_id)) == ["ready"], 60, "the vision job to run")
    sleeper = container_pid(engine, vision.attempt_id)
    # Control: from the host, the vision job's process and files are there to be found.
    assert Path(f"/proc/{sleeper}/cmdline").read_bytes() == b"sleep\x001001\x00"
    assert files_named(engine.info()["DockerRootDir"], "vision-scratch")

    run(runtime.start(speech))
    assert run(runtime.wait(speech.attempt_id)) == 0
    # Alone in its pid namespace (no "sleep" of the vision job); no scratch file, checkpoint or
    # dataset of the vision job anywhere in its filesystem; its own volume; its own 2 GPUs.
    assert run(output(runtime, speech.attempt_id)) == [
        "pids: 1",
        "comms: sh",
        "speech-dataset.txt",
        "visible: " + ",".join(g.uuid for g in speech.gpus),
    ]

    vision_info = engine.api.inspect_container(f"gpuportal-{vision.attempt_id}")
    speech_info = engine.api.inspect_container(f"gpuportal-{speech.attempt_id}")
    for kind in ("pid", "mnt", "ipc", "net"):
        assert namespace(sleeper, kind) != namespace("self", kind), kind
    speech_mounts = {(m["Source"], m["Destination"], m["RW"]) for m in speech_info["Mounts"]}
    vision_sources = {m["Source"] for m in vision_info["Mounts"]}
    assert not vision_sources & {source for source, _, _ in speech_mounts}
    assert speech_mounts == {
        (str(Path(host.volume_roots[0].path) / "speech"), "/data", False),
        (speech.checkpoint_dir, CHECKPOINT_TARGET, True),
    }
    for info in (vision_info, speech_info):
        config = info["HostConfig"]
        assert (config["PidMode"], config["IpcMode"], config["NetworkMode"]) == ("", "private", "none")
        assert not config["Binds"] and not config["VolumesFrom"] and not config["Devices"]
    run(runtime.stop(vision.attempt_id, grace_s=1))


def test_scratch_is_wiped_between_jobs_on_a_node(  # type: ignore[no-untyped-def]
    engine, host, one_ready_node, api_for, invariants_checked
) -> None:
    """S12: a job's scratch is its container's writable layer (/tmp and everything outside its
    mounts). Once the attempt has ended and the agent forgets it (the container is removed), the
    file is gone from the engine's storage, and the next job on the node starts without it.
    Checkpoint directories and writable volumes are kept on purpose and are not scratch."""
    runtime = DockerRuntime(engine, host, request_gpus=False)
    first_job = place(
        api_for, "alice", "vision", "echo job-1 > /tmp/scratch-of-job-1; ls /tmp", invariants_checked
    )
    first = desired(one_ready_node, first_job)
    run(runtime.start(first))
    assert run(runtime.wait(first.attempt_id)) == 0
    assert run(output(runtime, first.attempt_id)) == ["scratch-of-job-1"]
    storage = engine.info()["DockerRootDir"]
    assert files_named(storage, "scratch-of-job-1")  # control: kept until the agent forgets it

    run(runtime.remove(first.attempt_id))  # what the agent does with an ended, undesired attempt
    assert not engine.containers.list(all=True, filters={"name": f"gpuportal-{first.attempt_id}"})
    assert not files_named(storage, "scratch-of-job-1")

    probe = "test -e /tmp/scratch-of-job-1 && echo present || echo absent; ls -A /tmp"
    second_job = place(api_for, "carol", "speech", probe, invariants_checked)
    second = desired(one_ready_node, second_job)
    run(runtime.start(second))
    assert run(runtime.wait(second.attempt_id)) == 0
    assert run(output(runtime, second.attempt_id)) == ["absent"]  # and /tmp is empty


def test_the_container_is_given_exactly_its_two_of_eight_gpus(  # type: ignore[no-untyped-def]
    engine, host, one_ready_node, api_for, invariants_checked
) -> None:
    """S12 without a GPU: for a job allocated 2 of the node's 8 GPUs, the container the agent
    creates (NVML mode: with GPU requests) asks the engine for exactly those 2 uuids through one
    NVIDIA device request (never a count, never "all"), and its variables name the same 2; no
    device node is passed and it is not privileged."""
    job_id = place(api_for, "alice", "vision", "true", invariants_checked)
    attempt = desired(one_ready_node, job_id)
    allocated = list(
        Allocation.objects.filter(attempt__job_id=job_id, released_at__isnull=True)
        .order_by("gpu__index")
        .values_list("gpu__uuid", flat=True)
    )
    assert len(allocated) == 2 and one_ready_node.gpus.count() == 8
    config = container_config(prepare(attempt, host, checkpoint_target=CHECKPOINT_TARGET), request_gpus=True)
    container = engine.containers.create(**config)  # created, not started: the engine has no NVIDIA runtime
    try:
        info = engine.api.inspect_container(container.id)
    finally:
        container.remove(force=True)
    (request,) = info["HostConfig"]["DeviceRequests"]
    assert request["Driver"] == "nvidia" and request["Capabilities"] == [["gpu"]]
    assert request["DeviceIDs"] == allocated and request["Count"] == 0
    env = dict(item.split("=", 1) for item in info["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == ",".join(allocated)
    assert not info["HostConfig"]["Devices"] and info["HostConfig"]["Privileged"] is False


def test_nvidia_smi_in_the_container_lists_exactly_its_gpus(engine, host) -> None:  # type: ignore[no-untyped-def]
    """S12 on a GPU host: a container given 2 GPUs by uuid lists exactly those 2 in nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip(
            "needs a real NVIDIA GPU, its driver and the NVIDIA Container Toolkit (no nvidia-smi here)"
        )
    query = ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"]
    listed = subprocess.run(
        query,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if len(listed) < 2:
        pytest.skip("needs a host with at least 2 GPUs")
    from agents.protocol import GpuRef
    from tests.agents.agent_builders import make_attempt

    runtime = DockerRuntime(engine, host, request_gpus=True)
    attempt = make_attempt(
        "gpu-probe",
        image=IMAGE,
        command=query,
        gpus=[GpuRef(uuid=uuid, index=i) for i, uuid in enumerate(listed[:2])],
    )
    run(runtime.start(attempt))
    assert run(runtime.wait("gpu-probe")) == 0
    assert sorted(run(output(runtime, "gpu-probe"))) == sorted(listed[:2])


# -- S15: what a job container can reach ------------------------------------------------


@pytest.fixture
def portal_web(django_db_setup: Any, tmp_path: Path) -> Iterator[Any]:
    """A real web process (uvicorn: the API, the agent websocket /ws/agent/ and the enrollment
    endpoint /agent/enroll/) on loopback, with a Redis of its own."""

    from tests.reliability.stack import PortalStack

    env = {
        **os.environ,
        "DATABASE_URL": database_url_of_tests(),
        "DEBUG": "true",
    }
    (tmp_path / "web").mkdir()
    stack = PortalStack(env, tmp_path / "web")
    stack.start("web")
    try:
        yield stack
    finally:
        stack.stop()


def probe_script(targets: dict[str, int], nc: str = "nc") -> str:
    """One line per target: `<name> open` when a TCP connection to 127.0.0.1:<port> is made."""
    lines = [
        f"{nc} -w 2 127.0.0.1 {port} </dev/null >/dev/null 2>&1 && echo {name} open || echo {name} closed"
        for name, port in targets.items()
    ]
    return "; ".join(lines)


def test_a_job_container_reaches_none_of_the_portals_services(  # type: ignore[no-untyped-def]
    engine, host, one_ready_node, api_for, invariants_checked, portal_web
) -> None:
    """S15: from inside a job container started as the agent starts it, PostgreSQL, both Redis
    servers (this run's and the web process's), the web process with the agent gateway and the
    enrollment endpoint, all listening on the host's loopback, are unreachable; the same probe
    from the host reaches each, and inside the container it reaches a listener of the job's own.
    Only loopback is tried; no Docker network is created."""
    from django.conf import settings

    targets = {
        "postgresql": int(settings.DATABASES["default"]["PORT"]),
        "redis": urlsplit(settings.REDIS_URL).port,
        "web-redis": urlsplit(portal_web.env["REDIS_URL"]).port,
        "web": portal_web.port,
    }
    # Control: every one of them answers the same probe from the host.
    host_probe = subprocess.run(
        ["/bin/busybox", "sh", "-c", probe_script(targets, nc="/bin/busybox nc")],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split("\n")
    assert [line for line in host_probe if line] == [f"{name} open" for name in targets]

    enroll = f"http://127.0.0.1:{portal_web.port}/agent/enroll/"
    script = (
        "nc -l -p 5999 >/dev/null & sleep 0.5; "
        + probe_script({**targets, "own-listener": 5999})
        + f"; wget -q -T 2 -O - {enroll} >/dev/null 2>&1 && echo enroll open || echo enroll closed"
        + "; echo interfaces: $(ls /sys/class/net)"
    )
    job_id = place(api_for, "alice", "vision", script, invariants_checked)
    attempt = desired(one_ready_node, job_id)
    runtime = DockerRuntime(engine, host, request_gpus=False)
    run(runtime.start(attempt))
    assert run(runtime.wait(attempt.attempt_id)) == 0
    lines = run(output(runtime, attempt.attempt_id))
    assert lines == [
        "postgresql closed",
        "redis closed",
        "web-redis closed",
        "web closed",
        "own-listener open",
        "enroll closed",
        "interfaces: lo",
    ]
    assert (
        engine.api.inspect_container(f"gpuportal-{attempt.attempt_id}")["HostConfig"]["NetworkMode"] == "none"
    )
    assert {network["Name"] for network in engine.api.networks()} <= {"none", "host"}

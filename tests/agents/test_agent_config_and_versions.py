"""Small pure parts: the portal URL, the version gate, backoff, host policy."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from agents.agent import Backoff
from agents.config import agent_url, is_loopback_url, parse_args
from agents.protocol import RuntimeInfo
from agents.runtime.policy import (
    HostPolicy,
    PolicyError,
    VolumeRoot,
    env_problems,
    image_problems,
    image_registry,
    resolve_checkpoint_dir,
    resolve_mount,
)
from agents.versions import MinimumVersions, drain_reasons, parse_version


@pytest.mark.parametrize(
    ("portal", "url"),
    [
        ("https://portal.example.org", "wss://portal.example.org/ws/agent/"),
        ("http://127.0.0.1:8000/", "ws://127.0.0.1:8000/ws/agent/"),
        ("wss://portal.example.org/ws/agent/", "wss://portal.example.org/ws/agent/"),
        ("https://example.org/gpu", "wss://example.org/gpu/ws/agent/"),
    ],
)
def test_agent_url(portal: str, url: str) -> None:
    assert agent_url(portal) == url


@pytest.mark.parametrize("portal", ["ftp://x", "portal.example.org", "https://"])
def test_agent_url_refuses_nonsense(portal: str) -> None:
    with pytest.raises(ValueError):
        agent_url(portal)


def test_loopback_detection() -> None:
    assert is_loopback_url("ws://127.0.0.1:1/ws/agent/") and is_loopback_url("ws://localhost/ws/agent/")
    assert not is_loopback_url("ws://portal.example.org/ws/agent/")


def test_parse_args(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    arguments = ["--portal", "http://127.0.0.1:8000", "--token-file", str(token), "--runtime", "process"]
    arguments += ["--simulate", "dgx1-v100", "--state-dir", str(tmp_path / "s"), "--telemetry-interval", "2"]
    arguments += ["--volume-root", "/srv/data", "--volume-root", "/srv/scratch:rw"]
    config = parse_args(arguments)
    assert config.token == "secret" and config.runtime == "process" and config.simulate == "dgx1-v100"
    assert config.portal_url == "ws://127.0.0.1:8000/ws/agent/"
    assert config.telemetry_interval_s == 2 and config.heartbeat_interval_s == 10
    assert [(str(root.path), root.writable) for root in config.volume_roots] == [
        ("/srv/data", False),
        ("/srv/scratch", True),
    ]
    assert config.checkpoint_roots == (tmp_path / "s" / "checkpoints",)


@pytest.mark.parametrize(
    "extra", [["--telemetry-interval", "0.5"], ["--network-mode", "host"]], ids=["too-fast", "host-network"]
)
def test_parse_args_refuses(tmp_path: Path, extra: list[str]) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    with pytest.raises(SystemExit):
        parse_args(["--portal", "http://127.0.0.1", "--token-file", str(token), *extra])


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("20.10.24+dfsg1", (20, 10, 24)),
        ("1.1.5+ds1", (1, 1, 5)),
        ("v1.17", (1, 17, 0)),
        ("", None),
        ("dev", None),
    ],
)
def test_parse_version(text: str, version) -> None:
    assert parse_version(text) == version


def test_version_gate() -> None:
    minimums = MinimumVersions()
    current = RuntimeInfo(
        kind="docker", version="27.3.1", runc_version="1.1.14", nvidia_container_toolkit_version="1.17.8"
    )
    assert drain_reasons(current, minimums, check_toolkit=True) == []
    old = RuntimeInfo(
        kind="docker", version="24.0.5", runc_version="1.1.7", nvidia_container_toolkit_version="1.16.1"
    )
    reasons = drain_reasons(old, minimums, check_toolkit=True)
    assert reasons == [
        "Docker Engine 24.0.5 is older than the required 25.0.2",
        "runc 1.1.7 is older than the required 1.1.12",
        "NVIDIA Container Toolkit 1.16.1 is older than the required 1.17.8",
    ]
    unknown_toolkit = current.model_copy(update={"nvidia_container_toolkit_version": None})
    assert drain_reasons(unknown_toolkit, minimums, check_toolkit=True) == [
        "NVIDIA Container Toolkit version is unknown; 1.17.8 or newer is required"
    ]
    assert drain_reasons(unknown_toolkit, minimums, check_toolkit=False) == []
    assert drain_reasons(RuntimeInfo(kind="process"), minimums, check_toolkit=True) == []
    lowered = MinimumVersions(docker=None, runc="1.1.5", nvidia_container_toolkit=None)
    assert drain_reasons(old, lowered, check_toolkit=True) == []


def test_backoff_grows_with_jitter_up_to_the_maximum_and_resets() -> None:
    backoff = Backoff(initial_s=1, maximum_s=8, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(6)]
    for delay, ceiling in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next_delay() <= 1


@pytest.mark.parametrize(
    ("env", "problems"),
    [
        ({"EPOCHS": "3", "LD": "x", "MY_NVIDIA_TOKEN": "x"}, 0),
        ({"LD_PRELOAD": "x", "ld_library_path": "x", "NVIDIA_DRIVER_CAPABILITIES": "all"}, 3),
        ({"CUDA_VISIBLE_DEVICES": "0", "GPUPORTAL_JOB_ID": "other"}, 2),
    ],
)
def test_reserved_environment(env: dict[str, str], problems: int) -> None:
    assert len(env_problems(env)) == problems


def test_mounts_stay_inside_allowed_roots(tmp_path: Path) -> None:
    data, scratch, agent_state = tmp_path / "data", tmp_path / "scratch", tmp_path / "data" / "agent"
    for directory in (data / "set", scratch, agent_state):
        directory.mkdir(parents=True)
    (data / "escape").symlink_to("/etc")
    policy = HostPolicy(
        volume_roots=(VolumeRoot(data), VolumeRoot(scratch, writable=True)), forbidden_sources=(agent_state,)
    )
    assert resolve_mount(str(data / "set"), "/data", True, policy).source == data / "set"
    assert not resolve_mount(str(scratch), "/scratch", False, policy).read_only
    refused = [
        (str(data / "set"), "/data", False, "read-only"),
        (str(data / "escape"), "/data", True, "outside the volumes"),
        (str(data / "set" / ".." / ".." / "other"), "/data", True, "outside the volumes"),
        ("/var/run/docker.sock", "/sock", True, "outside the volumes"),
        ("relative/path", "/data", True, "not an absolute path"),
        (str(agent_state), "/x", True, "directory of the agent"),
        (str(data / "set"), "/etc/passwd", True, "system directory"),
        (str(data / "set"), "/", True, "system directory"),
        (str(data / "set"), "/proc/1", True, "system directory"),
        (str(data / "set"), "data", True, "clean absolute path"),
        (str(data / "set"), "/a/../etc", True, "'..'"),
    ]
    for source, target, read_only, message in refused:
        with pytest.raises(PolicyError, match=message):
            resolve_mount(source, target, read_only, policy)
    assert os.path.realpath(data / "escape") == "/etc"


@pytest.mark.parametrize(
    "target", ["//proc", "//dev/x", "//etc", "///sys", "//usr/lib", "/./etc", "/.//proc/1", "//"]
)
def test_mount_targets_are_checked_as_the_engine_reads_them(tmp_path: Path, target: str) -> None:
    """Docker reads ``//etc`` as ``/etc``; PurePosixPath keeps the leading ``//``, so such a
    target slipped past the check and a job could mount over the container's /etc, /sys or /dev."""
    policy = HostPolicy(volume_roots=(VolumeRoot(tmp_path),))
    with pytest.raises(PolicyError, match="system directory"):
        resolve_mount(str(tmp_path), target, True, policy)


def test_clean_mount_targets_are_normalized(tmp_path: Path) -> None:
    policy = HostPolicy(volume_roots=(VolumeRoot(tmp_path),))
    for target, normalized in (
        ("//data", "/data"),
        ("/data//set/./x/", "/data/set/x"),
        ("/etcetera", "/etcetera"),
    ):
        assert resolve_mount(str(tmp_path), target, True, policy).target == normalized


def test_the_most_specific_volume_root_decides_and_checkpoints_stay_below_their_root(tmp_path: Path) -> None:
    shared, scratch = tmp_path / "shared", tmp_path / "shared" / "scratch"
    scratch.mkdir(parents=True)
    policy = HostPolicy(
        volume_roots=(VolumeRoot(shared), VolumeRoot(scratch, writable=True)),
        checkpoint_roots=(tmp_path / "ckpt",),
    )
    assert not resolve_mount(str(scratch), "/scratch", False, policy).read_only
    with pytest.raises(PolicyError, match="read-only"):
        resolve_mount(str(shared), "/shared", False, policy)
    assert resolve_checkpoint_dir(str(tmp_path / "ckpt" / "job-1"), policy) == tmp_path / "ckpt" / "job-1"
    for outside in (tmp_path / "ckpt", tmp_path / "ckpt" / ".." / "elsewhere"):
        with pytest.raises(PolicyError, match="not inside a checkpoint root"):
            resolve_checkpoint_dir(str(outside), policy)


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "ubuntu:22.04",
        "registry.example.org:5000/team/train:1.4",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "gpuportal-test/busybox:1",
        "library/ubuntu@sha256:" + "a" * 64,
    ],
)
def test_plain_image_references_pass(image: str) -> None:
    assert image_problems(image) == []


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu; rm -rf /",
        "--privileged",
        "$(id)",
        "Ubuntu",
        "a" * 300,
        "ubuntu@sha256:bad",
        "",
        "../etc:1",
        "a b",
    ],
)
def test_bad_image_references_are_refused(image: str) -> None:
    assert image_problems(image)


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("ubuntu", "docker.io"),
        ("library/ubuntu:22.04", "docker.io"),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io"),
        ("registry.example.org:5000/team/train:1.4", "registry.example.org:5000"),
        ("localhost/train", "localhost"),
    ],
)
def test_the_registry_of_an_image_is_read_as_docker_reads_it(image: str, registry: str) -> None:
    assert image_registry(image) == registry
    assert image_problems(image, (registry,)) == []
    refused = image_problems(image, ("registry.internal",))
    assert refused == [f"registry {registry} is not allowed here (allowed: registry.internal)"]


def test_the_agent_refuses_an_image_from_a_registry_it_does_not_allow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The agent checks again, whatever the portal let through (a spec written to the database
    directly, or a portal with a longer list): the start fails before Docker is asked."""
    import asyncio

    from agents.protocol import DesiredAttempt, Resources
    from agents.runtime.docker import DockerRuntime

    class NoEngine:
        def __getattr__(self, name: str) -> None:
            raise AssertionError(f"Docker was asked for {name}")

    runtime = DockerRuntime(NoEngine(), HostPolicy(allowed_registries=("registry.internal",)))
    resources = Resources(cpus=1, memory_mib=1024)
    attempt = DesiredAttempt(
        attempt_id="1.0", job_id="1", image="evil.example/miner:1", command=["run"], resources=resources
    )
    with pytest.raises(PolicyError, match=r"registry evil\.example is not allowed"):
        asyncio.run(runtime.start(attempt))


def test_the_agent_can_log_json_lines_with_its_context() -> None:
    import json
    import logging

    from agents.logs import JsonFormatter

    record = logging.LogRecord("agents", logging.WARNING, __file__, 1, "attempt %s vanished", ("7.0",), None)
    record.attempt_id = "7.0"
    entry = json.loads(JsonFormatter().format(record))
    assert (entry["message"], entry["level"], entry["attempt_id"]) == (
        "attempt 7.0 vanished",
        "WARNING",
        "7.0",
    )

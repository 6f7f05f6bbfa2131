"""Image pulls before a container is created: the pull policy, progress in the attempt's status,
registry credentials, clear failures, shared pulls, more tries while the registry is briefly away,
the end of a pull by a stop, a cancel or the time limit, and a suspend or a checkpoint asked for
during a pull.

The engine tests use the private engine of tests/docker_engine.py and a read-only registry on
127.0.0.1 (tests/registry.py). Each test builds an image with a random payload (so that no layer
is shared with another test's), exports it with ``docker save``, serves it from its registry and
removes it from the engine: only a pull can bring it back. Nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import json
import logging
import os
import re
import socket
import tarfile
import time
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
from agent_builders import collect_logs, docker_agent, eventually, make_attempt
from fake_portal import FakePortal, wait_for

from agents.agent import Agent
from agents.config import parse_args
from agents.protocol import AttemptState, CheckpointDone, DesiredAttempt, ExitReason
from agents.runtime import RuntimeFailure
from agents.runtime.docker import (
    DockerRuntime,
    ImagePullError,
    PullProgress,
    RegistryAuth,
    canonical_image,
    read_registry_auth,
    registry_host,
    transient_pull_problem,
)
from agents.runtime.policy import HostPolicy
from tests.docker_engine import BUSYBOX, engine
from tests.registry import Registry

__all__ = ["engine"]  # the module's fixture: one engine for all its tests

MIB = 1024 * 1024
PULLED_TEXT = "pulled from the registry"
SLOW = 64 * 1024  # bytes per second: a pull of a few MiB then takes over a minute
UNAVAILABLE = HTTPStatus.SERVICE_UNAVAILABLE
# The engine asks /v2/, then HEAD and GET of the manifest; it passes over a 503 for the first
# two by itself, so three of them fail one pull.
FAILED_PULL = [UNAVAILABLE] * 3
ANSWERED = "registry answered"


# -- without an engine --------------------------------------------------------------------


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _auth_file(auth: str) -> str:
    return json.dumps({"auths": {"r.example.org": {"auth": auth}}})


def test_registry_credentials_are_read_by_host(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text(
        json.dumps(
            {
                "auths": {
                    "registry.example.org": {"auth": _auth("ml", "pass:with:colons")},
                    "https://index.docker.io/v1/": {"username": "hub", "password": "hub-secret"},
                    "http://127.0.0.1:5000": {"auth": _auth("local", "x")},
                }
            }
        )
    )
    credentials = read_registry_auth(path)
    assert credentials == {
        "registry.example.org": RegistryAuth("ml", "pass:with:colons"),
        "docker.io": RegistryAuth("hub", "hub-secret"),
        "127.0.0.1:5000": RegistryAuth("local", "x"),
    }
    assert "hub-secret" not in repr(credentials)
    assert registry_host("Registry.Example.Org:443") == "registry.example.org:443"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not json", "cannot read registry credentials"),
        ('{"credsStore": "desktop"}', 'no "auths" object'),
        ('{"auths": {"r.example.org": {}}}', "neither"),
        ('{"auths": {"r.example.org": {"auth": "%%%"}}}', "not base64 of user:password"),
        (_auth_file(_auth("", "secret-1")), "not base64"),
        (_auth_file(base64.b64encode(b"secret-2").decode()), "not base64"),
    ],
)
def test_bad_registry_credentials_are_refused_without_showing_them(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "auth.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=problem) as raised:
        read_registry_auth(path)
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("error", "transient"),
    [  # as the engine words them (see the engine tests below)
        ("received unexpected HTTP status: 503 Service Unavailable", f"{ANSWERED} 503 Service Unavailable"),
        ("received unexpected HTTP status: 502 Bad Gateway", f"{ANSWERED} 502 Bad Gateway"),
        ("toomanyrequests: You have reached your pull rate limit.", f"{ANSWERED} 429 Too Many Requests"),
        (
            'Get "http://127.0.0.1:5000/v2/": dial tcp 127.0.0.1:5000: connect: connection refused',
            "registry unreachable (connection refused)",
        ),
        ('Get "http://127.0.0.1:5000/v2/": EOF', "registry unreachable (connection closed)"),
        ("unexpected EOF", "registry unreachable (connection closed)"),
        (
            "read tcp 10.0.0.2:4242->10.0.0.9:443: read: connection reset by peer",
            "registry unreachable (connection reset)",
        ),
        (
            'Get "https://r.example.org/v2/": net/http: TLS handshake timeout',
            "registry unreachable (timed out)",
        ),
        (
            'Get "https://r.example.org/v2/": dial tcp: lookup r.example.org on 10.0.0.1:53: no such host',
            "registry unreachable (name not resolved)",
        ),
        (
            'Get "https://r.example.org/v2/": dial tcp: lookup r.example.org: '
            "Temporary failure in name resolution",
            "registry unreachable (name not resolved)",
        ),
        (
            'Get "https://r.example.org/v2/": dial tcp: lookup r.example.org on 10.0.0.1:53: '
            "server misbehaving",
            "registry unreachable (name not resolved)",
        ),
        (
            'Get "https://r.example.org/v2/": dial tcp: lookup r.example.org on 10.0.0.1:53: read udp '
            "10.0.0.2:40000->10.0.0.1:53: i/o timeout",
            "registry unreachable (timed out)",
        ),
        (
            'Get "https://r.example.org/v2/": dial tcp 10.0.0.9:443: connect: network is unreachable',
            "registry unreachable (network unreachable)",
        ),
        (
            'Get "https://r.example.org/v2/": dial tcp 10.0.0.9:443: connect: no route to host',
            "registry unreachable (network unreachable)",
        ),
        ("manifest unknown", None),
        ("manifest for r.example.org/ml/x:2 not found: manifest unknown: manifest unknown", None),
        ("unauthorized: authentication required", None),
        ("no basic auth credentials", None),
        ("pull access denied for ml/x, repository does not exist or may require 'docker login'", None),
        ("invalid reference format: repository name must be lowercase", None),
        ("something the agent has never seen", None),
    ],
)
def test_only_pull_errors_that_may_pass_are_tried_again(error: str, transient: str | None) -> None:
    assert transient_pull_problem(error) == transient


def test_the_pull_options(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"auths": {"registry.example.org": {"auth": _auth("ml", "hunter2")}}}))
    base = ["--portal", "http://127.0.0.1", "--token-file", str(token)]

    defaults = parse_args(base)
    assert (defaults.pull_policy, defaults.pull_timeout_s, defaults.registry_auth) == ("missing", 1800.0, {})
    config = parse_args([*base, "--pull", "always", "--pull-timeout", "90", "--registry-auth", str(auth)])
    assert (config.pull_policy, config.pull_timeout_s) == ("always", 90.0)
    assert config.registry_auth == {"registry.example.org": RegistryAuth("ml", "hunter2")}
    assert "hunter2" not in repr(config)
    for extra in (
        ["--pull", "sometimes"],
        ["--pull-timeout", "0"],
        ["--registry-auth", str(tmp_path / "none")],
    ):
        with pytest.raises(SystemExit):
            parse_args([*base, *extra])


def test_progress_counts_the_bytes_of_the_layers_being_downloaded() -> None:
    progress = PullProgress("registry.example.org/ml/pytorch:24.10")
    assert progress.message() == "pulling registry.example.org/ml/pytorch:24.10"
    for event in (
        {"status": "Pulling from ml/pytorch", "id": "24.10"},
        {"status": "Already exists", "progressDetail": {}, "id": "aaa"},
        {"status": "Downloading", "progressDetail": {"current": 100 * MIB, "total": 700 * MIB}, "id": "bbb"},
        {"status": "Downloading", "progressDetail": {"current": 212 * MIB, "total": 324 * MIB}, "id": "ccc"},
        {"status": "Download complete", "progressDetail": {}, "id": "ddd"},  # never reported a size
    ):
        progress.feed(event)
    assert progress.message() == "pulling registry.example.org/ml/pytorch:24.10: 312 of 1,024 MiB"
    progress.feed({"status": "Download complete", "progressDetail": {}, "id": "bbb"})
    assert progress.message().endswith(": 912 of 1,024 MiB")


def test_canonical_image_references() -> None:
    assert canonical_image("busybox") == "busybox:latest"
    assert canonical_image("127.0.0.1:5000/ml/x") == "127.0.0.1:5000/ml/x:latest"
    assert canonical_image("r.example.org/ml/x:2") == "r.example.org/ml/x:2"
    digest = "sha256:" + "a" * 64
    assert canonical_image(f"r.example.org/ml/x@{digest}") == f"r.example.org/ml/x@{digest}"


# -- a real engine and a registry on 127.0.0.1 -------------------------------------------------------


@pytest.fixture
def registry() -> Iterator[Registry]:
    with Registry() as serving:
        yield serving


@pytest.fixture
def policy(tmp_path: Path) -> HostPolicy:
    return HostPolicy(checkpoint_roots=(tmp_path / "ckpt",))


def serve_image(
    engine, registry: Registry, name: str = "ml/pulled", tag: str = "1", payload_mib: int = 4
) -> str:
    """Build an image, serve it from the registry as name:tag and remove it from the engine; its
    reference in the registry. The payload is random: no other image shares its layer."""
    source = f"gpuportal-test/pull-source:{os.urandom(4).hex()}"
    repository, source_tag = source.split(":")
    engine.api.import_image_from_data(
        _rootfs(os.urandom(payload_mib * MIB)), repository=repository, tag=source_tag
    )
    archive = b"".join(engine.images.get(source).save())
    engine.images.remove(source, force=True)
    registry.add(name, tag, archive)
    image = f"{registry.host}/{name}:{tag}"
    assert not engine.images.list(name=f"{registry.host}/{name}")
    return image


def _rootfs(payload: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(BUSYBOX, arcname="bin/busybox")
        for applet in ("sh", "cat", "sleep", "mv"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            archive.addfile(link)
        for path, data in (("pulled.txt", f"{PULLED_TEXT}\n".encode()), ("payload", payload)):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Progress:
    """Collects what the runtime reports, with the time it came."""

    def __init__(self) -> None:
        self.reports: list[tuple[float, str, str]] = []

    def __call__(self, attempt_id: str, message: str) -> None:
        self.reports.append((time.monotonic(), attempt_id, message))

    def of(self, attempt_id: str) -> list[str]:
        return [message for _, attempt, message in self.reports if attempt == attempt_id]


def _attempt(attempt_id: str, image: str, script: str = "cat /pulled.txt") -> DesiredAttempt:
    return make_attempt(attempt_id, image=image, command=["sh", "-c", script])


def _no_container(engine, attempt_id: str) -> bool:
    return not engine.containers.list(all=True, sparse=True, filters={"name": f"gpuportal-{attempt_id}"})


def _has_image(engine, image: str) -> bool:
    return any(image in found.tags for found in engine.images.list())


async def bounded[T](awaitable) -> T:
    """Fail instead of hanging (the bound is not a timing assertion)."""
    return await asyncio.wait_for(awaitable, timeout=60)


@pytest.mark.asyncio
async def test_an_absent_image_is_pulled_with_progress_and_the_job_runs_from_it(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = 2 * MIB  # about three seconds: a few progress reports
    progress = Progress()
    runtime = DockerRuntime(engine, policy, request_gpus=False, progress=progress)
    await bounded(runtime.start(_attempt("pl-fresh", image)))
    assert await bounded(runtime.wait("pl-fresh")) == 0
    assert await collect_logs(runtime, "pl-fresh", "stdout") == [(0, PULLED_TEXT)]
    assert registry.manifest_requests("ml/pulled", "1") == 1

    messages = progress.of("pl-fresh")
    assert messages[0] == f"pulling {image}"
    sized = [m for m in messages if re.fullmatch(rf"pulling {re.escape(image)}: \d+ of \d+ MiB", m)]
    assert sized, messages
    # About once a second (the engine itself sends several updates a second).
    elapsed = progress.reports[-1][0] - progress.reports[0][0]
    assert 2 <= len(messages) <= elapsed + 2, (elapsed, messages)


@pytest.mark.asyncio
async def test_pull_policy_never_refuses_an_absent_image_clearly(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    runtime = DockerRuntime(engine, policy, request_gpus=False, pull_policy="never")
    with pytest.raises(
        ImagePullError, match=f"image {re.escape(image)} is not on this node.*pull policy is never"
    ):
        await bounded(runtime.start(_attempt("pl-never", image)))
    assert registry.requests == []
    assert _no_container(engine, "pl-never")


@pytest.mark.asyncio
async def test_pull_policy_always_pulls_a_present_image_and_missing_does_not(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    missing = DockerRuntime(engine, policy, request_gpus=False)
    always = DockerRuntime(engine, policy, request_gpus=False, pull_policy="always")
    never = DockerRuntime(engine, policy, request_gpus=False, pull_policy="never")

    await bounded(missing.start(_attempt("pl-first", image)))
    assert registry.manifest_requests("ml/pulled", "1") == 1
    await bounded(missing.start(_attempt("pl-present", image)))
    await bounded(never.start(_attempt("pl-never-present", image)))
    assert registry.manifest_requests("ml/pulled", "1") == 1
    blobs = registry.blob_requests("ml/pulled")
    await bounded(always.start(_attempt("pl-always", image)))
    assert registry.manifest_requests("ml/pulled", "1") == 2
    assert registry.blob_requests("ml/pulled") == blobs  # the engine had the layers already
    for attempt_id in ("pl-first", "pl-present", "pl-never-present", "pl-always"):
        assert await bounded(missing.wait(attempt_id)) == 0


@pytest.mark.asyncio
async def test_a_missing_tag_and_an_unreachable_registry_fail_the_start_clearly(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    missing_tag = image.replace(":1", ":no-such-tag")
    with pytest.raises(ImagePullError, match=f"cannot pull {re.escape(missing_tag)}: .*manifest unknown"):
        await bounded(runtime.start(_attempt("pl-notag", missing_tag)))
    assert _no_container(engine, "pl-notag")

    assert registry.pings() == 1  # not tried again

    with socket.socket() as unused:  # a port on loopback that nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    unreachable = f"127.0.0.1:{port}/ml/pulled:1"
    briefly = DockerRuntime(engine, policy, request_gpus=False, pull_timeout_s=3)
    with pytest.raises(
        ImagePullError,
        match=f"cannot pull {re.escape(unreachable)}: .*connection refused .tried 2 times within the pull "
        "timeout of 3 s.$",
    ):
        await bounded(briefly.start(_attempt("pl-unreachable", unreachable)))
    assert _no_container(engine, "pl-unreachable")


@pytest.mark.asyncio
async def test_a_registry_name_that_does_not_resolve_is_tried_again_within_the_limit(
    engine, policy: HostPolicy
) -> None:
    """A failed name lookup may pass (a name server away for a moment), so it is tried again like
    a refused connection. The registry's name has a label longer than DNS allows, under the
    reserved .invalid domain: the engine's resolver refuses it without asking any name server."""
    image = f"{'n' * 64}.invalid/ml/pulled:1"
    progress = Progress()
    runtime = DockerRuntime(engine, policy, request_gpus=False, pull_timeout_s=3, progress=progress)
    began = time.monotonic()
    with pytest.raises(
        ImagePullError,
        match=f"cannot pull {re.escape(image)}: .*lookup .*no such host "
        r"\(tried 2 times within the pull timeout of 3 s\)$",
    ):
        await bounded(runtime.start(_attempt("pl-no-such-host", image)))
    assert time.monotonic() - began < 3  # tries at 0 and 2 s: a third would come after the limit
    assert progress.of("pl-no-such-host") == [
        f"pulling {image}",
        f"pulling {image}: registry unreachable (name not resolved), trying again in 2 s",
        f"pulling {image} (try 2)",
    ]
    assert _no_container(engine, "pl-no-such-host")


@pytest.mark.asyncio
async def test_registry_credentials_are_sent_and_wrong_ones_fail_clearly(
    engine, policy: HostPolicy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with Registry(credentials=("puller", "right-secret")) as registry:
        image = serve_image(engine, registry)
        auth_file = tmp_path / "auth.json"
        auth_file.write_text(
            json.dumps({"auths": {f"http://{registry.host}": {"auth": _auth("puller", "wrong-secret")}}})
        )
        wrong = DockerRuntime(engine, policy, request_gpus=False, registry_auth=read_registry_auth(auth_file))
        with pytest.raises(ImagePullError, match=f"cannot pull {re.escape(image)}: .*unauthorized"):
            await bounded(wrong.start(_attempt("pl-wrong", image)))
        none = DockerRuntime(engine, policy, request_gpus=False)
        with pytest.raises(
            ImagePullError, match=f"cannot pull {re.escape(image)}: .*no basic auth credentials"
        ):
            await bounded(none.start(_attempt("pl-none", image)))
        assert _no_container(engine, "pl-wrong") and _no_container(engine, "pl-none")

        auth_file.write_text(
            json.dumps({"auths": {registry.host: {"username": "puller", "password": "right-secret"}}})
        )
        right = DockerRuntime(engine, policy, request_gpus=False, registry_auth=read_registry_auth(auth_file))
        await bounded(right.start(_attempt("pl-right", image)))
        assert await bounded(right.wait("pl-right")) == 0
    assert "secret" not in caplog.text


@pytest.mark.asyncio
async def test_attempts_that_need_the_same_image_at_once_share_one_pull(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = 4 * MIB
    progress = Progress()
    runtime = DockerRuntime(engine, policy, request_gpus=False, progress=progress)
    attempts = [_attempt(f"pl-shared-{n}", image) for n in range(3)]
    await bounded(asyncio.gather(*(runtime.start(attempt) for attempt in attempts)))
    assert registry.manifest_requests("ml/pulled", "1") == 1
    for attempt in attempts:
        assert progress.of(attempt.attempt_id)[0] == f"pulling {image}"
        assert await bounded(runtime.wait(attempt.attempt_id)) == 0


@pytest.mark.asyncio
async def test_a_stopped_attempt_leaves_a_shared_pull_and_the_last_one_ends_it(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = SLOW
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    first = asyncio.create_task(runtime.start(_attempt("pl-leave-1", image)))
    second = asyncio.create_task(runtime.start(_attempt("pl-leave-2", image)))
    await eventually(lambda: registry.blob_requests("ml/pulled") >= 2)  # config, then the layer

    assert await bounded(runtime.stop("pl-leave-1", grace_s=5)) is None
    with pytest.raises(RuntimeFailure, match=f"stopped while pulling {re.escape(image)}"):
        await bounded(first)
    await asyncio.sleep(0.5)
    assert not second.done() and registry.aborted_blobs == 0  # still pulling for the other

    assert await bounded(runtime.stop("pl-leave-2", grace_s=5)) is None
    with pytest.raises(RuntimeFailure, match="stopped while pulling"):
        await bounded(second)
    await eventually(lambda: registry.aborted_blobs == 1)  # the engine broke the download off
    assert not _has_image(engine, image)
    assert _no_container(engine, "pl-leave-1") and _no_container(engine, "pl-leave-2")


@pytest.mark.asyncio
async def test_a_pull_that_takes_longer_than_the_limit_fails_and_ends(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = SLOW
    runtime = DockerRuntime(engine, policy, request_gpus=False, pull_timeout_s=2)
    with pytest.raises(ImagePullError, match=f"pulling {re.escape(image)} did not finish within 2 s"):
        await bounded(runtime.start(_attempt("pl-timeout", image)))
    await eventually(lambda: registry.aborted_blobs == 1)
    assert not _has_image(engine, image) and _no_container(engine, "pl-timeout")


@pytest.mark.asyncio
async def test_a_cancelled_start_leaves_no_pull_behind(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    """The agent cancels its starts when it shuts down: the engine must not go on pulling."""
    image = serve_image(engine, registry)
    registry.bytes_per_second = SLOW
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    start = asyncio.create_task(runtime.start(_attempt("pl-cancelled", image)))
    await eventually(lambda: registry.blob_requests("ml/pulled") >= 2)  # config, then the layer
    start.cancel()
    await asyncio.gather(start, return_exceptions=True)
    await eventually(lambda: registry.aborted_blobs == 1)
    assert not _has_image(engine, image) and _no_container(engine, "pl-cancelled")


@pytest.mark.asyncio
async def test_a_registry_away_for_a_moment_is_tried_again_and_attempts_share_the_tries(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    registry.outage = [None, *FAILED_PULL]  # the first pull's connection is reset, the second gets 503
    progress = Progress()
    runtime = DockerRuntime(engine, policy, request_gpus=False, progress=progress)
    attempts = [_attempt(f"pl-retry-{n}", image) for n in range(2)]
    await bounded(asyncio.gather(*(runtime.start(attempt) for attempt in attempts)))
    assert registry.pings() == 3  # three pulls in all, not three for each attempt
    for attempt in attempts:
        messages = progress.of(attempt.attempt_id)
        retries = [m for m in messages if "trying again" in m]
        assert len(retries) == 2, messages
        assert re.fullmatch(
            rf"pulling {re.escape(image)}: registry unreachable \(connection (closed|reset)\), "
            "trying again in 2 s",
            retries[0],
        )
        assert retries[1] == f"pulling {image}: {ANSWERED} 503 Service Unavailable, trying again in 4 s"
        assert f"pulling {image} (try 3)" in messages
        assert await bounded(runtime.wait(attempt.attempt_id)) == 0


@pytest.mark.asyncio
async def test_a_missing_tag_fails_at_once_even_after_a_retry(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry).replace(":1", ":no-such-tag")
    registry.outage = list(FAILED_PULL)
    progress = Progress()
    runtime = DockerRuntime(engine, policy, request_gpus=False, progress=progress)
    began = time.monotonic()
    with pytest.raises(ImagePullError, match=f"cannot pull {re.escape(image)}: .*manifest unknown$"):
        await bounded(runtime.start(_attempt("pl-retry-notag", image)))
    assert time.monotonic() - began < 2 + 4  # the 404 was not waited on
    assert registry.pings() == 2
    assert [m for m in progress.of("pl-retry-notag") if "trying again" in m] == [
        f"pulling {image}: registry answered 503 Service Unavailable, trying again in 2 s"
    ]
    assert _no_container(engine, "pl-retry-notag")


@pytest.mark.asyncio
async def test_the_time_limit_bounds_the_tries_and_the_waits_between_them(
    engine, registry: Registry, policy: HostPolicy
) -> None:
    image = serve_image(engine, registry)
    registry.outage = [UNAVAILABLE] * 1000
    runtime = DockerRuntime(engine, policy, request_gpus=False, pull_timeout_s=5)
    began = time.monotonic()
    # Tries at 0 and 2 s; the next would come at 6 s, after the limit: no point waiting for it.
    with pytest.raises(
        ImagePullError,
        match=f"cannot pull {re.escape(image)}: received unexpected HTTP status: 503 Service Unavailable "
        r"\(tried 2 times within the pull timeout of 5 s\)$",
    ):
        await bounded(runtime.start(_attempt("pl-retry-limit", image)))
    assert time.monotonic() - began < 5
    assert registry.pings() == 2

    registry.outage = list(FAILED_PULL)  # then a pull that is too slow: the limit counts the wait too
    registry.bytes_per_second = SLOW
    with pytest.raises(
        ImagePullError,
        match=f"pulling {re.escape(image)} did not finish within 5 s .pull timeout., after registry "
        "answered 503 Service Unavailable$",
    ):
        await bounded(runtime.start(_attempt("pl-retry-slow", image)))
    await eventually(lambda: registry.aborted_blobs == 1)
    assert not _has_image(engine, image)
    assert _no_container(engine, "pl-retry-limit") and _no_container(engine, "pl-retry-slow")


@pytest.mark.asyncio
async def test_the_agent_reports_pull_progress_and_runs_two_attempts_from_one_pull(
    engine, registry: Registry, policy: HostPolicy, tmp_path: Path
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = 2 * MIB
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        runtime.progress = agent.report_starting
        portal.desired = [_attempt("pl-agent-1", image), _attempt("pl-agent-2", image)]
        task = asyncio.create_task(agent.run())
        try:
            for attempt_id in ("pl-agent-1", "pl-agent-2"):
                await wait_for(lambda a=attempt_id: (s := portal.last_status(a)) and s.state.is_terminal, 60)
                final = portal.last_status(attempt_id)
                assert (final.state, final.reason, final.exit_code) == (
                    AttemptState.EXITED,
                    ExitReason.SUCCEEDED,
                    0,
                )
                await wait_for(lambda a=attempt_id: portal.log_lines(a) == {0: PULLED_TEXT})
                starting = [s for s in portal.statuses(attempt_id) if s.state == AttemptState.STARTING]
                assert [s.message for s in starting][:2] == ["", f"pulling {image}"]
                assert any(re.search(r": \d+ of \d+ MiB$", s.message) for s in starting), starting
                generations = [s.generation for s in starting]
                assert generations == sorted(set(generations))  # each report supersedes the one before
            assert registry.manifest_requests("ml/pulled", "1") == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.asyncio
async def test_the_agent_fails_an_attempt_whose_image_cannot_be_pulled(
    engine, registry: Registry, policy: HostPolicy, tmp_path: Path
) -> None:
    image = serve_image(engine, registry).replace(":1", ":no-such-tag")
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        portal.desired = [_attempt("pl-agent-notag", image)]
        task = asyncio.create_task(agent.run())
        try:
            await wait_for(lambda: (s := portal.last_status("pl-agent-notag")) and s.state.is_terminal, 60)
            final = portal.last_status("pl-agent-notag")
            assert (final.state, final.reason) == (AttemptState.EXITED, ExitReason.START_FAILED)
            assert final.message.startswith(f"cannot pull {image}: ") and "manifest unknown" in final.message
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.asyncio
async def test_cancelling_an_attempt_during_a_slow_pull_ends_the_pull(
    engine, registry: Registry, policy: HostPolicy, tmp_path: Path
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = SLOW
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        runtime.progress = agent.report_starting
        portal.desired = [_attempt("pl-cancel", image)]
        task = asyncio.create_task(agent.run())
        try:
            await wait_for(
                lambda: (s := portal.last_status("pl-cancel")) and re.search(r"\d+ of \d+ MiB$", s.message),
                60,
            )
            await portal.set_desired([])  # the job was cancelled while its image was being pulled
            await wait_for(lambda: portal.last_status("pl-cancel").state.is_terminal, 30)
            final = portal.last_status("pl-cancel")
            assert (final.state, final.reason) == (AttemptState.EXITED, ExitReason.STOPPED)
            assert final.message == f"stopped while pulling {image}"
            await wait_for(lambda: registry.aborted_blobs == 1)
            assert not _has_image(engine, image) and _no_container(engine, "pl-cancel")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.asyncio
async def test_cancelling_an_attempt_while_it_waits_to_try_its_pull_again_ends_it_at_once(
    engine, registry: Registry, policy: HostPolicy, tmp_path: Path
) -> None:
    image = serve_image(engine, registry)
    registry.outage = [UNAVAILABLE] * 1000
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        runtime.progress = agent.report_starting
        portal.desired = [_attempt("pl-retry-cancel", image)]
        task = asyncio.create_task(agent.run())
        try:
            waiting = f"pulling {image}: registry answered 503 Service Unavailable, trying again in 2 s"
            await wait_for(lambda: (s := portal.last_status("pl-retry-cancel")) and s.message == waiting, 60)
            cancelled = time.monotonic()
            await portal.set_desired([])  # the job was cancelled while the agent waited to try again
            await wait_for(lambda: portal.last_status("pl-retry-cancel").state.is_terminal, 30)
            assert time.monotonic() - cancelled < 1.5  # the wait had about 2 s to go
            final = portal.last_status("pl-retry-cancel")
            assert (final.state, final.reason) == (AttemptState.EXITED, ExitReason.STOPPED)
            assert final.message == f"stopped while pulling {image}"
            await asyncio.sleep(2.5)
            assert registry.pings() == 1  # and it was never tried again
            assert _no_container(engine, "pl-retry-cancel")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# The trap comes first: the agent may signal the job right after its container started.
SAVES_ON_SIGNAL = (
    "save() { echo weights > $GPUPORTAL_CHECKPOINT_DIR/step-3;"
    ' echo \'{"step": 3, "path": "step-3"}\' > $GPUPORTAL_CHECKPOINT_DIR/.marker.tmp;'
    " mv $GPUPORTAL_CHECKPOINT_DIR/.marker.tmp $GPUPORTAL_CHECKPOINT_DIR/checkpoint.json; exit 0; };"
    " trap save USR1; echo up; while true; do sleep 0.05; done"
)


async def _change_while_pulling(portal: FakePortal, agent: Agent, changed: DesiredAttempt) -> None:
    """Send `changed` once the pull of its attempt is under way, and check that the attempt is
    still starting when the agent has the set (so the set cannot act on it yet)."""
    attempt_id = changed.attempt_id
    await wait_for(
        lambda: (s := portal.last_status(attempt_id)) and re.search(r"\d+ of \d+ MiB$", s.message), 60
    )
    await portal.set_desired([changed])
    await wait_for(lambda: agent.newest_revision == portal.revision)
    assert attempt_id in agent.starting and portal.last_status(attempt_id).state == AttemptState.STARTING


@pytest.mark.asyncio
async def test_a_suspend_asked_for_during_the_pull_is_carried_out_once_the_attempt_started(
    engine, registry: Registry, policy: HostPolicy, tmp_path: Path
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = MIB  # about four seconds
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        agent.config = dataclasses.replace(agent.config, resync_interval_s=3600)  # no resync to wait for
        runtime.progress = agent.report_starting
        job = _attempt("pl-suspend", image, script="echo up; while true; do sleep 0.05; done")
        portal.desired = [job]
        task = asyncio.create_task(agent.run())
        try:
            suspend = job.model_copy(update={"run_state": "suspended"})
            await _change_while_pulling(portal, agent, suspend)
            await wait_for(lambda: portal.last_status("pl-suspend").state == AttemptState.SUSPENDED, 30)
            assert engine.containers.get("gpuportal-pl-suspend").status == "paused"
            assert [s.state for s in portal.statuses("pl-suspend")][-2:] == [
                AttemptState.RUNNING,
                AttemptState.SUSPENDED,
            ]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            # The engine serves the module's other tests: their agents would find it and stop it.
            for container in engine.containers.list(all=True, filters={"name": "gpuportal-pl-suspend"}):
                container.remove(force=True)


@pytest.mark.asyncio
async def test_a_checkpoint_and_stop_asked_for_during_the_pull_is_carried_out_once_the_attempt_started(
    engine, registry: Registry, policy: HostPolicy, tmp_path: Path
) -> None:
    image = serve_image(engine, registry)
    registry.bytes_per_second = MIB
    runtime = DockerRuntime(engine, policy, request_gpus=False)
    checkpoint_dir = tmp_path / "ckpt" / "job-pl"
    async with FakePortal() as portal:
        agent = docker_agent(portal, runtime, tmp_path / "state")
        agent.config = dataclasses.replace(agent.config, resync_interval_s=3600)
        runtime.progress = agent.report_starting
        job = _attempt("pl-preempt", image, script=SAVES_ON_SIGNAL).model_copy(
            update={"checkpoint_dir": str(checkpoint_dir)}
        )
        portal.desired = [job]
        task = asyncio.create_task(agent.run())
        try:
            preempt = job.model_copy(update={"checkpoint_and_stop": True})
            await _change_while_pulling(portal, agent, preempt)
            await wait_for(lambda: portal.last_status("pl-preempt").state == AttemptState.EXITED, 30)
            final = portal.last_status("pl-preempt")
            # The job's own exit after saving races the agent's stop (SIGTERM, 143); both are fine.
            assert final.reason == ExitReason.CHECKPOINTED and final.exit_code in (0, 143)
            (done,) = portal.of_type(CheckpointDone)
            assert (done.request_id, done.step, done.path) == (None, 3, str(checkpoint_dir / "step-3"))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

"""DockerRuntime: each attempt is one container, configured from a fixed template.

Nothing in the attempt can widen the template: the container is never privileged, drops
every capability except :data:`SAFE_CAPABILITIES`, runs with no-new-privileges, never
shares the host's network, pid or ipc namespace, mounts only what the host policy
allows, and sees exactly the GPUs allocated to it (an NVIDIA device request by uuid).
Container labels carry the job and attempt ids: they are how a restarted agent finds
its containers again. The container's log is rotated by the engine (:func:`log_config`), so
a job that prints without end cannot fill the host's disk.

Before it creates a container, the runtime pulls the image when its pull policy says so
(``missing``: only when the engine does not have it; ``always``; ``never``). Attempts that need
the same image at once share one pull, and each hears how far it got (``progress``). A pull that
fails for a reason that may pass (the registry unreachable, or answering 5xx or 429) is tried
again after a growing wait, because a failed start is final for the portal. A pull, with its
tries, has a time limit, and it ends when the last attempt waiting for it is stopped or gives up.

The Docker SDK is synchronous; every call runs in a worker thread. Log streams and pulls use
their own daemon threads, because they may last far longer than a worker thread should be held.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import docker
import docker.auth
import docker.errors
import docker.utils
import requests.exceptions
from docker.types import DeviceRequest, LogConfig
from docker.types import Mount as DockerMount

from agents.protocol import AttemptState, DesiredAttempt, RuntimeInfo
from agents.runtime import (
    DEFAULT_LOG_MAX_BYTES,
    LineNumbering,
    LogLine,
    LogStream,
    ObservedAttempt,
    RuntimeFailure,
    UnknownAttemptError,
)
from agents.runtime.policy import (
    HostPolicy,
    LaunchPlan,
    PolicyError,
    image_problems,
    image_registry,
    prepare,
)
from agents.runtime.shell import READ_BYTES, SHELL_TERM, ShellEnded, ShellProcess, close_shell

log = logging.getLogger("agents")
LABEL_MANAGED = "gpuportal.managed"
LABEL_ATTEMPT = "gpuportal.attempt-id"
LABEL_JOB = "gpuportal.job-id"
LABEL_GPUS = "gpuportal.gpu-uuids"
CHECKPOINT_TARGET = "/gpuportal/checkpoint"
POLL_S = 0.1
# Reads of a shell's output that may wait for the agent before the reading thread waits too.
SHELL_PENDING_READS = 4
SHELL_EXIT_WAIT_S = 5.0
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")

PullPolicy = Literal["missing", "always", "never"]
PULL_POLICIES: tuple[PullPolicy, ...] = ("missing", "always", "never")
DEFAULT_PULL_TIMEOUT_S = 30 * 60.0
PULL_PROGRESS_INTERVAL_S = 1.0  # the portal hears about a pull at most about this often
PULL_RETRY_FIRST_S = 2.0  # the wait before the second try; it doubles for each try after
PULL_RETRY_MAX_S = 60.0
MIB = 1024 * 1024
# Docker Hub's other names, as they appear in a Docker config.json.
_DOCKER_HUB_HOSTS = ("index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")

# (attempt id, message): how far a start that takes a while got, e.g. "pulling IMAGE: 3 of 9 MiB".
ProgressCallback = Callable[[str, str], None]

# What an ordinary training job may need, and nothing that reaches beyond its container:
# no NET_RAW, MKNOD, SYS_CHROOT, SETFCAP, SETPCAP or AUDIT_WRITE from Docker's default set.
SAFE_CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
)
FORBIDDEN_NETWORK_MODES = ("host",)
# The engine keeps a container's output in this many files of its json-file log driver, and
# drops the older one when the newer is full.
DOCKER_LOG_FILES = 2

_STATES = {
    "created": AttemptState.STARTING,
    "running": AttemptState.RUNNING,
    "restarting": AttemptState.RUNNING,
    "paused": AttemptState.SUSPENDED,
    "removing": AttemptState.EXITED,
    "exited": AttemptState.EXITED,
    "dead": AttemptState.EXITED,
}


def device_requests(gpu_uuids: list[str]) -> list[DeviceRequest]:
    """Exactly the allocated GPUs, by uuid (indices can be renumbered; uuids cannot)."""
    if not gpu_uuids:
        return []
    return [DeviceRequest(driver="nvidia", device_ids=list(gpu_uuids), capabilities=[["gpu"]])]


def log_config(log_max_bytes: int) -> LogConfig:
    """The engine's json-file log driver with rotation, so that a container's output takes at most
    about ``2 * log_max_bytes`` of the host's disk (its JSON lines, both streams in one log): what
    the process runtime allows its two log files. Unlike the process runtime, the engine keeps
    the newest output and drops the oldest. The driver is named, not left to the engine's
    default, because the agent reads the output back with ``docker logs``, which other drivers
    may not serve."""
    max_size = max(1, math.ceil(2 * log_max_bytes / DOCKER_LOG_FILES))
    return LogConfig(
        type=LogConfig.types.JSON,
        config={"max-size": str(max_size), "max-file": str(DOCKER_LOG_FILES)},
    )


def container_config(
    plan: LaunchPlan,
    network_mode: str = "none",
    request_gpus: bool = True,
    capabilities: tuple[str, ...] = SAFE_CAPABILITIES,
    user: str | None = None,
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
) -> dict[str, Any]:
    """The keyword arguments for ``containers.create``: the fixed template filled from the plan.
    ``log_max_bytes`` 0 leaves the container's log to the engine's configuration."""
    if network_mode in FORBIDDEN_NETWORK_MODES or network_mode.startswith("container:"):
        raise ValueError(f"network mode {network_mode!r} is not allowed for job containers")
    attempt = plan.attempt
    mounts = [
        DockerMount(target=mount.target, source=str(mount.source), type="bind", read_only=mount.read_only)
        for mount in plan.mounts
    ]
    if plan.checkpoint_dir is not None:
        mounts.append(
            DockerMount(
                target=CHECKPOINT_TARGET, source=str(plan.checkpoint_dir), type="bind", read_only=False
            )
        )
    memory_bytes = attempt.resources.memory_mib * 1024 * 1024
    config: dict[str, Any] = {
        "image": attempt.image,
        "command": list(attempt.command),
        "name": f"gpuportal-{attempt.attempt_id}",
        "labels": {
            LABEL_MANAGED: "true",
            LABEL_ATTEMPT: attempt.attempt_id,
            LABEL_JOB: attempt.job_id,
            LABEL_GPUS: ",".join(gpu.uuid for gpu in attempt.gpus),
        },
        "environment": dict(plan.env),
        "network_mode": network_mode,
        "ipc_mode": "private",
        "privileged": False,
        "cap_drop": ["ALL"],
        "cap_add": list(capabilities),
        "security_opt": ["no-new-privileges:true"],
        "nano_cpus": int(attempt.resources.cpus * 1e9),
        "mem_limit": memory_bytes,
        "memswap_limit": memory_bytes,  # no swap beyond the memory limit
        "pids_limit": attempt.resources.pids,
        "mounts": mounts,
        "device_requests": device_requests([gpu.uuid for gpu in attempt.gpus]) if request_gpus else [],
        "stdin_open": False,
        "tty": False,
    }
    if user is not None:
        config["user"] = user
    if log_max_bytes > 0:
        config["log_config"] = log_config(log_max_bytes)
    return config


class ImagePullError(RuntimeFailure):
    """The attempt's image is not on this node and could not be pulled.

    ``transient`` says why another try may succeed (``registry unreachable (connection
    refused)``); None when it cannot (the tag does not exist, the credentials are wrong).
    """

    def __init__(self, message: str, transient: str | None = None) -> None:
        super().__init__(message)
        self.transient = transient


# Texts of the engine's pull errors that no retry can fix; they win over any transient sign.
_PERMANENT_PULL_ERRORS = (
    "manifest unknown",
    "name unknown",
    "not found",
    "does not exist",
    "unauthorized",
    "denied",
    "no basic auth credentials",
    "invalid reference",
)
# (text in the engine's error, why the registry could not be reached). The network may come
# back, and a name server may answer next time: a host that does not resolve counts too.
_UNREACHABLE_PULL_ERRORS = (
    ("no such host", "name not resolved"),
    ("name resolution", "name not resolved"),
    ("server misbehaving", "name not resolved"),
    ("network is unreachable", "network unreachable"),
    ("no route to host", "network unreachable"),
    ("host is unreachable", "network unreachable"),
    ("connection refused", "connection refused"),
    ("connection reset", "connection reset"),
    ("broken pipe", "connection reset"),
    (": eof", "connection closed"),
    ("unexpected eof", "connection closed"),
    ("timeout", "timed out"),
    ("deadline exceeded", "timed out"),
)
_UNEXPECTED_STATUS = re.compile(r"unexpected HTTP status: ((?:5\d\d|429)\b[^\n;]*)", re.IGNORECASE)


def transient_pull_problem(error: str) -> str | None:
    """Why a pull that failed with the engine's ``error`` may succeed when tried again, or None.

    The engine reports every registry error as text (its HTTP status is 500 for all of them),
    so the text is all there is to go by. Anything not known to pass is taken as permanent: a
    job whose image cannot be had should fail at once, not after the whole pull time limit.
    """
    lowered = error.lower()
    if any(text in lowered for text in _PERMANENT_PULL_ERRORS):
        return None
    status = _UNEXPECTED_STATUS.search(error)
    if status is not None:
        return f"registry answered {status[1].strip()}"
    if "toomanyrequests" in lowered:  # Docker Hub's rate limit, as the registry's error code says it
        return "registry answered 429 Too Many Requests"
    for text, reason in _UNREACHABLE_PULL_ERRORS:
        if text in lowered:
            return f"registry unreachable ({reason})"
    return None


def _pull_failure(reference: str, error: str) -> ImagePullError:
    return ImagePullError(f"cannot pull {reference}: {error}", transient_pull_problem(error))


@dataclass(frozen=True)
class RegistryAuth:
    """Credentials for one registry. The password never shows in a repr, so never in a log."""

    username: str
    password: str = field(repr=False)


def registry_host(server: str) -> str:
    """The host (and port) a Docker config.json key names, as image references name it: keys may
    be URLs (``https://index.docker.io/v1/``), and Docker Hub has several names."""
    host = (urlsplit(server if "://" in server else f"//{server}").netloc or server).lower()
    return "docker.io" if host in _DOCKER_HUB_HOSTS else host


def read_registry_auth(path: Path) -> dict[str, RegistryAuth]:
    """Registry credentials by host, from a Docker config.json-style file: ``{"auths": {host:
    {"auth": base64("user:password")}}}``, or ``username`` and ``password`` fields instead of
    ``auth``. Raises ValueError with a message that names the file and host, never a secret."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read registry credentials from {path}: {error}") from None
    auths = document.get("auths") if isinstance(document, dict) else None
    if not isinstance(auths, dict):
        raise ValueError(f'{path} has no "auths" object')
    credentials = {}
    for server, entry in auths.items():
        if not isinstance(entry, dict):
            raise ValueError(f"the entry for {server} in {path} is not an object")
        if entry.get("auth"):
            try:
                decoded = base64.b64decode(str(entry["auth"]), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            username, colon, password = decoded.partition(":")
            if not (username and colon):
                raise ValueError(f'the "auth" of {server} in {path} is not base64 of user:password')
        elif isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            username, password = entry["username"], entry["password"]
        else:
            # Entries left by `docker login` with a credential helper hold nothing the agent can use.
            raise ValueError(f'the entry for {server} in {path} has neither "auth" nor username and password')
        credentials[registry_host(server)] = RegistryAuth(username, password)
    return credentials


def pull_reference(image: str) -> tuple[str, str]:
    """(repository, tag or digest) of an image reference; the tag is ``latest`` when it has none."""
    repository, tag = docker.utils.parse_repository_tag(image)
    return repository, tag or "latest"


def canonical_image(image: str) -> str:
    """The reference as the engine stores it, and as pulls are shared: ``busybox`` is ``busybox:latest``."""
    repository, tag = pull_reference(image)
    return f"{repository}@{tag}" if tag.startswith("sha256:") else f"{repository}:{tag}"


class PullProgress:
    """How many bytes of the image's layers were downloaded, from the engine's progress events
    (one per layer and step; layers the engine already has never report a size)."""

    def __init__(self, reference: str) -> None:
        self.reference = reference
        self.layers: dict[str, tuple[int, int]] = {}  # layer id -> (bytes done, bytes in all)

    def feed(self, event: dict[str, Any]) -> None:
        layer, status = event.get("id"), event.get("status", "")
        detail = event.get("progressDetail") or {}
        if layer is None:
            return
        if status == "Downloading" and detail.get("total"):
            self.layers[layer] = (int(detail.get("current", 0)), int(detail["total"]))
        elif status in ("Download complete", "Pull complete") and layer in self.layers:
            total = self.layers[layer][1]
            self.layers[layer] = (total, total)

    def message(self) -> str:
        if not self.layers:
            return f"pulling {self.reference}"
        done = sum(done for done, _ in self.layers.values())
        total = sum(total for _, total in self.layers.values())
        return f"pulling {self.reference}: {done // MIB:,} of {math.ceil(total / MIB):,} MiB"


class _PullStream:
    """One engine pull, read in a daemon thread of its own: the engine's progress stream is a
    blocking HTTP response that lives as long as the pull (minutes, for a large image).

    The pull is asked for with the Engine API's own call (``POST /images/create``) rather than
    docker-py's ``pull``, which hides the response inside a generator: holding the response is
    what lets ``abort`` end the pull from another thread. ``abort`` shuts the response's socket
    down; the engine ends a pull whose client went away, and the reading thread wakes up.
    Before the engine's first answer there is no response yet: the thread then closes it as
    soon as the answer comes.
    """

    def __init__(
        self,
        api: Any,
        reference: str,
        auth: RegistryAuth | None,
        report: Callable[[str], None],
    ) -> None:
        self.api = api
        self.reference = reference
        self.auth = auth
        self.report = report
        self.progress = PullProgress(reference)
        self._lock = threading.Lock()
        self._response: Any = None
        self._aborted = False
        self._ended = False

    def run(self, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[None]) -> None:
        """The thread: settles ``finished`` with None or an ImagePullError, whatever happens."""
        error: ImagePullError | None = None
        try:
            self._read()
        except ImagePullError as failure:
            error = failure
        except Exception as failure:  # the waiting start must always hear the end
            error = ImagePullError(f"cannot pull {self.reference}: {failure}")
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, finished, error)

    def abort(self) -> None:
        with self._lock:
            if self._aborted or self._ended:
                return
            self._aborted = True
            response = self._response
        if response is not None:
            _shut_down(response)

    def _read(self) -> None:
        response = self._request()
        with self._lock:
            self._response = response
            aborted = self._aborted
        try:
            if aborted:
                return
            last_report = time.monotonic()  # the start already said "pulling"
            for line in response.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                if "error" in event:
                    raise _pull_failure(self.reference, str(event["error"]))
                self.progress.feed(event)
                if time.monotonic() - last_report >= PULL_PROGRESS_INTERVAL_S:
                    last_report = time.monotonic()
                    self.report(self.progress.message())
        except ImagePullError:
            raise
        except Exception as error:
            if self._aborted:
                return  # abort() broke the read off; the waiting start knows why
            message = f"cannot pull {self.reference}: the engine's answer broke off: {error}"
            raise ImagePullError(message) from None
        finally:
            with self._lock:
                self._ended = True
            with contextlib.suppress(Exception):
                response.close()

    def _request(self) -> Any:
        """Ask the engine to pull; its streaming answer (one JSON progress event a line).
        Raises ImagePullError when the engine refuses at once."""
        repository, tag = pull_reference(self.reference)
        if self.auth is not None:
            credentials = {"username": self.auth.username, "password": self.auth.password}
            auth_header = docker.auth.encode_header(credentials)
        else:  # as docker-py's pull: what the Docker config of the agent's user has, if anything
            registry, _ = docker.auth.resolve_repository_name(repository)
            auth_header = docker.auth.get_config_header(self.api, registry)
        response = self.api.post(
            f"{self.api.base_url}/v{self.api.api_version}/images/create",
            params={"fromImage": repository, "tag": tag},
            headers={"X-Registry-Auth": auth_header} if auth_header else {},
            stream=True,
            timeout=None,  # a pull lasts as long as it lasts; the pull timeout bounds it
        )
        if not response.ok:
            with contextlib.closing(response):
                try:
                    explanation = str(response.json()["message"])
                except (ValueError, KeyError, TypeError):
                    explanation = response.text.strip() or f"{response.status_code} {response.reason}"
            raise _pull_failure(self.reference, explanation)
        return response


def _shut_down(response: Any) -> None:
    sock = getattr(getattr(response.raw, "connection", None), "sock", None)
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        else:
            response.close()


def _settle(future: asyncio.Future[None], error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class _Pull:
    """One pull of one image and the attempts waiting for it."""

    def __init__(self, reference: str) -> None:
        self.reference = reference
        self.waiters: set[str] = set()
        self.message = f"pulling {reference}"
        self.task: asyncio.Task[None] | None = None


class DockerRuntime:
    kind: Literal["docker"] = "docker"

    def __init__(
        self,
        client: docker.DockerClient,
        policy: HostPolicy,
        network_mode: str = "none",
        request_gpus: bool = True,
        user: str | None = None,
        pull_policy: PullPolicy = "missing",
        pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S,
        registry_auth: Mapping[str, RegistryAuth] | None = None,
        progress: ProgressCallback | None = None,
        log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
    ) -> None:
        """``request_gpus=False`` is for engines without the NVIDIA runtime (tests, CI).
        ``registry_auth`` maps registry hosts (as :func:`registry_host` names them) to credentials.
        ``progress`` may also be set later: the agent that reports it is made after the runtime.
        ``log_max_bytes`` bounds each container's log on the host (see :func:`log_config`); 0
        leaves it to the engine's configuration."""
        if network_mode in FORBIDDEN_NETWORK_MODES:
            raise ValueError(f"network mode {network_mode!r} is not allowed for job containers")
        if pull_policy not in PULL_POLICIES:
            raise ValueError(f"pull policy must be one of {', '.join(PULL_POLICIES)}, not {pull_policy!r}")
        if log_max_bytes < 0:
            raise ValueError(f"log_max_bytes must be 0 (no cap) or more, not {log_max_bytes}")
        self.client = client
        self.policy = policy
        self.network_mode = network_mode
        self.request_gpus = request_gpus
        self.user = user
        self.pull_policy = pull_policy
        self.pull_timeout_s = pull_timeout_s
        self.registry_auth = {registry_host(host): auth for host, auth in (registry_auth or {}).items()}
        self.progress = progress
        self.log_max_bytes = log_max_bytes
        self._attempt_by_container: dict[str, str] = {}  # refreshed by list_attempts
        self._pulls: dict[str, _Pull] = {}  # by canonical image reference
        # Attempts inside start(); the future is set when a stop comes before the container exists.
        self._starting: dict[str, asyncio.Future[None]] = {}

    async def info(self) -> RuntimeInfo:
        version = await asyncio.to_thread(self.client.version)
        components = {item.get("Name"): item.get("Version") for item in version.get("Components", [])}
        return RuntimeInfo(kind="docker", version=version.get("Version"), runc_version=components.get("runc"))

    async def start(self, attempt: DesiredAttempt) -> None:
        """Check, pull (per the pull policy), create, start. A stop that comes while the image is
        pulled ends the start with RuntimeFailure, and no container is made."""
        problems = image_problems(attempt.image, self.policy.allowed_registries)
        if problems:
            raise PolicyError("; ".join(problems))
        plan = prepare(attempt, self.policy, checkpoint_target=CHECKPOINT_TARGET)
        config = container_config(
            plan, self.network_mode, self.request_gpus, user=self.user, log_max_bytes=self.log_max_bytes
        )
        if attempt.attempt_id in self._starting:
            raise RuntimeFailure(f"attempt {attempt.attempt_id} is already starting")
        stopped = asyncio.get_running_loop().create_future()
        self._starting[attempt.attempt_id] = stopped
        try:
            await self._ensure_image(attempt.attempt_id, attempt.image, stopped)
            if stopped.done():
                raise RuntimeFailure("stopped before its container was created")
            try:
                container = await _engine(self.client.containers.create, **config)
            except RuntimeFailure as error:
                if not isinstance(error.__cause__, docker.errors.APIError):
                    # The engine was not heard (a timeout): it may have created it all the same.
                    await self._remove_created(attempt.attempt_id)
                raise RuntimeFailure(f"cannot create the container: {error}") from error
            try:
                if stopped.done():
                    raise RuntimeFailure("stopped before its container started")
                try:
                    await _engine(container.start)
                except RuntimeFailure as error:
                    raise RuntimeFailure(f"cannot start the container: {error}") from error
            except BaseException:
                # Whatever ended the start (a refusal, a timeout, a cancel), no container is
                # left behind in "created": nobody would ever start, stop or wait for it.
                with contextlib.suppress(RuntimeFailure):
                    await _engine(container.remove, force=True)
                raise
        finally:
            del self._starting[attempt.attempt_id]

    def _abandoned(self, container: Any) -> bool:
        """A container still "created" that no start() of this runtime is busy with: left by an
        agent that died or timed out between create and start. It never runs; it is removed."""
        return container.status == "created" and _attempt_label(container) not in self._starting

    async def _remove_abandoned(self, attempt_id: str) -> bool:
        """Remove the attempt's container if it is abandoned; whether it was."""
        if attempt_id in self._starting:
            return False
        return await self._remove_created(attempt_id)

    async def _remove_created(self, attempt_id: str) -> bool:
        """Remove the attempt's container if it is in "created"; whether it was. Best effort:
        an engine that cannot be reached leaves it to the next look."""
        try:
            container = await self._container(attempt_id)
            if container.status != "created":
                return False
            log.warning("removing the container of %s, created but never started", attempt_id)
            await _engine(container.remove, force=True)
        except UnknownAttemptError:
            return True  # gone already
        except RuntimeFailure as error:
            log.warning("cannot remove the container of %s: %s", attempt_id, error)
            return False
        return True

    async def _ensure_image(self, attempt_id: str, image: str, stopped: asyncio.Future[None]) -> None:
        """Make sure the engine has the image, as the pull policy says; raises ImagePullError.

        An attempt joins the pull of its image that is under way, if any. Whoever leaves a pull
        (stopped, or its start cancelled) does not end it for the others; the last one does.
        """
        reference = canonical_image(image)
        if self.pull_policy != "always" and await self._has_image(reference):
            return
        if self.pull_policy == "never":
            raise ImagePullError(f"image {reference} is not on this node, and its pull policy is never")
        if stopped.done():
            raise RuntimeFailure(f"stopped before pulling {reference}")
        pull = self._pulls.get(reference)
        if pull is None:
            pull = self._pulls[reference] = _Pull(reference)
            pull.task = asyncio.create_task(self._pull(pull))
            pull.task.add_done_callback(lambda task: self._pull_ended(pull, task))
        assert pull.task is not None
        pull.waiters.add(attempt_id)
        self._report(attempt_id, pull.message)
        try:
            await asyncio.wait([pull.task, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            pull.waiters.discard(attempt_id)
            if not pull.waiters and not pull.task.done():
                log.info("nobody waits for the pull of %s any more; ending it", reference)
                self._pulls.pop(reference, None)  # a later start pulls afresh
                pull.task.cancel()
        if stopped.done():
            raise RuntimeFailure(f"stopped while pulling {reference}")
        pull.task.result()

    async def _has_image(self, reference: str) -> bool:
        try:
            await asyncio.to_thread(self.client.api.inspect_image, reference)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as error:
            raise RuntimeFailure(f"cannot look up image {reference}: {error.explanation or error}") from error
        except requests.exceptions.RequestException as error:
            raise RuntimeFailure(f"cannot look up image {reference}: {error}") from error
        return True

    async def _pull(self, pull: _Pull) -> None:
        """Run one pull, within the pull time limit, and try it again while it fails for a
        reason that may pass. Cancelling this task ends the pull, or the wait for its next try."""
        loop = asyncio.get_running_loop()
        auth = self.registry_auth.get(image_registry(pull.reference).lower())
        log.info("pulling %s%s", pull.reference, " with credentials" if auth is not None else "")
        began = loop.time()
        deadline = began + self.pull_timeout_s
        tries = 1
        last_failure: ImagePullError | None = None
        try:
            async with asyncio.timeout_at(deadline):
                while (failure := await self._pull_once(pull, auth)) is not None:
                    last_failure = failure
                    delay = min(PULL_RETRY_FIRST_S * 2 ** (tries - 1), PULL_RETRY_MAX_S)
                    if loop.time() + delay >= deadline:  # the time limit ends before the next try
                        times = "once" if tries == 1 else f"{tries} times"
                        raise ImagePullError(
                            f"{failure} (tried {times} within the pull timeout of {self.pull_timeout_s:g} s)"
                        )
                    log.warning("%s; trying again in %g s", failure, delay)
                    waiting = f"{failure.transient}, trying again in {delay:g} s"
                    self._progress_of(pull, f"pulling {pull.reference}: {waiting}")
                    await asyncio.sleep(delay)
                    tries += 1
                    self._progress_of(pull, f"pulling {pull.reference} (try {tries})")
        except TimeoutError:
            after = f", after {last_failure.transient}" if last_failure is not None else ""
            raise ImagePullError(
                f"pulling {pull.reference} did not finish within {self.pull_timeout_s:g} s "
                f"(pull timeout){after}"
            ) from None
        log.info("pulled %s in %.1f s", pull.reference, loop.time() - began)

    async def _pull_once(self, pull: _Pull, auth: RegistryAuth | None) -> ImagePullError | None:
        """One try of the engine's pull, read in a thread of its own; cancelling ends it. Returns
        a failure that another try may not meet (and raises any other), so only the loop in
        :meth:`_pull` decides about trying again."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def report(message: str) -> None:  # in the pull's thread
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._progress_of, pull, message)

        stream = _PullStream(self.client.api, pull.reference, auth, report)
        threading.Thread(
            target=stream.run, args=(loop, finished), name=f"pull-{pull.reference}", daemon=True
        ).start()
        try:
            await finished
        except ImagePullError as failure:
            if failure.transient is None:
                raise
            return failure
        finally:
            stream.abort()  # does nothing once the pull ended on its own
        return None

    def _pull_ended(self, pull: _Pull, task: asyncio.Task[None]) -> None:
        if self._pulls.get(pull.reference) is pull:
            del self._pulls[pull.reference]
        if not task.cancelled():
            task.exception()  # the waiters report a failure; this only marks it as seen

    def _progress_of(self, pull: _Pull, message: str) -> None:
        pull.message = message
        for attempt_id in sorted(pull.waiters):
            self._report(attempt_id, message)

    def _report(self, attempt_id: str, message: str) -> None:
        log.debug("attempt %s: %s", attempt_id, message)
        if self.progress is not None:
            self.progress(attempt_id, message)

    async def list_attempts(self) -> list[ObservedAttempt]:
        containers = await self._list({"label": f"{LABEL_MANAGED}=true"})
        self._attempt_by_container = {container.id: _attempt_label(container) for container in containers}
        return [self._observe(container) for container in containers]

    def _observe(self, container: Any) -> ObservedAttempt:
        """An abandoned container (see :meth:`_abandoned`) is shown as vanished, not as starting
        for ever: it will never run, and the portal should place the job again."""
        observed = _observe(container.attrs)
        if self._abandoned(container):
            return ObservedAttempt(
                attempt_id=observed.attempt_id,
                job_id=observed.job_id,
                state=AttemptState.VANISHED,
                gpu_uuids=observed.gpu_uuids,
            )
        return observed

    def attempt_of_pid(self, pid: int) -> str | None:
        """A container's processes carry its id in their cgroup paths (cgroup v1 and v2 alike)."""
        try:
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        for container_id in _CONTAINER_ID.findall(cgroups):
            if container_id in self._attempt_by_container:
                return self._attempt_by_container[container_id]
        return None

    async def signal(self, attempt_id: str, signal_name: str) -> None:
        container = await self._container(attempt_id)
        await _engine(container.kill, signal=signal_name)

    async def suspend(self, attempt_id: str) -> None:
        container = await self._container(attempt_id)
        await _engine(container.pause)
        await self._wait_for_state(attempt_id, AttemptState.SUSPENDED)

    async def resume(self, attempt_id: str) -> None:
        container = await self._container(attempt_id)
        await _engine(container.unpause)
        await self._wait_for_state(attempt_id, AttemptState.RUNNING)

    async def _wait_for_state(self, attempt_id: str, state: AttemptState) -> None:
        """The engine may report the old status for a moment after pause/unpause returned."""
        for _ in range(100):
            observed = _observe((await self._container(attempt_id)).attrs)
            if observed.state == state or not observed.state.is_live:
                return
            await asyncio.sleep(POLL_S / 5)
        raise RuntimeFailure(f"attempt {attempt_id} did not become {state}")

    async def stop(self, attempt_id: str, grace_s: float) -> int | None:
        """Docker's stop: the stop signal (SIGTERM), SIGKILL after the grace period.

        An attempt still in start() is told to give up first, and its start is waited for: one
        that waits for its image leaves the pull at once and makes no container (no exit code);
        one whose container got started meanwhile is stopped as usual."""
        stopped = self._starting.get(attempt_id)
        if stopped is not None:
            _settle(stopped, None)  # the start gives up at its next step, a pull it waits for at once
            while attempt_id in self._starting:
                await asyncio.sleep(POLL_S / 5)
        try:
            container = await self._container(attempt_id)
        except UnknownAttemptError:
            if stopped is not None:
                return None  # not created yet, and now it never will be
            raise
        if await self._remove_abandoned(attempt_id):
            return None  # it never ran: nothing to stop, and no exit code
        if container.status == "paused":
            await _engine(container.unpause)  # a frozen container cannot handle SIGTERM
        if _observe(container.attrs).state.is_live:
            await _engine(container.stop, timeout=math.ceil(grace_s))
        return await self.wait(attempt_id)

    async def wait(self, attempt_id: str) -> int | None:
        """The exit code once the container ended. Polled rather than a blocking wait, so no
        worker thread is held for the container's life. An abandoned container (see
        :meth:`_abandoned`) would wait for ever: it is removed, and there is no exit code."""
        while True:
            container = await self._container(attempt_id)
            if self._abandoned(container):
                await self._remove_abandoned(attempt_id)
                return None
            observed = _observe(container.attrs)
            if not observed.state.is_live:
                return observed.exit_code
            await asyncio.sleep(POLL_S)

    async def logs(self, attempt_id: str, stream: LogStream, from_seq: int = 0) -> AsyncIterator[LogLine]:
        container = await self._container(attempt_id)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        source = container.logs(
            stream=True, follow=True, stdout=stream == "stdout", stderr=stream == "stderr"
        )

        def pump() -> None:
            try:
                for chunk in source:
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
            except Exception:
                pass
            finally:
                # The loop may be gone (the agent stopped while the container still logs): then
                # no one waits for the end of the stream.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=pump, name=f"logs-{attempt_id}-{stream}", daemon=True).start()
        numbering = LineNumbering(stream, from_seq)
        try:
            while (chunk := await queue.get()) is not None:
                for line in numbering.feed(chunk):
                    yield line
            for line in numbering.finish():
                yield line
        finally:
            source.close()

    async def open_shell(self, attempt_id: str, command: list[str], cols: int, rows: int) -> ShellProcess:
        """``docker exec`` on a terminal: the shell gets the container's user, namespaces, cgroup,
        capabilities and environment (plus TERM); it is never privileged."""
        container = await self._container(attempt_id)
        state = _observe(container.attrs).state
        if state != AttemptState.RUNNING:
            raise RuntimeFailure(f"attempt {attempt_id} is {state}, not running")
        api = self.client.api
        created = await _engine(
            api.exec_create,
            container.id,
            list(command),
            stdin=True,
            tty=True,
            privileged=False,
            environment={"TERM": SHELL_TERM},
        )
        stream = await _engine(api.exec_start, created["Id"], socket=True, tty=True)
        shell = ExecShell(api, container.id, created["Id"], stream)
        await shell.set_first_size(cols, rows)
        return shell

    async def remove(self, attempt_id: str) -> None:
        try:
            container = await self._container(attempt_id)
        except UnknownAttemptError:
            return
        if self._observe(container).state.is_live:
            raise RuntimeFailure(f"attempt {attempt_id} is still running; stop it first")
        await _engine(container.remove, force=True)

    async def _container(self, attempt_id: str) -> Any:
        containers = await self._list({"label": [f"{LABEL_MANAGED}=true", f"{LABEL_ATTEMPT}={attempt_id}"]})
        if not containers:
            raise UnknownAttemptError(f"no container for attempt {attempt_id}")
        return containers[0]

    async def _list(self, filters: dict[str, Any]) -> list[Any]:
        """List and inspect containers; a container removed between the two steps means list again."""
        for _ in range(10):
            try:
                return await asyncio.to_thread(self.client.containers.list, all=True, filters=filters)
            except docker.errors.NotFound:
                await asyncio.sleep(POLL_S / 5)
            except docker.errors.APIError as error:
                raise RuntimeFailure(f"cannot list containers: {error.explanation or error}") from error
            except requests.exceptions.RequestException as error:
                raise RuntimeFailure(f"cannot reach the Docker engine: {error}") from error
        raise RuntimeFailure("containers keep disappearing while being listed")


class ExecShell:
    """A shell started with ``docker exec`` on a terminal (see agents.runtime.shell).

    Output comes from the exec's socket, read by a thread of its own that waits when the
    agent has not collected :data:`SHELL_PENDING_READS` reads yet. The engine does not end a
    shell on a terminal when its stream closes (the terminal's input stays open), so closing
    hangs up the exec's session by signals to its host pids, after checking that each one
    lies in the container's cgroup. That needs the agent to share the host's pid namespace
    with the engine; where it does not, the shell is left to end with its container.
    """

    def __init__(self, api: Any, container_id: str, exec_id: str, stream: Any) -> None:
        self.api = api
        self.container_id = container_id
        self.exec_id = exec_id
        self._stream = stream  # the engine's upgraded HTTP response holds it: closed together
        self.connection: socket.socket = stream._sock if isinstance(stream, socket.SocketIO) else stream
        self._output: asyncio.Queue[bytes] = asyncio.Queue()  # b"" marks the end
        self._room = threading.Semaphore(SHELL_PENDING_READS)
        self._hung_up = threading.Event()
        self._ended = False
        self._end_seen: ShellEnded | None = None  # once the engine reported the exec ended
        self._closing: asyncio.Future[int | None] | None = None
        threading.Thread(
            target=self._receive,
            args=(asyncio.get_running_loop(),),
            name=f"shell-{exec_id[:12]}",
            daemon=True,
        ).start()

    def _receive(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while True:
                while not self._room.acquire(timeout=POLL_S):
                    if self._hung_up.is_set():
                        return
                data = self.connection.recv(READ_BYTES)
                if not data:
                    return
                loop.call_soon_threadsafe(self._output.put_nowait, data)
        except OSError:
            return
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
                loop.call_soon_threadsafe(self._output.put_nowait, b"")

    async def read(self) -> bytes:
        if self._ended:
            return b""
        data = await self._output.get()
        if not data:
            self._ended = True
            return b""
        self._room.release()
        return data

    async def write(self, data: bytes) -> None:
        if self._hung_up.is_set():
            return
        try:
            await asyncio.to_thread(self.connection.sendall, data)
        except OSError as error:
            raise RuntimeFailure(f"cannot write to the shell's terminal: {error}") from error

    async def resize(self, cols: int, rows: int) -> None:
        await _engine(self.api.exec_resize, self.exec_id, height=rows, width=cols)

    async def set_first_size(self, cols: int, rows: int) -> None:
        """The engine resizes an exec's terminal only once the exec runs, a moment after it
        was started."""
        for attempt in range(20):
            try:
                await self.resize(cols, rows)
                return
            except RuntimeFailure as error:
                if attempt == 19:
                    log.warning("shell %s keeps its default size: %s", self.exec_id[:12], error)
                await asyncio.sleep(POLL_S / 4)

    async def close(self) -> int | None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._hang_up())
        return await asyncio.shield(self._closing)

    async def _hang_up(self) -> int | None:
        self._hung_up.set()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        try:
            session_id = (await self._inspect()).get("Pid") or 0
            ended = await close_shell(session_id, self._exit_status, self._in_container, SHELL_EXIT_WAIT_S)
            if ended is None:
                log.warning("shell %s still runs after its hangup", self.exec_id[:12])
                return None
            return ended.exit_code
        except RuntimeFailure as error:  # the container is gone, and the shell with it
            log.debug("shell %s: %s", self.exec_id[:12], error)
            return None
        finally:
            self._close_stream()

    def _close_stream(self) -> None:
        """The HTTP response first (it flushes through the socket), then the socket."""
        response = getattr(self._stream, "_response", None)
        with contextlib.suppress(Exception):
            if response is not None:
                response.close()
        with contextlib.suppress(OSError):
            self.connection.close()

    async def _inspect(self) -> dict[str, Any]:
        """Ask the engine about the exec, and keep its end once it reports one: a later
        question could learn nothing more, so none is asked."""
        inspected = await _engine(self.api.exec_inspect, self.exec_id)
        if not inspected["Running"]:
            self._end_seen = ShellEnded(inspected.get("ExitCode"))
        return inspected

    async def _exit_status(self) -> ShellEnded | None:
        if self._end_seen is None:
            await self._inspect()
        return self._end_seen

    def _in_container(self, pid: int) -> bool:
        try:
            return self.container_id in Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False


async def _engine(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the engine in a worker thread; its errors become the runtime's errors. So do the
    transport's (a timeout, a refused socket): the agent handles RuntimeFailure, and any other
    error would end the task that called, leaving its attempt starting or stopping for ever."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except docker.errors.NotFound as error:
        raise UnknownAttemptError(str(error.explanation or error)) from error
    except docker.errors.APIError as error:
        raise RuntimeFailure(str(error.explanation or error)) from error
    except requests.exceptions.RequestException as error:
        raise RuntimeFailure(f"cannot reach the Docker engine: {error}") from error


def _attempt_label(container: Any) -> str:
    return str(container.attrs["Config"]["Labels"][LABEL_ATTEMPT])


def _observe(attrs: dict[str, Any]) -> ObservedAttempt:
    labels = attrs["Config"]["Labels"]
    state = attrs["State"]
    observed_state = _STATES.get(state["Status"], AttemptState.RUNNING)
    gpus = tuple(uuid for uuid in labels.get(LABEL_GPUS, "").split(",") if uuid)
    return ObservedAttempt(
        attempt_id=labels[LABEL_ATTEMPT],
        job_id=labels[LABEL_JOB],
        state=observed_state,
        exit_code=state.get("ExitCode") if observed_state == AttemptState.EXITED else None,
        gpu_uuids=gpus,
    )

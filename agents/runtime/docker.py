"""DockerRuntime: each attempt is one container, configured from a fixed template.

Nothing in the attempt can widen the template: the container is never privileged, drops
every capability except :data:`SAFE_CAPABILITIES`, runs with no-new-privileges, never
shares the host's network, pid or ipc namespace, mounts only what the host policy
allows, and sees exactly the GPUs allocated to it (an NVIDIA device request by uuid).
Container labels carry the job and attempt ids: they are how a restarted agent finds
its containers again.

The Docker SDK is synchronous; every call runs in a worker thread. Log streams use
their own daemon threads, because they live as long as the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors
from docker.types import DeviceRequest
from docker.types import Mount as DockerMount

from agents.protocol import AttemptState, DesiredAttempt, RuntimeInfo
from agents.runtime import (
    LineNumbering,
    LogLine,
    LogStream,
    ObservedAttempt,
    RuntimeFailure,
    UnknownAttemptError,
)
from agents.runtime.policy import HostPolicy, LaunchPlan, PolicyError, image_problems, prepare
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


def container_config(
    plan: LaunchPlan,
    network_mode: str = "none",
    request_gpus: bool = True,
    capabilities: tuple[str, ...] = SAFE_CAPABILITIES,
    user: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments for ``containers.create``: the fixed template filled from the plan."""
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
    return config


class DockerRuntime:
    kind: Literal["docker"] = "docker"

    def __init__(
        self,
        client: docker.DockerClient,
        policy: HostPolicy,
        network_mode: str = "none",
        request_gpus: bool = True,
        user: str | None = None,
    ) -> None:
        """``request_gpus=False`` is for engines without the NVIDIA runtime (tests, CI)."""
        if network_mode in FORBIDDEN_NETWORK_MODES:
            raise ValueError(f"network mode {network_mode!r} is not allowed for job containers")
        self.client = client
        self.policy = policy
        self.network_mode = network_mode
        self.request_gpus = request_gpus
        self.user = user
        self._attempt_by_container: dict[str, str] = {}  # refreshed by list_attempts

    async def info(self) -> RuntimeInfo:
        version = await asyncio.to_thread(self.client.version)
        components = {item.get("Name"): item.get("Version") for item in version.get("Components", [])}
        return RuntimeInfo(kind="docker", version=version.get("Version"), runc_version=components.get("runc"))

    async def start(self, attempt: DesiredAttempt) -> None:
        problems = image_problems(attempt.image, self.policy.allowed_registries)
        if problems:
            raise PolicyError("; ".join(problems))
        plan = prepare(attempt, self.policy, checkpoint_target=CHECKPOINT_TARGET)
        config = container_config(plan, self.network_mode, self.request_gpus, user=self.user)
        try:
            container = await _engine(self.client.containers.create, **config)
        except RuntimeFailure as error:
            raise RuntimeFailure(f"cannot create the container: {error}") from error
        try:
            await _engine(container.start)
        except RuntimeFailure as error:
            with contextlib.suppress(RuntimeFailure):
                await _engine(container.remove, force=True)
            raise RuntimeFailure(f"cannot start the container: {error}") from error

    async def list_attempts(self) -> list[ObservedAttempt]:
        containers = await self._list({"label": f"{LABEL_MANAGED}=true"})
        self._attempt_by_container = {
            container.id: container.attrs["Config"]["Labels"][LABEL_ATTEMPT] for container in containers
        }
        return [_observe(container.attrs) for container in containers]

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
        """Docker's stop: the stop signal (SIGTERM), SIGKILL after the grace period."""
        container = await self._container(attempt_id)
        if container.status == "paused":
            await _engine(container.unpause)  # a frozen container cannot handle SIGTERM
        if _observe(container.attrs).state.is_live:
            await _engine(container.stop, timeout=math.ceil(grace_s))
        return await self.wait(attempt_id)

    async def wait(self, attempt_id: str) -> int | None:
        # Polled rather than a blocking wait, so no worker thread is held for the container's life.
        while True:
            container = await self._container(attempt_id)
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
        if _observe(container.attrs).state.is_live:
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
    """Call the engine in a worker thread; its errors become the runtime's errors."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except docker.errors.NotFound as error:
        raise UnknownAttemptError(str(error.explanation or error)) from error
    except docker.errors.APIError as error:
        raise RuntimeFailure(str(error.explanation or error)) from error


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

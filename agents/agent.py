"""The agent: one websocket session at a time to the portal, attempts that outlive sessions.

Running work never depends on the connection: attempts keep running, their logs keep
being collected and their status keeps being tracked while the portal is unreachable.
Every (re)connect starts with a hello that lists everything on the node, and every
desired set is reconciled in full, so a lost message costs a resync, never a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import websockets
import websockets.exceptions
from pydantic import ValidationError

from agents import AGENT_VERSION
from agents.checkpoint import (
    BadMarkerError,
    FoundCheckpoint,
    ManifestError,
    MarkerIdentity,
    PublishedManifest,
    build_manifest,
    marker_identity,
    point_marker_at,
    publish_manifest,
    read_marker,
    verify_resume,
    wait_for_new_marker,
)
from agents.config import AgentConfig
from agents.devices import DeviceBackend, GpuLoad
from agents.devices.health import HealthTracker
from agents.protocol import (
    MAX_MESSAGE_BYTES,
    AgentToPortal,
    AttemptState,
    AttemptStatus,
    CheckpointDone,
    CheckpointRequest,
    DesiredAttempt,
    DesiredSet,
    ExitReason,
    GpuSample,
    Heartbeat,
    Hello,
    LogChunk,
    PortalRequest,
    ProtocolError,
    ReportedAttempt,
    RequestAck,
    RequestReject,
    ResumeRequest,
    RuntimeInfo,
    ShellExit,
    ShellMessage,
    ShellOutput,
    SignalRequest,
    StopRequest,
    SuspendRequest,
    TelemetryBatch,
    UnsupportedVersionError,
    Welcome,
    decode_from_portal,
    encode,
    utc_now,
)
from agents.reconcile import (
    Checkpoint,
    LocalAttempt,
    Remove,
    Report,
    Resume,
    Start,
    Stop,
    Suspend,
    Watch,
    reconcile,
)
from agents.runtime import (
    LOG_STREAMS,
    MAX_CHUNK_CHARS,
    LogLine,
    LogStream,
    ObservedAttempt,
    Runtime,
    RuntimeFailure,
    chunk_lines,
)
from agents.runtime.policy import PolicyError
from agents.shells import ShellSessions
from agents.store import AttemptRecord, AttemptStore
from agents.versions import drain_reasons

log = logging.getLogger("agents")

CONNECTED_FILE = "connected"  # in the state directory while the agent is connected

# What waits for the portal while disconnected: at most this many messages and about this
# many bytes of log text; beyond that the oldest messages are dropped (and counted), shell
# messages excepted (see OUTBOX_SHELL_CHARS).
OUTBOX_LIMIT = 20_000
OUTBOX_LOG_BYTES = 64 * 1024 * 1024
LOST_LOGS_READ_TIMEOUT_S = 60.0
# Log text one attempt's pump holds before it hands it to the outbox itself, without waiting for
# the monitor round: a job that writes fast (or a long log read again after a restart) would
# otherwise pile up lines in memory between two rounds.
LOG_BUFFER_CHARS = 4 * 1024 * 1024
LOG_DRAIN_ON_REMOVE_S = 5.0  # how long a removal waits for the attempt's log pump to finish
WELCOME_TIMEOUT_S = 30.0
REMEMBERED_REQUESTS = 1000
# Shell output waiting in the outbox, in characters and in shell messages; beyond either,
# shells wait (held up by their terminals). The outbox never drops a shell message, so these
# bounds, well below OUTBOX_LIMIT, are what keeps shell messages from filling it.
OUTBOX_SHELL_CHARS = 1024 * 1024
OUTBOX_SHELL_MESSAGES = 1000
CHECKPOINTABLE_STATES = (AttemptState.RUNNING, AttemptState.SUSPENDED, AttemptState.CHECKPOINTING)


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    """Keep a lifetime loop alive through an unexpected error; the next round tries again."""
    try:
        yield
    except Exception:
        log.exception("%s failed; trying again next round", what)


class Backoff:
    """Exponential backoff with equal jitter: half the delay is fixed, half is random."""

    def __init__(self, initial_s: float, maximum_s: float, rng: random.Random) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.rng = rng
        self.failures = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum_s, self.initial_s * 2.0**self.failures)
        self.failures += 1
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self.failures = 0


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        backend: DeviceBackend,
        runtime: Runtime,
        toolkit_version: str | None = None,
        check_toolkit: bool = False,
    ) -> None:
        self.config = config
        self.backend = backend
        self.runtime = runtime
        self.toolkit_version = toolkit_version
        self.check_toolkit = check_toolkit
        self.store = AttemptStore(config.state_dir)
        self.health = HealthTracker()
        self.backoff = Backoff(config.backoff_initial_s, config.backoff_max_s, random.Random(config.seed))
        self.outbox: deque[AgentToPortal] = deque()
        self.outbox_log_bytes = 0
        self.outbox_shell_chars = 0
        self.outbox_shell_messages = 0
        self.outbox_dropped = 0
        self.outbox_ready = asyncio.Event()
        # Set when shells waiting for room in the outbox should look again: the sender sent
        # shell messages, or the connection is gone.
        self.shell_room = asyncio.Event()
        self._connected = False
        self.started_at = time.monotonic()
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self.telemetry_interval_s = config.telemetry_interval_s
        self.dropped_samples = 0
        # Newest desired-set revision received on the current connection. Messages on one
        # connection arrive in order, so this only lets a queued, superseded set be skipped;
        # it is reset per connection, so a portal whose counter restarted is still obeyed.
        self.newest_revision = -1
        self.last_desired: DesiredSet | None = None  # of the current connection
        self.reconcile_lock = asyncio.Lock()
        self.refresh_lock = asyncio.Lock()
        self.log_pumps: dict[str, asyncio.Task[None]] = {}
        self.log_buffers: dict[str, list[LogLine]] = {}
        # Lines whose chunks the outbox dropped while the portal was away, per (attempt,
        # stream): the range [first, end) of line numbers, read again from the runtime and
        # sent once the portal is back (_resend_lost_logs).
        self.lost_logs: dict[tuple[str, LogStream], tuple[int, int]] = {}
        self.answers: OrderedDict[UUID, RequestAck | RequestReject | None] = OrderedDict()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.starting: set[str] = set()  # attempts between record and runtime.start
        self.busy: set[str] = set()  # attempts the agent is stopping or checkpointing right now
        # The stops a desired set began, which run outside the reconcile lock: a stop may take
        # the attempt's whole grace period (up to an hour), and other tenants' attempts on the
        # node must not wait for it. Only a start that needs their GPUs waits for them.
        self.stopping: dict[str, asyncio.Task[None]] = {}
        # Removals of ended attempts under way, also outside the lock: each lets the attempt's log
        # reader finish for up to LOG_DRAIN_ON_REMOVE_S, which no desired set should wait for.
        self.removing: dict[str, asyncio.Task[None]] = {}
        # The grace of each attempt as the newest desired set gives it. A record keeps the grace of
        # the set the attempt started from; a later set may give another (the grace a preemption
        # or pause was asked with), and a stop or checkpoint the agent learns of from a set alone
        # (its request lost) must take that one, as the request would have.
        self.desired_grace: dict[str, float] = {}
        self.resending: asyncio.Task[None] | None = None  # the resend of lost log lines under way
        # The last checkpoint marker seen per running attempt, and attempts whose newer marker's
        # manifest is being built: checkpoints a job saves on its own are reported too.
        self.markers: dict[str, MarkerIdentity | None] = {}
        self.scanning: set[str] = set()
        self.sessions = 0  # completed handshakes, for tests and logs
        self.shells = ShellSessions(runtime, self.send, self._why_no_shell, self._room_for_shell_output)

    @property
    def connected(self) -> bool:
        return self._connected

    @connected.setter
    def connected(self, value: bool) -> None:
        """Losing the connection wakes the shells waiting for room in the outbox, whichever
        path lost it: their sessions end with it, so they must not wait for a sender that is gone.
        The file `STATE_DIR/connected` exists exactly while connected, for a container health
        check (docker-compose.yml) that cannot ask the process."""
        self._connected = value
        marker = self.config.state_dir / CONNECTED_FILE
        try:
            if value:
                marker.touch()
            else:
                marker.unlink(missing_ok=True)
        except OSError as error:
            log.warning("cannot update %s: %s", marker, error)
        if not value:
            self.shell_room.set()

    # ------------------------------------------------------------------ main loop

    async def run(self) -> None:
        """Run until cancelled.

        1. Look at the node once: attempts from the runtime, reconciled with the records.
        2. Start the lifetime loops: monitor (status, logs) and telemetry.
        3. Connect to the portal; on success run one session (see ``_session``).
        4. When the connection fails or drops, wait (exponential backoff with jitter)
           and go back to 3. Attempts keep running throughout.
        """
        self.connected = False  # a file left by an agent that died while connected is stale
        # 1.
        await self.refresh()
        # 2.
        lifetime = [asyncio.create_task(self._monitor_loop()), asyncio.create_task(self._telemetry_loop())]
        try:
            while True:
                # 3.
                try:
                    async with websockets.connect(
                        self.config.portal_url,
                        additional_headers={"Authorization": f"Bearer {self.config.token}"},
                        max_size=MAX_MESSAGE_BYTES,
                        open_timeout=10,
                        ping_interval=20,
                        ping_timeout=20,
                    ) as connection:
                        await self._session(connection)
                except (
                    OSError,
                    TimeoutError,
                    websockets.exceptions.WebSocketException,
                    ProtocolError,
                ) as error:
                    log.warning("portal connection lost or refused: %s", error)
                finally:
                    self.connected = False
                # 4.
                delay = self.backoff.next_delay()
                log.info("reconnecting in %.1fs", delay)
                await asyncio.sleep(delay)
        finally:
            await self.shells.shutdown()
            for task in [*lifetime, *self.tasks, *self.log_pumps.values()]:
                task.cancel()
            await asyncio.gather(*lifetime, *self.tasks, *self.log_pumps.values(), return_exceptions=True)

    async def _session(self, connection: Any) -> None:
        """One connection.

        1. Send hello: inventory, topology, health, every attempt on the node, drain reason.
        2. Wait for welcome; take the intervals it sets.
        3. Start the per-session loops: sender (outbox) and heartbeat.
        4. Handle messages until the connection closes: a desired set is reconciled in
           full (latest revision wins), requests run as tasks and are answered once, shell
           messages go to the shell sessions in the order they came.
        5. When it closes, close the shell sessions: only this connection could hear them.
        """
        # 1.
        await self.refresh()
        await connection.send(encode(await self.hello()))
        # 2.
        first = decode_from_portal(await asyncio.wait_for(connection.recv(), WELCOME_TIMEOUT_S))
        if not isinstance(first, Welcome):
            raise ProtocolError(f"expected welcome, got {first.type!r}")
        self.heartbeat_interval_s = first.heartbeat_interval_s or self.config.heartbeat_interval_s
        self.telemetry_interval_s = first.telemetry_interval_s or self.config.telemetry_interval_s
        self.connected = True
        self.newest_revision = -1
        self.last_desired = None
        self.backoff.reset()
        self.sessions += 1
        log.info("connected to the portal as node %s", first.node_id)
        # 3.
        loops = [asyncio.create_task(self._sender(connection)), asyncio.create_task(self._heartbeat_loop())]
        self._maybe_resend_lost_logs()
        try:
            # 4.
            async for text in connection:
                try:
                    message = decode_from_portal(text)
                except UnsupportedVersionError:
                    raise
                except ProtocolError as error:
                    log.error("ignoring a bad message from the portal: %s", error)
                    continue
                if isinstance(message, DesiredSet):
                    self.newest_revision = max(self.newest_revision, message.revision)
                    self.last_desired = message
                    self._spawn(self.apply_desired(message))
                elif isinstance(message, Welcome):
                    continue
                elif isinstance(message, ShellMessage):
                    self.shells.handle(message)
                else:
                    self._spawn(self.handle_request(message))
        finally:
            self.connected = False
            # 5.
            self.shells.portal_lost()
            self._drop_shell_messages()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _sender(self, connection: Any) -> None:
        while True:
            await self.outbox_ready.wait()
            while self.outbox:
                message = self.outbox[0]
                await connection.send(encode(message))
                if self.outbox and self.outbox[0] is message:  # only after the send succeeded
                    self._pop_outbox()
            self.outbox_ready.clear()

    async def _heartbeat_loop(self) -> None:
        while True:
            with _logged("heartbeat"):
                live = [record.attempt_id for record in self.store.all() if record.state.is_live]
                self.send(Heartbeat(attempt_ids=live, uptime_s=round(time.monotonic() - self.started_at, 3)))
            await asyncio.sleep(self.heartbeat_interval_s)

    async def _telemetry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.telemetry_interval_s)
            with _logged("telemetry"):
                load = self.gpu_load()
                samples = [
                    self.health.assess(self._attribute(sample))
                    for sample in self.backend.sample(load, utc_now())
                ]
                if self.connected:
                    self.send(TelemetryBatch(samples=samples, dropped_samples=self.dropped_samples))
                    self.dropped_samples = 0
                else:
                    self.dropped_samples += len(samples)

    async def _monitor_loop(self) -> None:
        """Track status and logs; now and then apply the last desired set again (level-triggered:
        an action that failed, say a stop the runtime refused, is retried without a new message)."""
        loop = asyncio.get_running_loop()
        next_resync = loop.time() + self.config.resync_interval_s
        while True:
            await asyncio.sleep(self.config.monitor_interval_s)
            with _logged("monitor"):
                await self.refresh()
                self.flush_logs()
                self._maybe_resend_lost_logs()
                self.scan_for_checkpoints()
                self.shells.close_idle()
            if loop.time() >= next_resync:
                next_resync = loop.time() + self.config.resync_interval_s
                if self.connected and self.last_desired is not None and not self.reconcile_lock.locked():
                    self._spawn(self.apply_desired(self.last_desired))

    def send(self, message: AgentToPortal) -> None:
        is_shell = isinstance(message, ShellOutput | ShellExit)
        if is_shell and not self.connected:
            return  # no portal could place it: shell sessions end with their connection
        self.outbox.append(message)
        if isinstance(message, LogChunk):
            self.outbox_log_bytes += len(message.text)
        elif isinstance(message, ShellOutput):
            self.outbox_shell_chars += len(message.data)
        if is_shell:
            self.outbox_shell_messages += 1
        while len(self.outbox) > OUTBOX_LIMIT or self.outbox_log_bytes > OUTBOX_LOG_BYTES:
            dropped = self._drop_oldest_but_shell()
            if dropped is None:
                break  # shell messages only: they are bounded by waiting (_room_for_shell_output)
            self.outbox_dropped += 1
            if isinstance(dropped, LogChunk):
                end = dropped.seq + dropped.text.count("\n")
                self._note_lost_lines(dropped.attempt_id, dropped.stream, dropped.seq, end)
        self.outbox_ready.set()

    def _drop_oldest_but_shell(self) -> AgentToPortal | None:
        """Remove the oldest message that is not a shell message: a dropped shell_output would
        corrupt a terminal's stream and a dropped shell_exit would leave a session that never
        ends, while a dropped log chunk is read again later (lost lines). Only the shell messages
        ahead of it are looked at, and OUTBOX_SHELL_MESSAGES keeps them few."""
        if self.outbox_shell_messages == len(self.outbox):
            return None
        for index, message in enumerate(self.outbox):
            if not isinstance(message, ShellOutput | ShellExit):
                del self.outbox[index]
                if isinstance(message, LogChunk):
                    self.outbox_log_bytes -= len(message.text)
                return message
        return None

    def _note_lost_lines(self, attempt_id: str, stream: LogStream, first: int, end: int) -> None:
        """Lines `first` to `end - 1` of a stream did not reach the portal; one range per stream
        (lines in between that did arrive are sent twice, which the portal ignores)."""
        if (known := self.lost_logs.get((attempt_id, stream))) is not None:
            first, end = min(first, known[0]), max(end, known[1])
        self.lost_logs[(attempt_id, stream)] = (first, end)

    def _pop_outbox(self) -> AgentToPortal:
        message = self.outbox.popleft()
        if isinstance(message, LogChunk):
            self.outbox_log_bytes -= len(message.text)
        elif isinstance(message, ShellOutput | ShellExit):
            if isinstance(message, ShellOutput):
                self.outbox_shell_chars -= len(message.data)
            self.outbox_shell_messages -= 1
            if not self._shell_outbox_full():
                self.shell_room.set()
        return message

    def _drop_shell_messages(self) -> None:
        """Unlike logs, shell messages are not kept for the next connection: their sessions
        ended with this one."""
        self.outbox = deque(
            message for message in self.outbox if not isinstance(message, ShellOutput | ShellExit)
        )
        self.outbox_shell_chars = 0
        self.outbox_shell_messages = 0
        self.shell_room.set()

    def _shell_outbox_full(self) -> bool:
        return (
            self.outbox_shell_chars > OUTBOX_SHELL_CHARS or self.outbox_shell_messages > OUTBOX_SHELL_MESSAGES
        )

    async def _room_for_shell_output(self) -> None:
        """Return once the outbox has room for shell output, or the connection is gone. The
        event is cleared before each wait, so a shell sleeps until the sender (or a disconnect)
        sets it, and looks again then: another shell may have taken the room first."""
        while self.connected and self._shell_outbox_full():
            self.shell_room.clear()
            await self.shell_room.wait()

    def _why_no_shell(self, attempt_id: str) -> str | None:
        """Shells open only in attempts that run and that the agent is not busy with."""
        record = self.store.get(attempt_id)
        if record is None or not record.state.is_live:
            return f"attempt {attempt_id} is not running on this node"
        if record.state != AttemptState.RUNNING:
            return f"attempt {attempt_id} is {record.state}"
        if self._is_busy(attempt_id):
            return f"attempt {attempt_id} is being stopped or checkpointed"
        return None

    def _spawn(self, awaitable: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(awaitable)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent task failed", exc_info=task.exception())

    # ------------------------------------------------------------------ hello

    async def hello(self) -> Hello:
        info: RuntimeInfo = await self.runtime.info()
        if self.toolkit_version is not None:
            info = info.model_copy(update={"nvidia_container_toolkit_version": self.toolkit_version})
        reasons = drain_reasons(info, self.config.minimum_versions, self.check_toolkit)
        gpus = [
            gpu.model_copy(update={"healthy": False, "health_reason": reason})
            if (reason := self.health.reason(gpu.uuid))
            else gpu
            for gpu in self.backend.inventory()
        ]
        return Hello(
            node_name=self.config.node_name,
            agent_version=AGENT_VERSION,
            host=self.backend.host_info(),
            runtime=info,
            gpus=gpus,
            attempts=[
                ReportedAttempt(
                    attempt_id=record.attempt_id,
                    job_id=record.job_id,
                    state=record.state,
                    generation=record.generation,
                    gpu_uuids=record.gpu_uuids,
                    exit_code=record.exit_code,
                    reason=record.reason,
                )
                for record in self.store.all()
            ],
            drain_reason="; ".join(reasons) or None,
        )

    # ------------------------------------------------------------------ status

    async def refresh(self) -> None:
        """Fold what the runtime shows into the records; report every change once."""
        async with self.refresh_lock:
            # A start that ends while the runtime is listed is missing from the listing, yet no
            # longer starting: it counts as starting for this round, not as vanished.
            starting_before = set(self.starting)
            observed = {item.attempt_id: item for item in await self.runtime.list_attempts()}
            records = {record.attempt_id: record for record in self.store.all()}
            for attempt_id, item in observed.items():
                if attempt_id not in records:  # a container whose record was lost with the state dir
                    records[attempt_id] = AttemptRecord(
                        attempt_id=attempt_id, job_id=item.job_id, state=AttemptState.STARTING, generation=0
                    )
                    self.store.put(records[attempt_id])
            starting = starting_before | self.starting
            for record in records.values():
                self._fold(record, observed.get(record.attempt_id), starting)

    def _fold(self, record: AttemptRecord, observed: ObservedAttempt | None, starting: set[str]) -> None:
        if record.state.is_terminal:
            return
        if record.state == AttemptState.CHECKPOINTING and record.attempt_id in self.busy:
            return  # the checkpoint flow decides the outcome (checkpointed or not) itself
        exit_code, reason, message = None, None, ""
        if observed is None:
            if record.attempt_id in starting:
                return  # the runtime has not created it yet; the start settles it (even if stopped)
            state, reason, message = (
                AttemptState.VANISHED,
                ExitReason.VANISHED,
                "no process or container found",
            )
        elif observed.state.is_terminal:
            state, exit_code = observed.state, observed.exit_code
            if observed.state == AttemptState.VANISHED:
                reason, message = ExitReason.VANISHED, "ended without an exit code"
            elif record.stop_reason is not None:
                reason = record.stop_reason
            else:
                reason = ExitReason.SUCCEEDED if exit_code == 0 else ExitReason.FAILED
        elif record.state in (AttemptState.STOPPING, AttemptState.CHECKPOINTING):
            return  # the agent's own operation in progress outranks what the runtime shows
        else:
            state = observed.state
        if state != record.state:
            self._set_state(record, state, exit_code=exit_code, reason=reason, message=message)

    def _set_state(
        self,
        record: AttemptRecord,
        state: AttemptState,
        exit_code: int | None = None,
        reason: ExitReason | None = None,
        message: str = "",
        stop_reason: ExitReason | None = None,
    ) -> None:
        record.state = state
        record.generation += 1
        record.exit_code = exit_code
        record.reason = reason
        record.message = message
        if stop_reason is not None:
            record.stop_reason = stop_reason
        self.store.put(record)
        self.send(self._status(record))
        self.shells.attempt_changed(record.attempt_id, state)

    def _status(self, record: AttemptRecord) -> AttemptStatus:
        return AttemptStatus(
            attempt_id=record.attempt_id,
            job_id=record.job_id,
            state=record.state,
            generation=record.generation,
            time=utc_now(),
            exit_code=record.exit_code,
            reason=record.reason,
            message=record.message[:4096],
        )

    def _attribute(self, sample: GpuSample) -> GpuSample:
        """Name the attempt of each GPU process; a process of no attempt stays unnamed (worth a look)."""
        if not any(process.attempt_id is None for process in sample.processes):
            return sample
        processes = [
            process
            if process.attempt_id is not None
            else process.model_copy(update={"attempt_id": self.runtime.attempt_of_pid(process.pid)})
            for process in sample.processes
        ]
        return sample.model_copy(update={"processes": processes})

    def gpu_load(self) -> dict[str, list[GpuLoad]]:
        load: dict[str, list[GpuLoad]] = {}
        for record in self.store.all():
            if record.state.is_live and record.spec is not None:
                busy = record.state != AttemptState.SUSPENDED
                memory = record.spec.resources.gpu_memory_mib
                for uuid in record.gpu_uuids:
                    load.setdefault(uuid, []).append(GpuLoad(record.attempt_id, busy, memory))
        return load

    # ------------------------------------------------------------------ logs

    def ensure_log_pump(self, attempt_id: str) -> None:
        """Stream an attempt's logs once per agent life (from line 0: chunks are idempotent)."""
        if attempt_id not in self.log_pumps:
            self.log_pumps[attempt_id] = asyncio.create_task(self._pump_logs(attempt_id))

    async def _pump_logs(self, attempt_id: str) -> None:
        async def pump(stream: Any) -> None:
            held = 0  # text read since this pump last handed its lines on (an upper bound)
            async for line in self.runtime.logs(attempt_id, stream):
                self.log_buffers.setdefault(attempt_id, []).append(line)
                held += len(line.text) + 1
                if held >= LOG_BUFFER_CHARS:
                    self.flush_logs()
                    held = 0
                    await self._room_for_logs()

        results = await asyncio.gather(*(pump(stream) for stream in LOG_STREAMS), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, RuntimeFailure):
                log.warning("log stream of %s ended: %s", attempt_id, result)
        self.flush_logs()

    async def _room_for_logs(self) -> None:
        """While connected, wait until the outbox holds at most half its log text: a pump that
        reads faster than the portal takes its lines is held back rather than having them
        dropped (and read again later). Disconnected, nothing waits; the outbox drops the oldest."""
        while self.connected and self.outbox_log_bytes > OUTBOX_LOG_BYTES // 2:
            await asyncio.sleep(0.05)

    def _maybe_resend_lost_logs(self) -> None:
        """Start the resend of lost lines while connected, once the outbox has drained below half
        its log limit, unless one runs already. Lines the outbox dropped during a session (a burst
        of output the connection could not keep up with) are so sent in this session, not only
        after the next reconnect."""
        if not self.lost_logs or not self.connected or self.outbox_log_bytes > OUTBOX_LOG_BYTES // 2:
            return
        if self.resending is not None and not self.resending.done():
            return
        self.resending = self._spawn(self._resend_lost_logs())

    async def _resend_lost_logs(self) -> None:
        """Read the lines the outbox dropped again from the runtime, which keeps an attempt's
        output until the attempt is removed, and send them: a long outage costs no output."""
        lost, self.lost_logs = self.lost_logs, {}
        for (attempt_id, stream), (first, end) in lost.items():
            sent = await self._resend_lines(attempt_id, stream, first, end)
            if sent < end and not self.connected:  # gone again: the next session goes on
                self._note_lost_lines(attempt_id, stream, sent, end)
            elif sent < end:
                log.warning(
                    "lines %d-%d of %s's %s could not be read again", sent, end - 1, attempt_id, stream
                )
            else:
                log.info("sent lines %d-%d of %s's %s again", first, end - 1, attempt_id, stream)

    async def _resend_lines(self, attempt_id: str, stream: LogStream, first: int, end: int) -> int:
        """Send lines `first` to `end - 1` again, in small chunks, each once the outbox has room
        (so that they do not push each other out of it); returns the number of the first line not
        sent."""
        batch: list[LogLine] = []
        size = 0
        budget = min(MAX_CHUNK_CHARS, OUTBOX_LOG_BYTES // 4)
        lines = aiter(self.runtime.logs(attempt_id, stream, first))
        while self.connected:
            try:
                # The lines were written before they were sent; a runtime that follows a live
                # attempt would wait for ever for lines it no longer has.
                line = await asyncio.wait_for(anext(lines), LOST_LOGS_READ_TIMEOUT_S)
            except (StopAsyncIteration, RuntimeFailure, TimeoutError):
                break
            batch.append(line)
            size += len(line.text) + 1
            if size >= budget or line.seq >= end - 1:
                while self.connected and self.outbox_log_bytes > OUTBOX_LOG_BYTES // 2:
                    await asyncio.sleep(0.05)
                for chunk in chunk_lines(attempt_id, batch):
                    self.send(chunk)
                first, batch, size = line.seq + 1, [], 0
            if line.seq >= end - 1:
                break
        return first

    def flush_logs(self) -> None:
        buffers, self.log_buffers = self.log_buffers, {}
        for attempt_id, lines in buffers.items():
            ordered = sorted(lines, key=lambda line: (line.stream, line.seq))
            for chunk in chunk_lines(attempt_id, ordered):
                self.send(chunk)

    # ------------------------------------------------------------------ desired set

    async def apply_desired(self, desired: DesiredSet) -> None:
        """Converge to a desired set: stops first, then everything else in order.

        Stops run as tasks of their own (see ``stopping``), so the lock is not held for a grace
        period; a start whose GPUs an attempt still being stopped holds waits for that stop."""
        async with self.reconcile_lock:
            if desired.revision < self.newest_revision:
                log.info(
                    "skipping desired set revision %d: %d arrived since",
                    desired.revision,
                    self.newest_revision,
                )
                return
            await self.refresh()
            for attempt in desired.attempts:
                self.desired_grace[attempt.attempt_id] = attempt.grace_period_s
            local = [
                LocalAttempt(r.attempt_id, r.state, self._grace_s(r), busy=self._is_busy(r.attempt_id))
                for r in self.store.all()
                if r.attempt_id not in self.removing
            ]
            actions = reconcile(desired.attempts, local)
            for action in actions:
                if isinstance(action, Stop):
                    self._spawn_stop(action.attempt_id, action.grace_s)
            for action in actions:
                if isinstance(action, Start):
                    # In the background: an image pull may take minutes, and the sets that come
                    # meanwhile (one that cancels this attempt, say) must not wait for it.
                    self.record_start(action.attempt)
                    self._spawn(
                        self.start_attempt(action.attempt, self._stops_holding_gpus_of(action.attempt))
                    )
                elif isinstance(action, Checkpoint):
                    if self.claim_checkpoint(action.attempt_id) is None:
                        self._spawn(self._checkpoint_quietly(action.attempt_id))
                elif isinstance(action, Suspend | Resume):
                    await self._quietly(
                        self._suspend_or_resume(action.attempt_id, isinstance(action, Suspend))
                    )
                elif isinstance(action, Watch):
                    if action.attempt_id not in self.starting:  # no output before its start ends
                        self.ensure_log_pump(action.attempt_id)
                elif isinstance(action, Report):
                    record = self.store.get(action.attempt_id)
                    if record is not None:
                        self.send(self._status(record))  # same generation: a harmless duplicate
                elif isinstance(action, Remove):
                    self._spawn_remove(action.attempt_id)
            await self.refresh()

    def _grace_s(self, record: AttemptRecord) -> float:
        return self.desired_grace.get(record.attempt_id, record.grace_s)

    def _is_busy(self, attempt_id: str) -> bool:
        return attempt_id in self.busy or attempt_id in self.stopping

    def _spawn_stop(self, attempt_id: str, grace_s: float) -> None:
        """Stop an attempt in a task of its own, noted in ``stopping`` at once (synchronously), so
        that a desired set applied meanwhile leaves it alone and a start needing its GPUs waits."""
        self._spawn_noted(
            self.stopping, attempt_id, self.stop_attempt(attempt_id, grace_s, ExitReason.STOPPED)
        )

    def _spawn_remove(self, attempt_id: str) -> None:
        """Remove an ended attempt in a task of its own, noted in ``removing`` at once, so that a
        desired set applied meanwhile neither waits for it nor removes it a second time."""
        self._spawn_noted(self.removing, attempt_id, self.remove_attempt(attempt_id))

    def _spawn_noted(
        self, under_way: dict[str, asyncio.Task[None]], attempt_id: str, work: Awaitable[None]
    ) -> None:
        task = self._spawn(work)
        under_way[attempt_id] = task

        def done(_: asyncio.Task[None]) -> None:
            if under_way.get(attempt_id) is task:
                del under_way[attempt_id]

        task.add_done_callback(done)

    def _stops_holding_gpus_of(self, attempt: DesiredAttempt) -> list[asyncio.Task[None]]:
        """The stops under way of attempts that hold any of ``attempt``'s GPUs."""
        wanted = {gpu.uuid for gpu in attempt.gpus}
        held = []
        for attempt_id, task in self.stopping.items():
            record = self.store.get(attempt_id)
            if record is not None and wanted.intersection(record.gpu_uuids):
                held.append(task)
        return held

    def record_start(self, attempt: DesiredAttempt) -> None:
        """Synchronous, so that the record exists before any other reconcile looks for it."""
        record = AttemptRecord(
            attempt_id=attempt.attempt_id, job_id=attempt.job_id, spec=attempt, state=AttemptState.STARTING
        )
        self.store.put(record)
        self.send(self._status(record))
        self.starting.add(attempt.attempt_id)

    async def start_attempt(
        self, attempt: DesiredAttempt, after: list[asyncio.Task[None]] | None = None
    ) -> None:
        """Start an attempt that record_start recorded, once the stops in ``after`` (of attempts
        holding its GPUs) ended: the GPUs must be free before it starts."""
        try:
            if after:
                await asyncio.wait(after)
            await self._prepare_resume(attempt)
            record = self.store.get(attempt.attempt_id)
            if record is None or record.state != AttemptState.STARTING:
                # Stopped while it waited for its GPUs or its checkpoint was checked: the runtime
                # has not heard of it yet, so the stop found nothing to stop, and starting it now
                # would run a cancelled job.
                raise RuntimeFailure("stopped before it started")
            if attempt.checkpoint_dir is not None:
                self.markers[attempt.attempt_id] = marker_identity(Path(attempt.checkpoint_dir))
            await self.runtime.start(attempt)
        except (PolicyError, RuntimeFailure, ManifestError) as error:
            log.warning("attempt %s did not start: %s", attempt.attempt_id, error)
            # Progress reports and a stop may have changed the record meanwhile; a stop that came
            # while it was starting (a cancel during an image pull) makes it stopped, not failed.
            record = self.store.get(attempt.attempt_id)
            if record is not None and not record.state.is_terminal:
                reason = record.stop_reason or ExitReason.START_FAILED
                self._set_state(record, AttemptState.EXITED, reason=reason, message=str(error))
            return
        finally:
            self.starting.discard(attempt.attempt_id)
        if self.store.get(attempt.attempt_id) is not None:  # not removed while it started
            self.ensure_log_pump(attempt.attempt_id)
        await self.refresh()
        self.reapply_desired()

    def reapply_desired(self) -> None:
        """Apply the newest desired set of this connection again, now that a start has ended.

        Reconcile gives a starting attempt nothing to do but stream its logs: a set that asked
        to suspend it, or to checkpoint and stop it, while its image was pulled was applied
        without effect. Waiting for the periodic resync would leave it running for up to
        ``resync_interval_s``; applying the set again carries the request out at once.
        """
        if self.connected and self.last_desired is not None:
            self._spawn(self.apply_desired(self.last_desired))

    def report_starting(self, attempt_id: str, message: str) -> None:
        """What a runtime says about a start that takes a while (an image pull), sent as the
        starting attempt's status message: same state, a new generation, so the portal keeps it."""
        record = self.store.get(attempt_id)
        if record is not None and record.state == AttemptState.STARTING and record.message != message:
            self._set_state(record, AttemptState.STARTING, message=message)

    async def _prepare_resume(self, attempt: DesiredAttempt) -> None:
        """A resuming attempt starts only from the committed checkpoint, checked against its
        manifest; the marker is pointed at it, since a newer marker may name a checkpoint whose
        manifest the portal never committed. Raises ManifestError with the reason."""
        if attempt.resume_from is None or attempt.checkpoint_dir is None:
            return
        directory = Path(attempt.checkpoint_dir)
        resume = attempt.resume_from
        try:
            manifest = await asyncio.to_thread(verify_resume, directory, resume)
            await asyncio.to_thread(point_marker_at, directory, manifest)
        except ManifestError as error:
            raise ManifestError(f"cannot resume from checkpoint step {resume.step}: {error}") from error
        except OSError as error:
            raise ManifestError(f"cannot resume from checkpoint step {resume.step}: {error}") from error

    async def stop_attempt(self, attempt_id: str, grace_s: float, reason: ExitReason) -> None:
        record = self.store.get(attempt_id)
        if record is None or record.state.is_terminal:
            return
        if record.state != AttemptState.STOPPING:
            self._set_state(record, AttemptState.STOPPING, stop_reason=reason)
        self.busy.add(attempt_id)
        try:
            await self._quietly(self.runtime.stop(attempt_id, grace_s))
        finally:
            self.busy.discard(attempt_id)
        await self.refresh()

    async def remove_attempt(self, attempt_id: str) -> None:
        pump = self.log_pumps.pop(attempt_id, None)
        if pump is not None:
            # The pump of an ended attempt reads the rest of its output and ends by itself: let it,
            # for a moment. Cancelled at once, it lost the lines written just before the end (a
            # job's "checkpoint requested at step N") whenever the portal removed the attempt
            # before the pump had read them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pump), LOG_DRAIN_ON_REMOVE_S)
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        self.log_buffers.pop(attempt_id, None)
        self.markers.pop(attempt_id, None)
        self.desired_grace.pop(attempt_id, None)
        await self._quietly(self.runtime.remove(attempt_id))
        self.store.delete(attempt_id)

    async def _suspend_or_resume(self, attempt_id: str, suspend: bool) -> None:
        if suspend:
            await self.shells.suspending(attempt_id)
            await self.runtime.suspend(attempt_id)
        else:
            await self.runtime.resume(attempt_id)
        await self.refresh()

    async def _quietly(self, awaitable: Awaitable[Any]) -> None:
        """Runtime errors during reconcile are logged; the next reconcile tries again."""
        try:
            await awaitable
        except RuntimeFailure as error:
            log.warning("%s", error)

    # ------------------------------------------------------------------ requests

    async def handle_request(self, request: PortalRequest) -> None:
        """Carry out a request once and answer it once; a repeated request id gets the same answer."""
        if request.id in self.answers:
            answer = self.answers[request.id]
            if answer is not None:
                self.send(answer)
            return
        self.answers[request.id] = None
        while len(self.answers) > REMEMBERED_REQUESTS:
            self.answers.popitem(last=False)
        try:
            answer = await self._carry_out(request)
        except RuntimeFailure as error:
            answer = RequestReject(request_id=request.id, attempt_id=request.attempt_id, reason=str(error))
        except Exception as error:  # every request gets its one answer, whatever went wrong
            log.exception("request %s failed", request.id)
            answer = RequestReject(
                request_id=request.id, attempt_id=request.attempt_id, reason=f"agent error: {error}"
            )
        self.answers[request.id] = answer
        self.send(answer)

    async def _carry_out(self, request: PortalRequest) -> RequestAck | RequestReject:
        record = self.store.get(request.attempt_id)
        if record is None or not record.state.is_live:
            return RequestReject(
                request_id=request.id,
                attempt_id=request.attempt_id,
                reason=f"attempt {request.attempt_id} is not running on this node",
            )
        # Refused only while the agent itself is busy with the attempt; a stop or checkpoint
        # that an agent restart interrupted may be asked for again.
        busy = self._is_busy(record.attempt_id) or record.state == AttemptState.STARTING
        if busy and isinstance(request, SuspendRequest | ResumeRequest):
            return RequestReject(
                request_id=request.id,
                attempt_id=request.attempt_id,
                reason=f"attempt {request.attempt_id} is {record.state}",
            )
        if isinstance(request, SignalRequest):
            await self.runtime.signal(request.attempt_id, request.signal)
        elif isinstance(request, SuspendRequest | ResumeRequest):
            await self._suspend_or_resume(request.attempt_id, isinstance(request, SuspendRequest))
        elif isinstance(request, StopRequest):
            grace = request.grace_period_s if request.grace_period_s is not None else self._grace_s(record)
            await self.stop_attempt(request.attempt_id, grace, ExitReason.STOPPED)
        elif isinstance(request, CheckpointRequest):
            problem = self.claim_checkpoint(request.attempt_id)
            if problem is None:
                problem = await self.checkpoint_attempt(
                    request.attempt_id, request.grace_period_s, request.id
                )
            if problem is not None:
                return RequestReject(request_id=request.id, attempt_id=request.attempt_id, reason=problem)
        return RequestAck(request_id=request.id, attempt_id=request.attempt_id)

    def claim_checkpoint(self, attempt_id: str) -> str | None:
        """Mark the attempt busy for a checkpoint; the reason it cannot be checkpointed otherwise.

        Synchronous on purpose: the claim and the check happen without a suspension point,
        so a request and a desired set cannot both start a checkpoint of one attempt.
        """
        record = self.store.get(attempt_id)
        if record is None or record.state not in CHECKPOINTABLE_STATES:
            state = record.state if record is not None else "unknown"
            return f"attempt {attempt_id} cannot be checkpointed: it is {state} on this node"
        if self._is_busy(attempt_id):
            return f"attempt {attempt_id} is already being stopped or checkpointed"
        if record.spec is None or record.spec.checkpoint_dir is None:
            return f"attempt {attempt_id} has no checkpoint directory"
        self.busy.add(attempt_id)
        return None

    async def checkpoint_attempt(
        self, attempt_id: str, grace_s: float | None, request_id: UUID | None
    ) -> str | None:
        """Signal, wait for a new marker up to the grace period, stop, report checkpoint_done.

        Call only after a successful :meth:`claim_checkpoint`. Returns None when a checkpoint
        was taken, else the problem. Without a marker in time the attempt is stopped all the
        same (the portal wants the GPUs back): the job resumes from its last complete
        checkpoint.
        """
        try:
            record = self.store.get(attempt_id)
            assert record is not None and record.spec is not None  # claim_checkpoint checked both
            spec = record.spec
            assert spec.checkpoint_dir is not None
            grace = grace_s if grace_s is not None else self._grace_s(record)
            directory = Path(spec.checkpoint_dir).resolve()
            before = marker_identity(directory)
            if record.state == AttemptState.SUSPENDED:
                await self.runtime.resume(attempt_id)  # a frozen job cannot save
            if record.state != AttemptState.CHECKPOINTING:
                # "checkpointed" only once checkpoint_done is sent (the stop below sets it): an
                # agent that dies before that must not call the attempt checkpointed.
                self._set_state(record, AttemptState.CHECKPOINTING, stop_reason=ExitReason.STOPPED)
            await self.runtime.signal(attempt_id, spec.checkpoint_signal)
            try:
                found = await wait_for_new_marker(directory, before, grace, self._still_running(attempt_id))
                problem = None if found else f"no new checkpoint marker within {grace:g}s"
                if found is not None:
                    self.send(await self._published(attempt_id, request_id, directory, found))
            except (BadMarkerError, ManifestError, ValidationError) as error:
                found, problem = None, str(error)
            except OSError as error:
                found, problem = None, f"checkpoint manifest not written: {error}"
        finally:
            self.busy.discard(attempt_id)
        reason = ExitReason.CHECKPOINTED if found is not None else ExitReason.STOPPED
        await self.stop_attempt(attempt_id, grace, reason)
        return problem

    async def _published(
        self, attempt_id: str, request_id: UUID | None, directory: Path, found: FoundCheckpoint
    ) -> CheckpointDone:
        """Build and publish the checkpoint's manifest; the report to send once it is on disk (the
        portal commits both at once). Hashing a large checkpoint takes a while, so it runs off the
        event loop and heartbeats go on. Raises ManifestError or OSError."""
        manifest = await asyncio.to_thread(build_manifest, directory, found)
        published: PublishedManifest = await asyncio.to_thread(publish_manifest, directory, manifest)
        return CheckpointDone(
            attempt_id=attempt_id,
            request_id=request_id,
            path=str(found.path),
            size_bytes=manifest.size_bytes,
            step=found.step,
            time=found.time,
            metric=found.metric,
            metric_mode=manifest.metric_mode,
            manifest_path=published.relative_path,
            manifest_sha256=published.sha256,
            files=manifest.files,
        )

    def scan_for_checkpoints(self) -> None:
        """Report the checkpoints running jobs save on their own (periodic saves), each with its
        manifest, so that a lost attempt resumes from the newest and old ones can be collected.
        The first look at an attempt after an agent restart only notes its marker."""
        for record in self.store.all():
            spec = record.spec
            if record.state != AttemptState.RUNNING or spec is None or spec.checkpoint_dir is None:
                continue
            if record.attempt_id in self.busy or record.attempt_id in self.scanning:
                continue
            directory = Path(spec.checkpoint_dir).resolve()
            current = marker_identity(directory)
            if record.attempt_id not in self.markers:
                self.markers[record.attempt_id] = current
            elif current is not None and current != self.markers[record.attempt_id]:
                self.markers[record.attempt_id] = current
                self.scanning.add(record.attempt_id)
                self._spawn(self._report_saved_checkpoint(record.attempt_id, directory))

    async def _report_saved_checkpoint(self, attempt_id: str, directory: Path) -> None:
        try:
            found = await asyncio.to_thread(read_marker, directory)  # walks the checkpoint: off the loop
            self.send(await self._published(attempt_id, None, directory, found))
        except (BadMarkerError, ManifestError, OSError, ValidationError) as error:
            log.warning("checkpoint of %s not reported: %s", attempt_id, error)
        finally:
            self.scanning.discard(attempt_id)

    async def _checkpoint_quietly(self, attempt_id: str) -> None:
        problem = await self.checkpoint_attempt(attempt_id, None, None)
        if problem is not None:
            log.warning("checkpoint of %s: %s", attempt_id, problem)

    def _still_running(self, attempt_id: str) -> Callable[[], Awaitable[bool]]:
        async def still_running() -> bool:
            observed = [item for item in await self.runtime.list_attempts() if item.attempt_id == attempt_id]
            return bool(observed) and observed[0].state.is_live

        return still_running

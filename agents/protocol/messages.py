"""Every message between the node agent and the portal, defined once.

Two discriminated unions, one per direction: :data:`AgentToPortal` and
:data:`PortalToAgent`. Each model is a complete wire message: the envelope fields
``v`` (protocol version), ``type`` (the discriminator) and ``id`` (a fresh uuid per
message; for portal requests it is also the request id that the answer refers to),
followed by the message's own fields. docs/agent.md describes the semantics.

Models are frozen and forbid unknown fields, so a typo on either side fails loudly in
tests instead of being dropped on the wire.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal
from uuid import UUID, uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from agents.protocol.states import AttemptState, ExitReason

PROTOCOL_VERSION = 1

# Attempt and job ids end up in file names, container labels and log lines: keep them
# to a conservative alphabet so none of those places needs escaping.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
EnvValue = Annotated[str, StringConstraints(max_length=32768)]
GpuUuid = Annotated[str, StringConstraints(min_length=1, max_length=96)]
Seconds = Annotated[float, Field(ge=0, le=86400)]
Interval = Annotated[float, Field(ge=1, le=3600)]
SignalName = Literal["SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGKILL"]
LogStream = Literal["stdout", "stderr"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Message(_Model):
    v: int = PROTOCOL_VERSION
    id: UUID = Field(default_factory=uuid4)


# ---------------------------------------------------------------------------
# Parts shared by several messages
# ---------------------------------------------------------------------------


class GpuTopology(_Model):
    """Where a GPU sits: the scheduler prefers NVLink group > PCIe switch > NUMA node > host."""

    numa_node: int | None = None
    pcie_switch: str | None = None  # opaque id, unique on the host; GPUs behind one switch share it
    nvlink_group: str | None = None  # opaque id; GPUs connected by NVLink (directly or via NVSwitch)
    nvlink_peers: list[GpuUuid] = []  # uuids of GPUs with a direct or switched NVLink path


class GpuInfo(_Model):
    """One GPU of the node's inventory."""

    index: int = Field(ge=0)
    uuid: GpuUuid
    model: str
    memory_total_mib: int = Field(ge=0)
    pci_bus_id: str = ""
    topology: GpuTopology = GpuTopology()
    healthy: bool = True
    health_reason: str | None = None


class HostInfo(_Model):
    hostname: str
    cpu_count: int = Field(ge=1)
    memory_total_mib: int = Field(ge=0)
    numa_nodes: int = Field(ge=1, default=1)
    simulated: bool = False  # True when the GPUs come from a simulated host description
    driver_version: str | None = None


class RuntimeInfo(_Model):
    """The container runtime and the versions the version gate looked at."""

    kind: Literal["docker", "process"]
    version: str | None = None  # Docker engine version; None for the process runtime
    runc_version: str | None = None
    nvidia_container_toolkit_version: str | None = None


class ReportedAttempt(_Model):
    """An attempt the agent finds on its node (hello): live, or ended and not yet cleaned up."""

    attempt_id: Identifier
    job_id: Identifier
    state: AttemptState
    generation: int = Field(ge=0)
    gpu_uuids: list[GpuUuid] = []
    exit_code: int | None = None
    reason: ExitReason | None = None


class GpuProcess(_Model):
    pid: int
    used_memory_mib: int | None = None
    attempt_id: Identifier | None = None  # set when the agent can tell which attempt owns the pid


class GpuSample(_Model):
    """One reading of one GPU. Metrics are None when the device does not support them."""

    gpu_uuid: GpuUuid
    time: AwareDatetime
    utilization_pct: float | None = Field(default=None, ge=0, le=100)
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    energy_j: float | None = None  # total energy counter since driver load; monotone
    ecc_corrected: int | None = None  # volatile counts since driver load
    ecc_uncorrected: int | None = None
    xid_events: list[int] = []  # Xid codes seen since the previous sample
    processes: list[GpuProcess] = []
    healthy: bool = True
    health_reason: str | None = None  # why unhealthy: "xid 79", "ecc uncorrected 2", "nvml: ..."


class Mount(_Model):
    source: str = Field(
        min_length=1, max_length=4096
    )  # host path; must lie in a volume root the admin allowed
    target: str = Field(min_length=1, max_length=4096)  # absolute path in the container
    read_only: bool = True


class Resources(_Model):
    cpus: float = Field(gt=0, le=4096)
    memory_mib: int = Field(gt=0)
    pids: int = Field(default=4096, gt=0, le=1_000_000)
    gpu_memory_mib: int | None = Field(default=None, gt=0)  # per GPU, informational (time slicing)


class GpuRef(_Model):
    uuid: GpuUuid
    index: int = Field(ge=0)


Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
RelativePath = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class ManifestFile(_Model):
    """One file of a checkpoint: its path relative to the checkpoint directory, size, sha256."""

    path: RelativePath
    size: int = Field(ge=0)
    sha256: Sha256


class ResumeFrom(_Model):
    """The committed checkpoint a resuming attempt starts from. The agent checks the manifest
    file against ``manifest_sha256`` and every file against the manifest before it starts."""

    step: int = Field(ge=0)
    path: RelativePath
    manifest_path: RelativePath
    manifest_sha256: Sha256


class DesiredAttempt(_Model):
    """One attempt that should exist on the node, with everything needed to start it.

    ``run_state`` is the level-triggered suspend switch used by time slicing: the agent
    pauses or unpauses the attempt until it matches. ``checkpoint_and_stop`` is the
    level-triggered form of a checkpoint request (preemption): while it is set, the agent
    checkpoints the attempt (signal, marker, stop) unless it is already doing so, so a
    request lost with a connection cannot turn a preemption into a plain kill. ``image`` is
    ignored by the process runtime. ``resume_from`` names the committed checkpoint a
    resuming attempt starts from (see agents.checkpoint).
    """

    attempt_id: Identifier
    job_id: Identifier
    image: str = Field(max_length=512)
    command: list[str] = Field(min_length=1)
    env: dict[EnvName, EnvValue] = {}
    mounts: list[Mount] = []
    resources: Resources
    gpus: list[GpuRef] = []
    checkpoint_dir: str | None = None
    resume: bool = False
    checkpoint_signal: SignalName = "SIGUSR1"
    grace_period_s: Seconds = 30.0
    time_sliced: bool = False
    run_state: Literal["running", "suspended"] = "running"
    checkpoint_and_stop: bool = False
    resume_from: ResumeFrom | None = None
    # Which replica of the job's attempt this is, of how many, and the node of each (in replica
    # order): what a distributed job needs to find its rank and its peers.
    replica: int = Field(ge=0, default=0)
    replicas: int = Field(ge=1, default=1)
    replica_nodes: list[Annotated[str, StringConstraints(min_length=1, max_length=253)]] = []


# ---------------------------------------------------------------------------
# Agent -> portal
# ---------------------------------------------------------------------------


class Hello(_Message):
    """First message on every connection: who the node is and what it runs right now.

    ``attempts`` lists every attempt the agent finds (live ones and ended ones it has not
    cleaned up), so the portal can reconcile after any disconnect. ``drain_reason`` is set
    when the agent's own checks (for example the runtime version gate) say that the node
    must not receive new work.
    """

    type: Literal["hello"] = "hello"
    node_name: str = Field(min_length=1, max_length=253)
    agent_version: str
    host: HostInfo
    runtime: RuntimeInfo
    gpus: list[GpuInfo]
    attempts: list[ReportedAttempt] = []
    drain_reason: str | None = None


class Heartbeat(_Message):
    type: Literal["heartbeat"] = "heartbeat"
    attempt_ids: list[Identifier] = []  # live attempts, a cheap cross-check for the portal
    uptime_s: float = Field(ge=0)


class TelemetryBatch(_Message):
    type: Literal["telemetry"] = "telemetry"
    samples: list[GpuSample]
    dropped_samples: int = Field(default=0, ge=0)  # discarded while disconnected, since the last batch


class AttemptStatus(_Message):
    """A state report for one attempt; see agents.protocol.states for how to order them."""

    type: Literal["attempt_status"] = "attempt_status"
    attempt_id: Identifier
    job_id: Identifier
    state: AttemptState
    generation: int = Field(ge=0)
    time: AwareDatetime
    exit_code: int | None = None  # 128+N when killed by signal N, as Docker reports it
    reason: ExitReason | None = None
    message: str = Field(default="", max_length=4096)


class LogChunk(_Message):
    """Consecutive lines of one stream of one attempt.

    ``seq`` is the 0-based line number of the first line in ``text``, counted per attempt
    and stream. A chunk may be sent again (after a reconnect or agent restart); the
    receiver keeps lines by ``(attempt_id, stream, seq)`` and ignores what it has.
    """

    type: Literal["log"] = "log"
    attempt_id: Identifier
    stream: LogStream
    seq: int = Field(ge=0)
    text: str = Field(max_length=1_048_576)


class CheckpointDone(_Message):
    """The job wrote a checkpoint marker after a checkpoint request (see agents.checkpoint), and
    the agent published its manifest (``manifest_path``, relative to the checkpoint directory,
    whose bytes hash to ``manifest_sha256``; ``files`` repeats its content). The portal commits
    only checkpoints that come with a manifest."""

    type: Literal["checkpoint_done"] = "checkpoint_done"
    attempt_id: Identifier
    request_id: UUID | None = None
    path: str
    size_bytes: int = Field(ge=0)
    step: int = Field(ge=0)
    time: AwareDatetime
    metric: float | None = Field(default=None, allow_inf_nan=False)
    metric_mode: Literal["min", "max"] = "min"
    manifest_path: RelativePath | None = None
    manifest_sha256: Sha256 | None = None
    files: list[ManifestFile] = Field(default=[], max_length=10_000)


class RequestAck(_Message):
    """The request ``request_id`` was carried out (checkpoint: after checkpoint_done)."""

    type: Literal["request_ack"] = "request_ack"
    request_id: UUID
    attempt_id: Identifier


class RequestReject(_Message):
    """The request ``request_id`` was refused or failed; nothing more will come for it."""

    type: Literal["request_reject"] = "request_reject"
    request_id: UUID
    attempt_id: Identifier | None = None
    reason: str = Field(max_length=4096)


class ShellOutput(_Message):
    """What a shell session's terminal wrote, in order (``seq`` counts the session's messages
    from 0). Bytes that are not UTF-8 arrive replaced; a character is never split."""

    type: Literal["shell_output"] = "shell_output"
    session: Identifier
    seq: int = Field(ge=0)
    data: str = Field(max_length=65536)


class ShellExit(_Message):
    """The shell session ended (its process exited, it was closed, its attempt ended) or could
    not open; ``reason`` says why in words. Nothing more comes for the session."""

    type: Literal["shell_exit"] = "shell_exit"
    session: Identifier
    exit_code: int | None = None
    reason: str = Field(default="", max_length=4096)


# ---------------------------------------------------------------------------
# Portal -> agent
# ---------------------------------------------------------------------------


class Welcome(_Message):
    """The portal accepted the hello. Intervals, when set, override the agent's defaults."""

    type: Literal["welcome"] = "welcome"
    node_id: str
    heartbeat_interval_s: Interval | None = None
    telemetry_interval_s: Interval | None = None


class DesiredSet(_Message):
    """The full list of attempts that should run on this node (level-triggered).

    Anything running that is not in the list is stopped with its grace period; anything
    in the list that is not running is started, unless it already ran here and ended (an
    attempt runs at most once). ``revision`` increases with every change on the portal;
    the agent skips a set when a newer one arrived on the same connection meanwhile.
    """

    type: Literal["desired_set"] = "desired_set"
    revision: int = Field(ge=0)
    attempts: list[DesiredAttempt]


class SignalRequest(_Message):
    type: Literal["signal"] = "signal"
    attempt_id: Identifier
    signal: SignalName


class CheckpointRequest(_Message):
    """Send the attempt's checkpoint signal, wait for the marker, stop, report checkpoint_done."""

    type: Literal["checkpoint"] = "checkpoint"
    attempt_id: Identifier
    grace_period_s: Seconds | None = None  # None: the attempt's own grace period


class SuspendRequest(_Message):
    type: Literal["suspend"] = "suspend"
    attempt_id: Identifier


class ResumeRequest(_Message):
    type: Literal["resume"] = "resume"
    attempt_id: Identifier


class StopRequest(_Message):
    """SIGTERM, then SIGKILL after the grace period."""

    type: Literal["stop"] = "stop"
    attempt_id: Identifier
    grace_period_s: Seconds | None = None  # None: the attempt's own grace period


class ShellOpen(_Message):
    """Open an interactive shell inside a running attempt: ``command`` on a pseudo-terminal of
    ``cols`` x ``rows``, in the attempt's container (or, for the process runtime, its working
    directory and environment). The agent answers with shell_output messages and, once, a
    shell_exit; ``session`` (chosen by the portal, unguessable) names it in every message."""

    type: Literal["shell_open"] = "shell_open"
    session: Identifier
    attempt_id: Identifier
    command: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        default=["/bin/sh"], min_length=1, max_length=64
    )
    cols: int = Field(default=80, ge=1, le=1000)
    rows: int = Field(default=24, ge=1, le=1000)


class ShellInput(_Message):
    """Keystrokes for the session's terminal, as typed (control characters included)."""

    type: Literal["shell_input"] = "shell_input"
    session: Identifier
    data: str = Field(min_length=1, max_length=65536)


class ShellResize(_Message):
    type: Literal["shell_resize"] = "shell_resize"
    session: Identifier
    cols: int = Field(ge=1, le=1000)
    rows: int = Field(ge=1, le=1000)


class ShellClose(_Message):
    """End the session: its process is hung up on (SIGHUP, then killed)."""

    type: Literal["shell_close"] = "shell_close"
    session: Identifier


AgentToPortal = Annotated[
    Hello
    | Heartbeat
    | TelemetryBatch
    | AttemptStatus
    | LogChunk
    | CheckpointDone
    | RequestAck
    | RequestReject
    | ShellOutput
    | ShellExit,
    Field(discriminator="type"),
]
PortalToAgent = Annotated[
    Welcome
    | DesiredSet
    | SignalRequest
    | CheckpointRequest
    | SuspendRequest
    | ResumeRequest
    | StopRequest
    | ShellOpen
    | ShellInput
    | ShellResize
    | ShellClose,
    Field(discriminator="type"),
]
ShellMessage = ShellOpen | ShellInput | ShellResize | ShellClose
PortalRequest = SignalRequest | CheckpointRequest | SuspendRequest | ResumeRequest | StopRequest

AGENT_TO_PORTAL_TYPES: tuple[type[_Message], ...] = (
    Hello,
    Heartbeat,
    TelemetryBatch,
    AttemptStatus,
    LogChunk,
    CheckpointDone,
    RequestAck,
    RequestReject,
    ShellOutput,
    ShellExit,
)
PORTAL_TO_AGENT_TYPES: tuple[type[_Message], ...] = (
    Welcome,
    DesiredSet,
    SignalRequest,
    CheckpointRequest,
    SuspendRequest,
    ResumeRequest,
    StopRequest,
    ShellOpen,
    ShellInput,
    ShellResize,
    ShellClose,
)


def utc_now() -> datetime:
    """The timestamp type every message uses (aware, UTC)."""
    return datetime.now(UTC)

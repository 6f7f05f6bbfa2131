"""The agent <-> portal wire protocol: the only place that turns messages into JSON and back.

Both the agent (agents.connection) and the portal's websocket gateway import from here
and call :func:`encode` / :func:`decode_from_agent` / :func:`decode_from_portal`; no
other code touches raw JSON. See docs/agent.md for the message flow.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from agents.protocol.messages import (
    AGENT_TO_PORTAL_TYPES,
    PORTAL_TO_AGENT_TYPES,
    PROTOCOL_VERSION,
    AgentToPortal,
    AttemptStatus,
    CheckpointDone,
    CheckpointRequest,
    DesiredAttempt,
    DesiredSet,
    GpuInfo,
    GpuProcess,
    GpuRef,
    GpuSample,
    GpuTopology,
    Heartbeat,
    Hello,
    HostInfo,
    LogChunk,
    ManifestFile,
    Mount,
    PortalRequest,
    PortalToAgent,
    ReportedAttempt,
    RequestAck,
    RequestReject,
    Resources,
    ResumeFrom,
    ResumeRequest,
    RuntimeInfo,
    ShellClose,
    ShellExit,
    ShellInput,
    ShellMessage,
    ShellOpen,
    ShellOutput,
    ShellResize,
    SignalRequest,
    StopRequest,
    SuspendRequest,
    TelemetryBatch,
    Welcome,
    utc_now,
)
from agents.protocol.states import TERMINAL_STATES, AttemptState, ExitReason, order_key, supersedes

MAX_MESSAGE_BYTES = 8 * 1024 * 1024

Message = AgentToPortal | PortalToAgent

_agent_to_portal: TypeAdapter[AgentToPortal] = TypeAdapter(AgentToPortal)
_portal_to_agent: TypeAdapter[PortalToAgent] = TypeAdapter(PortalToAgent)
_AGENT_TYPES = {cls.model_fields["type"].default for cls in AGENT_TO_PORTAL_TYPES}
_PORTAL_TYPES = {cls.model_fields["type"].default for cls in PORTAL_TO_AGENT_TYPES}


class ProtocolError(ValueError):
    """The text is not a valid message of this protocol version and direction."""


class UnsupportedVersionError(ProtocolError):
    """The message carries a protocol version this side does not speak."""


def encode(message: Message) -> str:
    """Serialise one message to its JSON wire form."""
    return message.model_dump_json()


def decode_from_agent(text: str | bytes) -> AgentToPortal:
    """Parse a message an agent sent (used by the portal's gateway)."""
    data = _envelope(text, _AGENT_TYPES, "agent -> portal")
    try:
        return _agent_to_portal.validate_python(data)
    except ValidationError as error:
        raise ProtocolError(f"invalid {data['type']!r} message: {_summary(error)}") from error


def decode_from_portal(text: str | bytes) -> PortalToAgent:
    """Parse a message the portal sent (used by the agent)."""
    data = _envelope(text, _PORTAL_TYPES, "portal -> agent")
    try:
        return _portal_to_agent.validate_python(data)
    except ValidationError as error:
        raise ProtocolError(f"invalid {data['type']!r} message: {_summary(error)}") from error


def decode(text: str | bytes) -> Message:
    """Parse a message of either direction (tests, tools); prefer the directional decoders."""
    data = _envelope(text, _AGENT_TYPES | _PORTAL_TYPES, "any")
    if data["type"] in _AGENT_TYPES:
        return decode_from_agent(text)
    return decode_from_portal(text)


def _envelope(text: str | bytes, allowed_types: set[str], direction: str) -> dict[str, Any]:
    """Check the envelope before validating the body, so the error says what is wrong."""
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(text)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}")
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ProtocolError(f"message is not JSON: {error}") from error
    if not isinstance(data, dict):
        raise ProtocolError("message is not a JSON object")
    version = data.get("v")
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersionError(
            f"protocol version {version!r} is not supported (this side speaks v{PROTOCOL_VERSION})"
        )
    message_type = data.get("type")
    if message_type not in allowed_types:
        raise ProtocolError(f"unknown message type {message_type!r} for direction {direction}")
    return data


def _summary(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        # The first location part is the union's discriminator tag, already in the message.
        location = ".".join(str(part) for part in item["loc"][1:]) or "message"
        parts.append(f"{location}: {item['msg']}")
    return "; ".join(parts)


__all__ = [
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "TERMINAL_STATES",
    "AgentToPortal",
    "AttemptState",
    "AttemptStatus",
    "CheckpointDone",
    "CheckpointRequest",
    "DesiredAttempt",
    "DesiredSet",
    "ExitReason",
    "GpuInfo",
    "GpuProcess",
    "GpuRef",
    "GpuSample",
    "GpuTopology",
    "Heartbeat",
    "Hello",
    "HostInfo",
    "LogChunk",
    "ManifestFile",
    "Message",
    "Mount",
    "PortalRequest",
    "PortalToAgent",
    "ProtocolError",
    "ReportedAttempt",
    "RequestAck",
    "RequestReject",
    "Resources",
    "ResumeFrom",
    "ResumeRequest",
    "RuntimeInfo",
    "ShellClose",
    "ShellExit",
    "ShellInput",
    "ShellMessage",
    "ShellOpen",
    "ShellOutput",
    "ShellResize",
    "SignalRequest",
    "StopRequest",
    "SuspendRequest",
    "TelemetryBatch",
    "UnsupportedVersionError",
    "Welcome",
    "decode",
    "decode_from_agent",
    "decode_from_portal",
    "encode",
    "order_key",
    "supersedes",
    "utc_now",
]

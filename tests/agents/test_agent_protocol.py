"""The wire protocol: golden files round-trip, errors are clear, the schema does not drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents import protocol
from agents.protocol.messages import AGENT_TO_PORTAL_TYPES, PORTAL_TO_AGENT_TYPES
from agents.protocol.schema import SCHEMA_PATH, render

GOLDEN_DIR = Path(__file__).parent.parent / "testdata" / "protocol"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[path.stem for path in GOLDEN_FILES])
def test_golden_message_round_trips(path: Path) -> None:
    text = path.read_text()
    message = protocol.decode(text)
    assert json.loads(protocol.encode(message)) == json.loads(text)
    assert protocol.decode(protocol.encode(message)) == message


def test_every_message_type_has_a_golden_file() -> None:
    golden_types = {json.loads(path.read_text())["type"] for path in GOLDEN_FILES}
    all_types = {cls.model_fields["type"].default for cls in AGENT_TO_PORTAL_TYPES + PORTAL_TO_AGENT_TYPES}
    assert golden_types == all_types


def test_directional_decoders_refuse_the_other_direction() -> None:
    welcome = (GOLDEN_DIR / "welcome.json").read_text()
    hello = (GOLDEN_DIR / "hello.json").read_text()
    assert isinstance(protocol.decode_from_portal(welcome), protocol.Welcome)
    assert isinstance(protocol.decode_from_agent(hello), protocol.Hello)
    with pytest.raises(protocol.ProtocolError, match="unknown message type 'welcome'"):
        protocol.decode_from_agent(welcome)
    with pytest.raises(protocol.ProtocolError, match="unknown message type 'hello'"):
        protocol.decode_from_portal(hello)


def _golden(name: str) -> dict[str, object]:
    return json.loads((GOLDEN_DIR / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda m: m.update(v=2), protocol.UnsupportedVersionError, r"protocol version 2 is not supported"),
        (lambda m: m.pop("v"), protocol.UnsupportedVersionError, r"protocol version None"),
        (lambda m: m.update(type="reboot"), protocol.ProtocolError, r"unknown message type 'reboot'"),
        (lambda m: m.update(surprise=1), protocol.ProtocolError, r"invalid 'stop' message: surprise"),
        (lambda m: m.update(attempt_id="../etc"), protocol.ProtocolError, r"attempt_id"),
        (lambda m: m.update(grace_period_s=-1), protocol.ProtocolError, r"grace_period_s"),
        (lambda m: m.update(id="not-a-uuid"), protocol.ProtocolError, r"id"),
    ],
    ids=[
        "future-version",
        "no-version",
        "unknown-type",
        "extra-field",
        "bad-id",
        "negative-grace",
        "bad-uuid",
    ],
)
def test_bad_messages_raise_a_clear_error(mutate, error, match) -> None:
    message = _golden("stop")
    mutate(message)
    with pytest.raises(error, match=match):
        protocol.decode(json.dumps(message))


@pytest.mark.parametrize(
    "text", ["", "not json", "[1, 2]", '"hello"'], ids=["empty", "garbage", "list", "string"]
)
def test_non_objects_are_refused(text: str) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(text)


def test_desired_attempt_refuses_a_bad_signal_and_bad_env_names() -> None:
    message = _golden("desired_set")
    message["attempts"][0]["checkpoint_signal"] = "SIGSTOP"
    with pytest.raises(protocol.ProtocolError, match="checkpoint_signal"):
        protocol.decode(json.dumps(message))
    message = _golden("desired_set")
    message["attempts"][0]["env"] = {"A=B": "x"}
    with pytest.raises(protocol.ProtocolError, match="env"):
        protocol.decode(json.dumps(message))


def test_messages_get_a_fresh_id_and_the_current_version() -> None:
    first = protocol.SuspendRequest(attempt_id="a1")
    second = protocol.SuspendRequest(attempt_id="a1")
    assert first.id != second.id
    assert json.loads(protocol.encode(first))["v"] == protocol.PROTOCOL_VERSION


def test_the_committed_schema_matches_the_models() -> None:
    assert SCHEMA_PATH.read_text() == render(), (
        "the protocol changed: review it, bump PROTOCOL_VERSION if it is incompatible, then run "
        "`python -m agents.protocol.schema --write`"
    )

"""Output becomes numbered log lines, and lines bounded chunks; the outbox stays bounded while the
portal is away."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agents import agent as agent_module
from agents.agent import Agent
from agents.config import AgentConfig
from agents.devices.simulated import SimulatedBackend, load_description
from agents.protocol import Heartbeat, LogChunk
from agents.runtime import MAX_CHUNK_CHARS, MAX_LOG_LINE, LineNumbering, LogLine, chunk_lines
from agents.runtime.policy import HostPolicy
from agents.runtime.process import ProcessRuntime


def numbered(pieces: list[bytes], from_seq: int = 0) -> list[tuple[int, str]]:
    numbering = LineNumbering("stdout", from_seq)
    lines = [line for piece in pieces for line in numbering.feed(piece)] + numbering.finish()
    assert all(line.stream == "stdout" for line in lines)
    return [(line.seq, line.text) for line in lines]


def test_lines_are_numbered_the_same_however_the_bytes_arrive() -> None:
    output = b"first\nsecond line\n\nthird, without a newline"
    whole = numbered([output])
    assert whole == [(0, "first"), (1, "second line"), (2, ""), (3, "third, without a newline")]
    assert numbered([output[i : i + 1] for i in range(len(output))]) == whole
    # A character of several bytes cut between two reads is decoded whole.
    accented = "d\u00e9j\u00e0\n".encode()
    assert numbered([accented[:2], accented[2:]]) == [(0, "d\u00e9j\u00e0")]


def test_a_long_line_takes_several_numbers_and_a_reader_resumes_without_gap() -> None:
    output = ("x" * (2 * MAX_LOG_LINE + 5) + "\nnext\n").encode()
    lines = numbered([output])
    assert [(seq, len(text)) for seq, text in lines] == [(0, MAX_LOG_LINE), (1, MAX_LOG_LINE), (2, 5), (3, 4)]
    assert numbered([output], from_seq=2) == lines[2:]


def test_output_without_newlines_comes_out_in_pieces_as_it_arrives() -> None:
    """A progress bar redrawn with carriage returns for a whole run: its pieces reach the
    portal while it runs, and the agent never holds more than one line's bytes of it."""
    bar = b"".join(b"\repoch 1: %6d/100000" % step for step in range(60_000))  # 1.26 MB, no newline
    numbering = LineNumbering("stdout")
    live = []
    for at in range(0, len(bar), 4096):
        live += numbering.feed(bar[at : at + 4096])
        assert len(numbering._partial) <= MAX_LOG_LINE
    assert len(live) >= len(bar) // MAX_LOG_LINE  # every full piece before the output ends
    # Each piece ends after a whole redraw, so its last one reads whole.
    assert all(line.text.endswith("\r") and len(line.text.encode()) <= MAX_LOG_LINE for line in live)
    assert all(re.fullmatch(r"epoch 1: +\d+/100000", line.text.split("\r")[-2]) for line in live)
    lines = live + numbering.finish()
    assert "".join(line.text for line in lines).encode() == bar
    assert [(line.seq, line.text) for line in lines] == numbered([bar])


def test_a_long_line_is_cut_between_characters() -> None:
    text = "\u20ac" * 20_000 + "\n"  # three-byte characters: byte 16,384 falls inside one
    whole = numbered([text.encode()])
    assert [len(piece.encode()) for _, piece in whole] == [16_383, 16_383, 16_383, 10_851]
    assert all(len(piece.encode()) <= MAX_LOG_LINE and "\ufffd" not in piece for _, piece in whole)
    assert "".join(piece for _, piece in whole) == text[:-1]
    data = text.encode()
    assert numbered([data[i : i + 1000] for i in range(0, len(data), 1000)]) == whole


def test_chunks_follow_streams_and_sequence_runs() -> None:
    lines = [
        LogLine("stdout", 0, "a"),
        LogLine("stdout", 1, "b"),
        LogLine("stdout", 5, "c"),
        LogLine("stderr", 0, "x"),
    ]
    chunks = chunk_lines("att-1", lines)
    assert [(chunk.stream, chunk.seq, chunk.text) for chunk in chunks] == [
        ("stdout", 0, "a\nb\n"),
        ("stdout", 5, "c\n"),
        ("stderr", 0, "x\n"),
    ]


def test_chunks_stay_below_the_size_limit() -> None:
    line = "y" * 10_000
    lines = [LogLine("stdout", seq, line) for seq in range(100)]
    chunks = chunk_lines("att-1", lines)
    assert len(chunks) > 1
    assert all(len(chunk.text) <= MAX_CHUNK_CHARS for chunk in chunks)
    assert "".join(chunk.text for chunk in chunks) == "".join(f"{line}\n" for _ in range(100))
    assert [chunk.seq for chunk in chunks] == sorted(chunk.seq for chunk in chunks)


def test_the_outbox_drops_the_oldest_messages_beyond_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "OUTBOX_LOG_BYTES", 1000)
    monkeypatch.setattr(agent_module, "OUTBOX_LIMIT", 50)
    config = AgentConfig(portal_url="ws://127.0.0.1:9/ws/agent/", token="t", state_dir=tmp_path)
    agent = Agent(
        config, SimulatedBackend(load_description("dgx-a100"), "n"), ProcessRuntime(tmp_path, HostPolicy())
    )
    for seq in range(30):
        agent.send(LogChunk(attempt_id="a", stream="stdout", seq=seq, text="z" * 99 + "\n"))
    assert agent.outbox_log_bytes <= 1000
    assert [message.seq for message in agent.outbox] == list(range(20, 30))
    for _ in range(60):
        agent.send(Heartbeat(uptime_s=1))
    assert len(agent.outbox) == 50 and agent.outbox_dropped == 40
    assert agent.outbox_log_bytes == 0

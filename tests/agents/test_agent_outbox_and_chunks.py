"""Output becomes numbered log lines, and lines bounded chunks; the outbox stays bounded while the
portal is away."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from agents import agent as agent_module
from agents.agent import Agent
from agents.config import AgentConfig
from agents.devices.simulated import SimulatedBackend, load_description
from agents.protocol import Heartbeat, LogChunk, ShellExit, ShellOutput, decode_from_agent
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


def make_agent(tmp_path: Path) -> Agent:
    config = AgentConfig(portal_url="ws://127.0.0.1:9/ws/agent/", token="t", state_dir=tmp_path)
    return Agent(
        config, SimulatedBackend(load_description("dgx-a100"), "n"), ProcessRuntime(tmp_path, HostPolicy())
    )


def shell_messages(agent: Agent) -> list[ShellOutput | ShellExit]:
    return [message for message in agent.outbox if isinstance(message, ShellOutput | ShellExit)]


def test_the_outbox_trim_drops_the_oldest_other_messages_never_shell_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dropped shell message would corrupt a terminal's output or leave a session that never
    hears its exit; logs can be read again, so they go instead (and are noted as lost)."""
    monkeypatch.setattr(agent_module, "OUTBOX_LIMIT", 10)
    monkeypatch.setattr(agent_module, "OUTBOX_LOG_BYTES", 300)
    agent = make_agent(tmp_path)
    agent.connected = True
    sent_to_shells = [ShellOutput(session="s1", seq=seq, data=f"out{seq}") for seq in range(3)]
    sent_to_shells.append(ShellExit(session="s1", exit_code=0, reason="the shell exited"))
    for message in sent_to_shells[:2]:
        agent.send(message)
    for seq in range(3):
        agent.send(LogChunk(attempt_id="a", stream="stdout", seq=seq, text="z" * 99 + "\n"))
    for message in sent_to_shells[2:]:
        agent.send(message)
    # Over the log budget: the oldest chunk goes, though two shell messages are older.
    agent.send(LogChunk(attempt_id="a", stream="stdout", seq=3, text="z" * 99 + "\n"))
    assert shell_messages(agent) == sent_to_shells
    assert [message.seq for message in agent.outbox if isinstance(message, LogChunk)] == [1, 2, 3]
    assert agent.lost_logs == {("a", "stdout"): (0, 1)} and agent.outbox_dropped == 1
    # Over the message limit: heartbeats and chunks go, oldest first; the shell messages stay.
    for _ in range(10):
        agent.send(Heartbeat(uptime_s=1))
    assert len(agent.outbox) == 10 and shell_messages(agent) == sent_to_shells
    assert [type(message) for message in list(agent.outbox)[4:]] == [Heartbeat] * 6
    assert agent.lost_logs == {("a", "stdout"): (0, 4)} and agent.outbox_log_bytes == 0
    assert agent.outbox_shell_messages == 4 and agent.outbox_shell_chars == len("out0out1out2")


def test_an_outbox_of_shell_messages_only_is_left_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing else to drop: the trim ends (shell output is bounded by waiting instead)."""
    monkeypatch.setattr(agent_module, "OUTBOX_LIMIT", 3)
    agent = make_agent(tmp_path)
    agent.connected = True
    exits = [ShellExit(session=f"s{number}", reason="closed") for number in range(5)]
    for message in exits:
        agent.send(message)
    assert list(agent.outbox) == exits and agent.outbox_dropped == 0
    agent.send(Heartbeat(uptime_s=1))  # the only message that may go
    assert list(agent.outbox) == exits and agent.outbox_dropped == 1


class CountedSleeps:
    """asyncio.sleep, counting the calls of everything but the test itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = asyncio.sleep
        self.calls = 0
        monkeypatch.setattr(asyncio, "sleep", self.counted)

    async def counted(self, delay: float, result: Any = None) -> Any:
        self.calls += 1
        return await self.real(delay, result)

    async def turns(self, count: int = 3) -> None:
        """Let the event loop run a few rounds, without counting them."""
        for _ in range(count):
            await self.real(0)


@pytest.mark.asyncio
async def test_shell_output_waits_for_the_sender_without_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "OUTBOX_SHELL_CHARS", 10)
    agent = make_agent(tmp_path)
    agent.connected = True
    agent.send(ShellOutput(session="s1", seq=0, data="x" * 11))
    agent.send(Heartbeat(uptime_s=1))
    sleeps = CountedSleeps(monkeypatch)
    waiting = [asyncio.create_task(agent._room_for_shell_output()) for _ in range(2)]
    await sleeps.real(0.1)
    assert not any(task.done() for task in waiting)
    assert sleeps.calls == 0  # they wait for the sender, they do not poll

    connection = GatedConnection()
    sender = asyncio.create_task(agent._sender(connection))
    await sleeps.turns()
    assert not any(task.done() for task in waiting)  # the shell output is being sent, not yet sent
    connection.gate.set()
    await sleeps.turns()
    assert all(task.done() for task in waiting)  # woken as soon as it went
    assert [type(message) for message in connection.sent] == [ShellOutput, Heartbeat]
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)


@pytest.mark.asyncio
async def test_shells_stop_waiting_for_room_when_the_connection_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "OUTBOX_SHELL_CHARS", 10)
    agent = make_agent(tmp_path)
    agent.connected = True
    agent.send(ShellOutput(session="s1", seq=0, data="x" * 11))
    sleeps = CountedSleeps(monkeypatch)
    waiting = asyncio.create_task(agent._room_for_shell_output())
    await sleeps.real(0.05)
    assert not waiting.done()
    agent.connected = False  # what the end of a connection does first
    await sleeps.turns()
    assert waiting.done() and sleeps.calls == 0


@pytest.mark.asyncio
async def test_shell_output_waits_while_the_outbox_holds_many_shell_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However short the messages, so that shell messages alone never fill the outbox."""
    monkeypatch.setattr(agent_module, "OUTBOX_SHELL_MESSAGES", 3)
    agent = make_agent(tmp_path)
    agent.connected = True
    for seq in range(4):
        agent.send(ShellOutput(session="s1", seq=seq, data="x"))
    waiting = asyncio.create_task(agent._room_for_shell_output())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    agent._pop_outbox()  # what the sender does once the oldest went
    await asyncio.wait_for(waiting, 1)
    assert agent.outbox_shell_messages == 3


class GatedConnection:
    """A connection whose sends wait until the gate opens."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sent: list[Any] = []

    async def send(self, text: str) -> None:
        await self.gate.wait()
        self.sent.append(decode_from_agent(text))

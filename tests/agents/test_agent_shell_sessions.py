"""Shell sessions through the agent, against the fake portal, with the process runtime."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import pytest
from agent_builders import make_attempt
from fake_portal import TOKEN, FakePortal, wait_for
from shell_reading import alive

from agents import shells
from agents.agent import Agent
from agents.config import AgentConfig
from agents.devices.simulated import SimulatedBackend, load_description
from agents.protocol import (
    AttemptState,
    LogChunk,
    ShellClose,
    ShellExit,
    ShellInput,
    ShellOpen,
    ShellOutput,
    ShellResize,
    StopRequest,
    SuspendRequest,
)
from agents.runtime import RuntimeFailure
from agents.runtime.policy import HostPolicy
from agents.runtime.process import ProcessRuntime
from agents.runtime.shell import ShellProcess

PY = sys.executable
FOREVER = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.02)\n"
IGNORES_HANGUP = (
    "import os, signal, time\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
    "print(f'pid={os.getpid()}', flush=True)\nwhile True: time.sleep(0.05)\n"
)


class CountingRuntime(ProcessRuntime):
    """The process runtime, counting the shells it was asked to open, and failing on demand."""

    opened = 0
    failure: Exception | None = None

    async def open_shell(self, attempt_id: str, command: list[str], cols: int, rows: int) -> ShellProcess:
        self.opened += 1
        if self.failure is not None:
            raise self.failure
        return await super().open_shell(attempt_id, command, cols, rows)


def make_agent(portal: FakePortal, state_dir: Path) -> Agent:
    config = AgentConfig(
        portal_url=f"{portal.url.replace('http', 'ws')}/ws/agent/",
        token=TOKEN,
        runtime="process",
        simulate="dgx-a100",
        state_dir=state_dir,
        node_name="node-1",
        monitor_interval_s=0.05,
        checkpoint_roots=(state_dir.parent / "ckpt",),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    backend = SimulatedBackend(load_description("dgx-a100"), "node-1", seed=1)
    return Agent(config, backend, CountingRuntime(state_dir, HostPolicy()))


@contextlib.asynccontextmanager
async def running_agent(portal: FakePortal, state_dir: Path, *attempt_ids: str) -> AsyncIterator[Agent]:
    """An agent connected to the portal, with the given attempts running."""
    agent = make_agent(portal, state_dir)
    portal.desired = [make_attempt(attempt_id, command=[PY, "-c", FOREVER]) for attempt_id in attempt_ids]
    task = asyncio.create_task(agent.run())
    try:
        for attempt_id in attempt_ids:
            await wait_for(lambda a=attempt_id: _state(portal, a) == AttemptState.RUNNING)
        yield agent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "state"
    yield directory
    for record in (directory / "process").glob("*/record.json"):  # attempts outlive agents
        with contextlib.suppress(ProcessLookupError):
            os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)


def _state(portal: FakePortal, attempt_id: str) -> AttemptState | None:
    status = portal.last_status(attempt_id)
    return status.state if status is not None else None


def outputs(portal: FakePortal, session: str) -> list[ShellOutput]:
    return [message for message in portal.of_type(ShellOutput) if message.session == session]


def output_text(portal: FakePortal, session: str) -> str:
    return "".join(message.data for message in outputs(portal, session))


def exits(portal: FakePortal, session: str) -> list[ShellExit]:
    return [message for message in portal.of_type(ShellExit) if message.session == session]


async def open_shell(portal: FakePortal, session: str, attempt_id: str = "att-1") -> int:
    """Open a session and return its shell's pid, which the shell itself prints."""
    await portal.send(ShellOpen(session=session, attempt_id=attempt_id, cols=120, rows=40))
    await portal.send(ShellInput(session=session, data="echo pid=$$=$((6*7))\r"))
    await wait_for(lambda: "=42" in output_text(portal, session))
    return int(output_text(portal, session).split("pid=")[-1].split("=42")[0])


@pytest.mark.asyncio
async def test_a_shell_relays_output_in_order_and_ends_with_its_exit_code(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1"):
        await open_shell(portal, "s1")
        await portal.send(ShellResize(session="s1", cols=100, rows=30))
        # Much output (several messages), a character whose bytes arrive in two reads far apart
        # (U+20AC is e2 82 ac), then the exit.
        await portal.send(
            ShellInput(
                session="s1",
                data="stty size; seq 1 20000; printf 'A\\342\\202'; sleep 0.3; printf '\\254Z\\n'; exit 5\r",
            )
        )
        await wait_for(lambda: exits(portal, "s1"))
        (ended,) = exits(portal, "s1")
        assert (ended.exit_code, ended.reason) == (5, "the shell exited")
        sent = outputs(portal, "s1")
        assert [message.seq for message in sent] == list(range(len(sent)))
        assert len(sent) > 3
        assert all(len(message.data.encode()) <= 32 * 1024 for message in sent)
        text = output_text(portal, "s1").replace("\r\n", "\n")
        assert "\n30 100\n" in text
        assert "\n".join(str(number) for number in range(1, 20001)) in text
        assert "A€Z" in text and "\ufffd" not in text
        # shell_exit comes after the last output
        assert portal.received.index(ended) > portal.received.index(sent[-1])


@pytest.mark.asyncio
async def test_a_shell_for_an_unknown_attempt_is_refused_and_nothing_opens(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1") as agent:
        await portal.send(ShellOpen(session="s1", attempt_id="att-none"))
        await wait_for(lambda: exits(portal, "s1"))
        (refused,) = exits(portal, "s1")
        assert refused.exit_code is None
        assert refused.reason == "attempt att-none is not running on this node"
        assert agent.runtime.opened == 0 and agent.shells.sessions == {}
        assert outputs(portal, "s1") == []


@pytest.mark.asyncio
async def test_a_failing_session_ends_alone_with_the_error(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1") as agent:
        await open_shell(portal, "s1")
        agent.runtime.failure = RuntimeFailure("no terminal left")
        await portal.send(ShellOpen(session="s2", attempt_id="att-1"))
        await wait_for(lambda: exits(portal, "s2"))
        assert exits(portal, "s2")[0].reason == "cannot open a shell: no terminal left"
        agent.runtime.failure = ValueError("a bug")
        await portal.send(ShellOpen(session="s3", attempt_id="att-1"))
        await wait_for(lambda: exits(portal, "s3"))
        assert exits(portal, "s3")[0].reason == "the shell session failed: a bug"
        agent.runtime.failure = None
        # the open session and the agent go on
        await portal.send(ShellInput(session="s1", data="echo still-$((40+2))\r"))
        await wait_for(lambda: "still-42" in output_text(portal, "s1"))
        await open_shell(portal, "s4")
        assert exits(portal, "s1") == [] and agent.shells.sessions.keys() == {"s1", "s4"}


@pytest.mark.asyncio
async def test_messages_for_unknown_sessions_are_ignored(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1"):
        await portal.send(ShellInput(session="nobody", data="echo hi\r"))
        await portal.send(ShellResize(session="nobody", cols=10, rows=10))
        await portal.send(ShellClose(session="nobody"))
        await open_shell(portal, "s1")  # the agent carries on
        assert exits(portal, "nobody") == [] and outputs(portal, "nobody") == []


@pytest.mark.asyncio
async def test_closing_a_session_hangs_up_its_shell(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1") as agent:
        pid = await open_shell(portal, "s1")
        await portal.send(ShellInput(session="s1", data="sleep 600\r"))
        await portal.send(ShellClose(session="s1"))
        await wait_for(lambda: exits(portal, "s1"))
        (ended,) = exits(portal, "s1")
        assert (ended.exit_code, ended.reason) == (129, "closed")
        assert not alive(pid) and agent.shells.sessions == {}


@pytest.mark.asyncio
async def test_a_session_without_input_for_long_is_closed_by_the_agent(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The portal closes idle sessions; the agent closes those the portal no longer can (its
    web process died), from its monitor loop, and leaves a session that gets input alone."""
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1") as agent:
        forgotten = await open_shell(portal, "s1")
        typing = await open_shell(portal, "s2")
        monkeypatch.setattr(agent.shells, "close_idle", partial(agent.shells.close_idle, 1.0))
        for _ in range(8):
            await portal.send(ShellInput(session="s2", data=":\r"))
            await asyncio.sleep(0.25)
        await wait_for(lambda: exits(portal, "s1"))
        assert exits(portal, "s1")[0].reason == "no input for 1 s: closed by the agent"
        assert not alive(forgotten)
        assert exits(portal, "s2") == [] and alive(typing)


@pytest.mark.asyncio
async def test_stopping_the_attempt_ends_its_shells(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1", "att-2"):
        pid = await open_shell(portal, "s1", "att-1")
        other = await open_shell(portal, "s2", "att-2")
        await portal.send(StopRequest(attempt_id="att-1"))
        await wait_for(lambda: exits(portal, "s1"))
        (ended,) = exits(portal, "s1")
        assert ended.reason == "the job's attempt is being stopped"
        assert not alive(pid)
        # the shell of the other attempt is not touched
        assert exits(portal, "s2") == [] and alive(other)
        await portal.set_desired([])  # removing it from the desired set stops it as well
        await wait_for(lambda: exits(portal, "s2"))
        assert exits(portal, "s2")[0].reason == "the job's attempt is being stopped"


@pytest.mark.asyncio
async def test_suspending_the_attempt_ends_its_shells_and_refuses_new_ones(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1"):
        await open_shell(portal, "s1")
        await portal.send(SuspendRequest(attempt_id="att-1"))
        await wait_for(lambda: exits(portal, "s1"))
        assert exits(portal, "s1")[0].reason == "the job's attempt was suspended"
        await wait_for(lambda: _state(portal, "att-1") == AttemptState.SUSPENDED)
        await portal.send(ShellOpen(session="s2", attempt_id="att-1"))
        await wait_for(lambda: exits(portal, "s2"))
        assert exits(portal, "s2")[0].reason == "attempt att-1 is suspended"


@pytest.mark.asyncio
async def test_the_limits_refuse_more_sessions(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1", "att-2") as agent:
        for number in range(shells.MAX_SHELLS_PER_ATTEMPT):
            await open_shell(portal, f"s{number}")
        await portal.send(ShellOpen(session="s-extra", attempt_id="att-1"))
        await wait_for(lambda: exits(portal, "s-extra"))
        assert exits(portal, "s-extra")[0].reason == "attempt att-1 already has 4 shell sessions, the limit"
        assert agent.runtime.opened == shells.MAX_SHELLS_PER_ATTEMPT
        # the open ones go on
        await portal.send(ShellInput(session="s0", data="echo still-$((40+2))\r"))
        await wait_for(lambda: "still-42" in output_text(portal, "s0"))
        assert [exits(portal, f"s{number}") for number in range(4)] == [[]] * 4

        monkeypatch.setattr(shells, "MAX_SHELLS_PER_NODE", 5)
        await open_shell(portal, "t1", "att-2")
        await portal.send(ShellOpen(session="t2", attempt_id="att-2"))
        await wait_for(lambda: exits(portal, "t2"))
        assert exits(portal, "t2")[0].reason == "this node already has 5 shell sessions, the limit"


@pytest.mark.asyncio
async def test_a_lost_connection_closes_every_session_and_queues_nothing(state_dir: Path) -> None:
    async with FakePortal() as portal, running_agent(portal, state_dir, "att-1") as agent:
        # It ignores the hangup, so it is still closing (killed after the grace) when the agent is
        # connected again: its shell_exit must not reach the new connection either.
        await portal.send(ShellOpen(session="s1", attempt_id="att-1", command=[PY, "-c", IGNORES_HANGUP]))
        await wait_for(lambda: "pid=" in output_text(portal, "s1"))
        pid = int(output_text(portal, "s1").split("pid=")[1].split()[0])
        await portal.drop()
        await wait_for(lambda: len(portal.hellos) == 2 and agent.connected)
        await wait_for(lambda: not alive(pid))
        await wait_for(lambda: agent.shells.sessions == {})
        await asyncio.sleep(0.2)  # what the agent would still send about it has arrived
        later = portal.received_per_connection[1]
        assert not [message for message in later if isinstance(message, ShellOutput | ShellExit)]
        assert not [message for message in agent.outbox if isinstance(message, ShellOutput | ShellExit)]
        assert agent.outbox_shell_chars == 0
        await open_shell(portal, "s2")  # the new connection opens new sessions


@pytest.mark.asyncio
async def test_the_outbox_keeps_logs_but_not_shell_messages_for_the_next_connection(state_dir: Path) -> None:
    async with FakePortal() as portal:
        agent = make_agent(portal, state_dir)
        agent.send(ShellOutput(session="s1", seq=0, data="lost"))  # disconnected: dropped at once
        assert list(agent.outbox) == []
        agent.connected = True
        log_chunk = LogChunk(attempt_id="att-1", stream="stdout", seq=0, text="kept\n")
        agent.send(ShellOutput(session="s1", seq=1, data="queued"))
        agent.send(log_chunk)
        agent.send(ShellExit(session="s1", reason="closed"))
        assert agent.outbox_shell_chars == len("queued")
        agent.connected = False
        agent._drop_shell_messages()  # what the end of a connection does
        assert list(agent.outbox) == [log_chunk] and agent.outbox_shell_chars == 0

"""``python -m agents`` as a real process: it registers, runs work, and leaves it running when stopped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_builders import make_attempt
from fake_portal import TOKEN, FakePortal, wait_for

import agents
from agents.protocol import AttemptState, GpuRef

REPO = Path(agents.__file__).parent.parent
FOREVER = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.05)\n"


def start_agent(portal_url: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    command = [sys.executable, "-m", "agents", "--portal", portal_url, "--token-file", str(token_file)]
    command += ["--runtime", "process", "--simulate", "dgx1-v100", "--state-dir", str(tmp_path / "state")]
    command += ["--node-name", "cli-node", "--checkpoint-root", str(tmp_path / "ckpt")]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def stop_agent(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    for _ in range(600):
        if process.poll() is not None:
            return process.returncode
        await asyncio.sleep(0.05)
    process.kill()
    raise AssertionError("the agent did not stop on SIGTERM")


@pytest.mark.asyncio
async def test_the_agent_process_registers_runs_work_and_leaves_it_running_when_stopped(
    tmp_path: Path,
) -> None:
    async with FakePortal() as portal:
        agent = start_agent(portal.url, tmp_path)
        try:
            await wait_for(lambda: len(portal.hellos) == 1, timeout_s=60)
            hello = portal.hellos[0]
            assert hello.node_name == "cli-node" and hello.runtime.kind == "process"
            assert {gpu.model for gpu in hello.gpus} == {"Tesla V100-SXM2-32GB"}
            gpu = GpuRef(uuid=hello.gpus[5].uuid, index=5)
            await portal.set_desired(
                [make_attempt("att-cli", command=[sys.executable, "-c", FOREVER], gpus=[gpu])]
            )
            await wait_for(lambda: portal.log_lines("att-cli").get(0) == "up")
            assert await stop_agent(agent) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
        record_path = tmp_path / "state" / "process" / "att-cli" / "record.json"
        pid = json.loads(record_path.read_text())["pid"]
        try:
            assert Path(f"/proc/{pid}").exists()  # the attempt outlived its agent

            again = start_agent(portal.url, tmp_path)
            try:
                await wait_for(lambda: len(portal.hellos) == 2, timeout_s=60)
                (reported,) = portal.hellos[1].attempts
                assert (reported.attempt_id, reported.state) == ("att-cli", AttemptState.RUNNING)
                assert reported.gpu_uuids == [gpu.uuid]
            finally:
                await stop_agent(again)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

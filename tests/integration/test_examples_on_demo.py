"""Every job spec in examples/ runs on agents started as `make up` starts them, with the command
its comment gives (`gpuportal submit examples/NAME.yaml --follow`), and succeeds.

The demo's agents use the process runtime: a job gets nothing of its agent's environment but
PATH, and no mounts. The examples find their script and the gpuportal package through the PATH
the demo gives its agents (portal.devstack.demo_agent_env); these tests start the agents with
the demo's own commands and environment, so they fail when either stops giving what an example
needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from agents.runtime.process import kill_recorded_attempts
from portal import devstack
from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.cluster.services import issue_node_token
from portal.jobs.models import Checkpoint, Job
from tests.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path.name for path in (REPO / "examples").glob("*.yaml"))
# What each example must print, and arguments added to its command so that the test is quick.
EXPECTED_OUTPUT = {"hello.yaml": "hello from", "train_counter.yaml": "done at step 2000"}
FASTER = {"train_counter.yaml": ["--step-seconds", "0.005"]}


@pytest.fixture
def demo_agents(live_stack: dict[str, Any], users: Any, tmp_path: Path) -> Iterator[Path]:
    """The demo's four agents (portal.devstack.demo_agent_commands, with the environment `make
    up` gives them) connected to the live stack; yields the directory of their output."""
    run_dir = tmp_path / "var"
    (run_dir / "agents").mkdir(parents=True)
    # The agents keep checkpoints in RUN_DIR/checkpoints, which must be the portal's CHECKPOINT_ROOT.
    (run_dir / "checkpoints").symlink_to(live_stack["checkpoints"])
    for node in Node.objects.all():
        (run_dir / "agents" / f"{node.name}.token").write_text(issue_node_token(node, None) + "\n")
    port = urlsplit(live_stack["http"]).port
    assert port is not None
    env = devstack.demo_agent_env(dict(os.environ))
    # The live stack counts a node lost after 8 s of silence; the demo's agents report every 10 s.
    timing = ["--heartbeat-interval", "1", "--telemetry-interval", "1"]
    agents = []
    for name, command in devstack.demo_agent_commands(port, run_dir):
        with open(tmp_path / f"{name}.log", "wb") as out:
            agents.append(
                subprocess.Popen(
                    [*command, *timing],
                    env=env,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        wait_for(lambda: Node.objects.filter(state="ready").count() == len(agents), 30, "the demo agents")
        yield tmp_path
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            try:
                agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        for state_dir in (run_dir / "agents").glob("*/"):
            kill_recorded_attempts(state_dir)  # a job outlives its agent by design


@pytest.mark.parametrize("example", EXAMPLES)
def test_an_example_runs_on_the_demo_as_its_comment_says(
    example: str, demo_agents: Path, live_stack: dict[str, Any], users: Any, tmp_path: Path
) -> None:
    source = REPO / "examples" / example
    assert f"gpuportal submit examples/{example} --follow" in source.read_text()
    spec = yaml.safe_load(source.read_text())
    if example in FASTER:
        spec["command"] = [*spec["command"], *FASTER[example]]
    spec_file = tmp_path / example
    spec_file.write_text(yaml.safe_dump(spec))
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUPORTAL_")}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "home" / ".config"),
        GPUPORTAL_URL=live_stack["http"],
        GPUPORTAL_TOKEN=create_api_token(users["alice"], "examples")[1],
    )
    followed = subprocess.run(
        [sys.executable, "-m", "gpuportal", "submit", str(spec_file), "--follow", "-q", "--poll", "0.5"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    agent_logs = "".join(path.read_text()[-2000:] for path in sorted(demo_agents.glob("*-node-*.log")))
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr + agent_logs
    assert EXPECTED_OUTPUT[example] in followed.stdout
    job = Job.objects.get(pk=int(followed.stdout.splitlines()[0]))
    assert job.state == "succeeded"
    if spec.get("checkpoint", {}).get("enabled"):
        # Saved through gpuportal.checkpoint, reported by the agent, committed by the portal.
        saved = list(Checkpoint.objects.filter(job=job).values_list("step", flat=True))
        assert saved and max(saved) >= 200, saved

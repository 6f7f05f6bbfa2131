"""Fixtures of the fault tests: a portal stack of their own, agents (optionally behind a
partition proxy), an API client that remembers what it was acknowledged, and I1-I6 after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import AgentProcess, database_url_of_tests, wait_for
from tests.integration.invariants import invariants_checked
from tests.reliability.stack import PROCESSES, PartitionProxy, PortalStack

__all__ = ["invariants_checked"]


@pytest.fixture(autouse=True)
def _invariants_after_each_test(invariants_checked: set[int]) -> set[int]:
    return invariants_checked


@pytest.fixture(scope="session")
def fault_stack(django_db_setup: Any, tmp_path_factory: Any) -> Iterator[PortalStack]:
    """Web, worker and beat on the test database and a Redis of their own, started once."""

    run_dir = tmp_path_factory.mktemp("fault-stack")
    env = {
        **os.environ,
        "DATABASE_URL": database_url_of_tests(),
        "DEBUG": "true",
        "PYTHONUNBUFFERED": "1",
        "CHECKPOINT_ROOT": str(run_dir / "checkpoints"),
        "AGENT_HEARTBEAT_INTERVAL_S": "1",
        "AGENT_TELEMETRY_INTERVAL_S": "1",
        # As in the live stack: agents heartbeat every second, suspect after 4 s, lost after 8 s.
        "NODE_SILENT_AFTER_S": "4",
        "NODE_LOST_AFTER_S": "8",
        "THROTTLE_SIGN_IN": "10000/min",
        "THROTTLE_TOKENS": "10000/min",
        "THROTTLE_SUBMIT": "10000/min",
    }
    stack = PortalStack(env, run_dir)
    stack.set_paused(True)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def portal(fault_stack: PortalStack, users: dict[str, Any]) -> Iterator[PortalStack]:
    """The fault stack, whole and running its loop during the test; paused and idle after it,
    before the database is reset (a reset under a running cycle could deadlock)."""
    missing = [name for name in PROCESSES if name not in fault_stack.procs]
    if missing:  # a failed test may have left one killed
        fault_stack.start(*missing)
    fault_stack.set_paused(False)
    yield fault_stack
    if "worker" not in fault_stack.procs or "web" not in fault_stack.procs:
        fault_stack.start(*[name for name in PROCESSES if name not in fault_stack.procs])
    fault_stack.set_paused(True)
    fault_stack.wait_idle()


@pytest.fixture
def agents(portal: PortalStack, tmp_path: Path) -> Iterator[Any]:
    """agents("a100-node-1", proxied=True) -> a running agent; through a PartitionProxy when
    proxied (the proxy is the agent's .proxy). All are stopped, with their jobs, after the test."""
    from portal.cluster.models import Node
    from portal.cluster.services import issue_node_token

    started: list[AgentProcess] = []
    proxies: list[PartitionProxy] = []

    def start(node_name: str, proxied: bool = False) -> AgentProcess:
        proxy = PartitionProxy(portal.port) if proxied else None
        live = {"http": proxy.http if proxy else portal.http, "checkpoints": portal.run_dir / "checkpoints"}
        token = issue_node_token(Node.objects.get(name=node_name), None)
        agent = AgentProcess(live, node_name, token, tmp_path / "agents" / node_name)
        agent.proxy = proxy  # type: ignore[attr-defined]
        agent.start()
        started.append(agent)
        if proxy:
            proxies.append(proxy)
        return agent

    yield start
    for agent in started:
        agent.stop()
        agent.kill_jobs()
    for proxy in proxies:
        proxy.close()


def ready_nodes(*names: str) -> bool:
    from portal.cluster.models import Node

    return Node.objects.filter(name__in=names, state="ready").count() == len(names)


def wait_ready(*names: str, timeout: float = 30) -> None:
    wait_for(lambda: ready_nodes(*names), timeout, f"{', '.join(names)} to be ready")


class Api:
    """httpx against the fault stack as one user (an API token), remembering every job it was
    acknowledged with a 2xx, for I4."""

    def __init__(self, base_url: str, token: str, acknowledged: set[int]) -> None:
        self.client = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        self.acknowledged = acknowledged

    def submit(self, name: str, script: str, **spec: Any) -> int:
        body = {
            "name": name,
            "vc": "vision",
            "flavor": "s-A100",
            "command": ["python3", "-c", script],
            **spec,
        }
        response = self.client.post("/api/v1/jobs/", json=body)
        assert response.status_code == 201, response.text
        job_id = int(response.json()["id"])
        self.acknowledged.add(job_id)
        return job_id

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        response = self.client.post(url, **kwargs)
        if url == "/api/v1/jobs/" and response.is_success:
            self.acknowledged.add(int(response.json()["id"]))
        return response

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(url, **kwargs)


@pytest.fixture
def api(portal: PortalStack, users: dict[str, Any], invariants_checked: set[int]) -> Any:
    """api("alice") -> an Api for that user on the fault stack."""
    from portal.accounts.services import create_api_token

    made: dict[str, Api] = {}

    def for_user(username: str) -> Api:
        if username not in made:
            _, token = create_api_token(users[username], "faults")
            made[username] = Api(portal.http, token, invariants_checked)
        return made[username]

    return for_user


SLEEP = "import time\nprint('started', flush=True)\ntime.sleep({seconds})\n"


def job_state(job_id: int) -> str:
    from portal.jobs.models import Job

    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def job_node(job_id: int) -> str:
    """The node of the job's current attempt (a one-replica job)."""
    from portal.jobs.models import JobAttempt

    attempt = JobAttempt.objects.filter(job_id=job_id).order_by("-number").first()
    assert attempt is not None
    return attempt.allocations.values_list("node__name", flat=True).first()

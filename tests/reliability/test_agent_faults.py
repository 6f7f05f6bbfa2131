"""Faults between the portal and its agents (reliability-security.md F2, F4): real agent
processes running real jobs, a TCP proxy that cuts one off, SIGKILL of an agent and its job.

Covered elsewhere: F1 (agent killed and restarted: same attempt, never restarted) in
tests/integration/test_jobs_run_on_agents.py, test_an_agent_killed_mid_job_reattaches_...;
F3 (heartbeats stop: not-ready, then lost and requeued) in tests/integration/test_scheduling_loop.py,
test_a_lost_node_s_job_is_requeued_and_the_returning_agent_stops_it.
"""

from __future__ import annotations

import time

import pytest

from portal.jobs.models import Job, JobAttempt
from tests.conftest import wait_for
from tests.reliability.conftest import SLEEP, job_node, job_state, wait_ready

pytestmark = pytest.mark.django_db(transaction=True)


def attempts(job_id: int) -> list[tuple[int, str]]:
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("number").values_list("number", "state"))


def replica_state(job_id: int, number: int) -> str | None:
    attempt = JobAttempt.objects.get(job_id=job_id, number=number)
    return (attempt.replica_states.get("0") or {}).get("state")


def test_a_partition_shorter_than_the_timeouts_changes_nothing_and_a_longer_one_moves_the_job(
    api, agents
) -> None:  # type: ignore[no-untyped-def]
    """F4 with downtime below the suspect timeout (2 s < 4 s) and above the lost one (> 8 s)."""
    by_node = {a.node: a for a in (agents("a100-node-1", proxied=True), agents("a100-node-2", proxied=True))}
    wait_ready(*by_node)
    job = api("alice").submit("partitioned", SLEEP.format(seconds=300))
    wait_for(lambda: job_state(job) == "running", 60, "the job to run")
    cut = by_node[job_node(job)]
    other = next(a for a in by_node.values() if a is not cut)

    # Short: the connection is reset and the agent reconnects; the job never notices.
    connections = cut.proxy.accepted
    cut.proxy.partition()
    time.sleep(2)  # the fault lasts this long by design
    cut.proxy.heal()
    wait_for(lambda: cut.proxy.accepted > connections, 30, "the agent to reconnect")
    assert attempts(job) == [(1, "running")]
    assert job_state(job) == "running"
    assert list(Job.objects.get(pk=job).events.values_list("to_state", flat=True)) == [
        "pending",
        "scheduled",
        "starting",
        "running",
    ]

    # Long: the node is lost, the job moves to the other node as attempt 2.
    cut.proxy.partition()
    wait_for(lambda: len(attempts(job)) == 2 and job_state(job) == "running", 90, "attempt 2 to run")
    assert attempts(job) == [(1, "lost"), (2, "running")]
    assert job_node(job) == other.node
    assert replica_state(job, 1) == "running"  # the portal last heard it running, before the cut

    # Heal: the old agent says it still runs attempt 1; it is told to stop it, and does.
    connections = cut.proxy.accepted
    cut.proxy.heal()
    wait_for(lambda: cut.proxy.accepted > connections, 60, "the cut-off agent to reconnect")
    wait_for(lambda: replica_state(job, 1) in ("exited", "vanished"), 60, "attempt 1 to be stopped")
    # Its late reports changed nothing: attempt 1 stays lost, attempt 2 runs on.
    assert attempts(job) == [(1, "lost"), (2, "running")]
    assert job_state(job) == "running" and job_node(job) == other.node


def test_an_agent_killed_with_its_job_gets_a_new_attempt_of_the_same_job(api, agents) -> None:  # type: ignore[no-untyped-def]
    """F2: SIGKILL of the agent and of the job's processes, then the agent restarts."""
    agent = agents("a100-node-1")
    wait_ready("a100-node-1")
    job = api("alice").submit("killed", SLEEP.format(seconds=300))
    wait_for(lambda: job_state(job) == "running", 60, "the job to run")

    agent.kill()
    agent.kill_jobs()
    agent.start()
    wait_for(lambda: len(attempts(job)) == 2 and job_state(job) == "running", 60, "attempt 2 to run")
    first = JobAttempt.objects.get(job_id=job, number=1)
    assert first.state == "lost" and "vanished" in first.end_reason
    assert replica_state(job, 1) == "vanished"
    events = list(Job.objects.get(pk=job).events.values_list("to_state", flat=True))
    lost = events.index("lost")
    assert events[lost : lost + 2] == ["lost", "pending"] and events[-1] == "running"

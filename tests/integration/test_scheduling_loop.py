"""The scheduling loop end to end: REST, the Celery worker and beat, real agents running real
processes on simulated GPUs. Every test ends with the invariants checked."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobAttempt, LogLine
from tests.conftest import wait_for
from tests.integration.invariants import assert_invariants

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SLEEP = "import time\nprint('started', flush=True)\ntime.sleep({seconds})\n"
WHO_AM_I = (
    "import os, time\n"
    "nodes = os.environ['GPUPORTAL_REPLICA_NODES']\n"
    "replica = int(os.environ['GPUPORTAL_REPLICA'])\n"
    "print(f\"replica={replica} of {os.environ['GPUPORTAL_REPLICAS']} on {nodes.split(',')[replica]}, "
    'peers {nodes}", flush=True)\n'
    "time.sleep(1)\n"
)
EXIT_WITH = "import sys\nprint('exiting', flush=True)\nsys.exit({code})\n"
# Ignores the checkpoint signal, so a checkpoint request can only end by the grace period.
STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: print('ignoring', flush=True))\n"
    "print('started', flush=True)\ntime.sleep(300)\n"
)
# Counts for as long as it runs: a paused and resumed process goes on from where it stopped.
TICKER = (
    "import time\nprint('started', flush=True)\nn = 0\n"
    "while True:\n    n += 1\n    print(f'tick {n}', flush=True)\n    time.sleep(0.2)\n"
)


@pytest.fixture
def api(live_stack: dict[str, Any], users: dict[str, Any]) -> Any:
    clients: dict[str, httpx.Client] = {}

    def client(username: str) -> httpx.Client:
        if username not in clients:
            _, token = create_api_token(users[username], "loop")
            clients[username] = httpx.Client(
                base_url=live_stack["http"], headers={"Authorization": f"Bearer {token}"}, timeout=10
            )
        return clients[username]

    return client


@pytest.fixture
def a100_agents(start_agent: Any) -> list[Any]:
    agents = [start_agent("a100-node-1"), start_agent("a100-node-2")]
    wait_for(lambda: Node.objects.filter(name__startswith="a100", state="ready").count() == 2, 30, "agents")
    return agents


def submit(client: httpx.Client, name: str, script: str, **spec: Any) -> int:
    body = {"name": name, "vc": "vision", "flavor": "s-A100", "command": ["python3", "-c", script], **spec}
    response = client.post("/api/v1/jobs/", json=body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def state(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def events(job_id: int) -> list[str]:
    return list(Job.objects.get(pk=job_id).events.exclude(to_state="").values_list("to_state", flat=True))


def test_a_gang_starts_whole_or_not_at_all(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    alice = api("alice")
    small = submit(alice, "small", SLEEP.format(seconds=4))
    wait_for(lambda: state(small) == "running", 60, "the small job to run")
    gang = submit(alice, "gang", WHO_AM_I, flavor="l-A100", replicas=2)
    wait_for(lambda: Job.objects.get(pk=gang).pending_reason not in ("", "new"), 30, "a reason for the gang")
    assert state(gang) == "pending"
    assert not Allocation.objects.filter(attempt__job_id=gang).exists()  # no partial hold
    assert Job.objects.get(pk=gang).pending_message
    assert_invariants()
    wait_for(lambda: state(gang) in ("running", "succeeded"), 60, "the gang to start after the small job")
    nodes = set(Allocation.objects.filter(attempt__job_id=gang).values_list("node__name", flat=True))
    assert nodes == {"a100-node-1", "a100-node-2"}
    assert_invariants()
    wait_for(lambda: state(gang) == "succeeded", 60, "the gang to finish")
    assert_invariants()
    # Each replica knows its rank, the gang's size and where its peers run, in replica order.
    placed = dict(Allocation.objects.filter(attempt__job_id=gang).values_list("replica", "node__name"))
    peers = f"{placed[0]},{placed[1]}"
    lines = [line["text"] for line in alice.get(f"/api/v1/jobs/{gang}/logs/").json()["results"]]
    assert sorted(line for line in lines if line.startswith("replica=")) == [
        f"replica=0 of 2 on {placed[0]}, peers {peers}",
        f"replica=1 of 2 on {placed[1]}, peers {peers}",
    ]


def test_retries_with_backoff_then_a_permanent_failure(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    alice = api("alice")
    flaky = submit(alice, "flaky", EXIT_WITH.format(code=1), retries={"limit": 1, "backoff_seconds": 1})
    permanent = submit(
        alice, "permanent", EXIT_WITH.format(code=2), retries={"limit": 3, "permanent_exit_codes": [2]}
    )
    wait_for(
        lambda: state(flaky) == "failed" and state(permanent) == "failed", 90, "both jobs to fail for good"
    )
    assert JobAttempt.objects.filter(job_id=flaky).count() == 2
    assert events(flaky).count("pending") == 2 and events(flaky)[-1] == "failed"  # submitted, then one retry
    assert JobAttempt.objects.filter(job_id=permanent).count() == 1
    assert "permanent" in Job.objects.get(pk=permanent).end_reason
    assert_invariants()


def test_a_job_is_stopped_at_its_time_limit(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    # 10 s: longer than the 5 s between checks, so one of them sees it before its limit and warns.
    job = submit(api("alice"), "too-long", SLEEP.format(seconds=300), time_limit=10)
    wait_for(lambda: state(job) == "timed-out", 60, "the job to time out")
    reasons = list(Job.objects.get(pk=job).events.values_list("reason", flat=True))
    assert any("reaches its time limit in" in r for r in reasons)  # the warning
    assert any("reached: stopping" in r for r in reasons)
    assert not Allocation.objects.filter(attempt__job_id=job, released_at__isnull=True).exists()
    assert_invariants()


def test_a_lost_node_s_job_is_requeued_and_the_returning_agent_stops_it(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    job = submit(api("alice"), "survivor", SLEEP.format(seconds=40))
    wait_for(lambda: state(job) == "running", 60, "the job to run")
    first_node = Allocation.objects.filter(attempt__job_id=job).values_list("node__name", flat=True).first()
    lost_agent = next(a for a in a100_agents if a.node == first_node)
    lost_agent.kill()
    wait_for(lambda: JobAttempt.objects.filter(job_id=job).count() == 2, 60, "a second attempt elsewhere")
    wait_for(lambda: state(job) == "running", 60, "the second attempt to run")
    second = JobAttempt.objects.get(job_id=job, number=2)
    assert set(second.allocations.values_list("node__name", flat=True)) == {
        a.node for a in a100_agents if a is not lost_agent
    }
    assert JobAttempt.objects.get(job_id=job, number=1).state == "lost"
    assert "lost" in events(job)
    assert_invariants()
    # The agent comes back: the first attempt's process is no longer desired and is stopped.
    lost_agent.start()
    wait_for(
        lambda: (
            JobAttempt.objects.get(job_id=job, number=1).replica_states["0"]["state"]
            in ("exited", "vanished")
        ),
        60,
        "the returning agent to stop the old attempt",
    )
    assert state(job) == "running" and JobAttempt.objects.filter(job_id=job).count() == 2
    assert_invariants()


def test_priority_preemption_and_cancel_during_the_checkpoint(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    alice = api("alice")
    stubborn = submit(
        alice,
        "stubborn",
        STUBBORN,
        flavor="l-A100",
        replicas=2,
        priority="dev",
        checkpoint={"enabled": True, "grace_seconds": 60},
    )
    wait_for(lambda: state(stubborn) == "running", 60, "the dev gang to run")
    # Both replicas past the point where they ignore the checkpoint signal: one that arrived
    # before would end the process (SIGUSR1's default), and the job with it, within a poll.
    wait_for(
        lambda: LogLine.objects.filter(attempt__job_id=stubborn, text="started").count() == 2,
        60,
        "both replicas to print their first line",
    )
    # Production is for tenant admins.
    urgent = submit(
        api("vision-admin"), "urgent", SLEEP.format(seconds=1), flavor="l-A100", priority="production"
    )
    wait_for(lambda: state(stubborn) == "checkpointing", 60, "the dev job to be asked to checkpoint")
    assert state(urgent) == "pending"
    assert_invariants()
    assert alice.post(f"/api/v1/jobs/{stubborn}/cancel/").json()["state"] == "cancelled"
    wait_for(lambda: state(urgent) == "succeeded", 60, "the production job to run once the GPUs are free")
    assert "checkpointing" in events(stubborn) and events(stubborn)[-1] == "cancelled"
    assert_invariants()


def test_a_vc_reclaims_its_guarantee_from_a_borrower(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    carol = api("carol")
    borrower = submit(
        carol,
        "borrower",
        SLEEP.format(seconds=300),
        vc="speech",
        flavor="l-A100",
        replicas=2,
        checkpoint={"enabled": False, "grace_seconds": 2},
    )
    wait_for(lambda: state(borrower) == "running", 60, "speech to borrow all 16 A100")
    owner = submit(api("alice"), "owner", SLEEP.format(seconds=1), flavor="l-A100")
    wait_for(lambda: state(owner) == "succeeded", 120, "vision to get its guaranteed GPUs back and finish")
    assert "checkpointing" in events(borrower) and "preempted" in events(borrower)
    assert_invariants()
    Job.objects.filter(pk=borrower)  # still queued or running again; never above its quota


def ticks(job_id: int) -> list[int]:
    lines = LogLine.objects.filter(attempt__job_id=job_id, text__startswith="tick ").values_list(
        "text", flat=True
    )
    return sorted(int(line.split()[1]) for line in lines)


def gpus_of(job_id: int, suspended: bool) -> set[tuple[str, int]]:
    held = Allocation.objects.filter(attempt__job_id=job_id, released_at__isnull=True, suspended=suspended)
    return set(held.values_list("node__name", "gpu__index"))


def test_time_sliced_jobs_take_turns_on_the_same_gpus(api, a100_agents) -> None:  # type: ignore[no-untyped-def]
    """Vision may hold 16 A100 (8 guaranteed, 8 borrowed). With two 8-GPU jobs running, a third
    time-sliceable one takes turns with the time-sliceable one: paused and resumed, never
    restarted; the job that did not opt in is never suspended."""
    alice = api("alice")
    first = submit(alice, "first", TICKER, flavor="l-A100", time_sliceable=True)
    steady = submit(alice, "steady", SLEEP.format(seconds=300), flavor="l-A100")
    wait_for(lambda: state(first) == "running" and state(steady) == "running", 60, "two jobs to run")
    first_gpus = gpus_of(first, suspended=False)
    second = submit(alice, "second", TICKER, flavor="l-A100", time_sliceable=True)

    wait_for(lambda: state(second) == "running", 60, "the second job to take the first one's turn")
    assert state(first) == "suspended"
    assert gpus_of(second, suspended=False) == first_gpus == gpus_of(first, suspended=True)
    assert_invariants()
    # The agent paused the first job's process where it was.
    wait_for(
        lambda: JobAttempt.objects.get(job_id=first).replica_states["0"]["state"] == "suspended",
        30,
        "the agent to report the first job paused",
    )
    before = ticks(first)[-1]

    wait_for(lambda: state(first) == "running", 60, "the first job's next turn")
    assert state(second) == "suspended"
    assert gpus_of(first, suspended=False) == first_gpus
    assert_invariants()
    wait_for(lambda: ticks(first)[-1] > before + 5, 30, "the first job to count on after its resume")
    counted = ticks(first)
    assert counted == list(range(1, counted[-1] + 1))  # one process throughout: no count restarted
    assert JobAttempt.objects.filter(job_id=first).count() == 1
    assert LogLine.objects.filter(attempt__job_id=first, text="started").count() == 1
    assert events(first)[-3:] == ["running", "suspended", "running"]
    assert "suspended" not in events(steady)

    # Cancel works on a suspended job: its paused process is stopped and its GPUs freed.
    wait_for(lambda: state(second) == "suspended", 60, "the second job to be suspended")
    assert alice.post(f"/api/v1/jobs/{second}/cancel/").json()["state"] == "cancelled"
    wait_for(
        lambda: JobAttempt.objects.get(job_id=second).replica_states["0"]["state"] in ("exited", "vanished"),
        30,
        "the agent to stop the paused process",
    )
    for job in (first, steady):
        alice.post(f"/api/v1/jobs/{job}/cancel/")
    assert not Allocation.objects.filter(released_at__isnull=True).exists()
    assert_invariants()


# Counts steps, saves on the checkpoint signal (the agent then stops it) and, on a resumed
# attempt, goes on from the saved step.
CHECKPOINTER = """
import json, os, signal, time
directory = os.environ["GPUPORTAL_CHECKPOINT_DIR"]
step = 0

def save(*_):
    with open(os.path.join(directory, "state"), "w") as f:
        f.write(str(step))
    with open(os.path.join(directory, ".marker"), "w") as f:
        json.dump({"step": step, "path": "state"}, f)
    os.replace(os.path.join(directory, ".marker"), os.path.join(directory, "checkpoint.json"))

signal.signal(signal.SIGUSR1, save)
os.makedirs(directory, exist_ok=True)
if os.environ.get("GPUPORTAL_RESUME") == "1":
    with open(os.path.join(directory, "checkpoint.json")) as f:
        step = json.load(f)["step"]
print(f"from {step}", flush=True)
while True:
    step += 1
    time.sleep(0.1)
"""


def test_a_migration_frees_a_node_for_a_blocked_gang(api, a100_agents, users) -> None:  # type: ignore[no-untyped-def]
    """Two 2-GPU jobs on two 8-GPU nodes leave 12 GPUs free but no node with 8: the 8-GPU job is
    blocked by fragmentation alone. One small job checkpoints, stops, and resumes from its
    checkpoint beside the other, and the 8-GPU job starts on the node it left."""
    from portal.cluster.services import set_node_state

    alice = api("alice")
    admin = users["admin"]
    node_1, node_2 = (Node.objects.get(name=name) for name in ("a100-node-1", "a100-node-2"))
    small: list[int] = []
    for here, there in ((node_1, node_2), (node_2, node_1)):  # one small job on each node
        set_node_state(there, "cordon", admin)
        job = submit(
            alice, f"small-{here.name}", CHECKPOINTER, checkpoint={"enabled": True, "grace_seconds": 30}
        )
        small.append(job)
        # Running, and past the point where it listens for the checkpoint signal.
        wait_for(
            lambda job=job: LogLine.objects.filter(attempt__job_id=job).exists(), 60, "a small job to run"
        )
        assert gpus_of(job, suspended=False) <= {(here.name, i) for i in range(8)}
        set_node_state(there, "uncordon", admin)
    wait_for(lambda: Node.objects.filter(name__startswith="a100", state="ready").count() == 2, 30, "uncordon")

    gang = submit(alice, "wide", SLEEP.format(seconds=1), flavor="l-A100")
    wait_for(lambda: state(gang) == "succeeded", 120, "the 8-GPU job to start and finish")
    moved = [job for job in small if "preempted" in events(job)]
    assert len(moved) == 1, [events(job) for job in small]
    moved_job = moved[0]
    preemption = Job.objects.get(pk=moved_job).events.filter(to_state="checkpointing").get()
    assert preemption.data["preemption"] == "defrag" and preemption.data["for_job"] == str(gang)
    # Requeued as moved, so the next cycle restarts it first in line.
    requeued = Job.objects.get(pk=moved_job).events.filter(to_state="pending").order_by("created_at").last()
    assert requeued is not None and requeued.reason.startswith("requeued after a migration")
    wait_for(lambda: state(moved_job) == "running", 60, "the moved job to run again")
    second = JobAttempt.objects.get(job_id=moved_job, number=2)
    assert second.resume
    resumed_from = LogLine.objects.filter(attempt=second, text__startswith="from ").values_list(
        "text", flat=True
    )
    wait_for(lambda: resumed_from.exists(), 30, "the resumed attempt's first line")
    assert int(resumed_from.first().split()[1]) > 0  # it went on from its checkpoint
    # Both small jobs now share one node; the wide job had the other one to itself.
    nodes = {name for job in small for name, _ in gpus_of(job, suspended=False)}
    assert len(nodes) == 1
    wide_nodes = set(Allocation.objects.filter(attempt__job_id=gang).values_list("node__name", flat=True))
    assert len(wide_nodes) == 1 and wide_nodes.isdisjoint(nodes)
    assert_invariants()
    for job in small:
        alice.post(f"/api/v1/jobs/{job}/cancel/")
    assert_invariants()


def test_draining_a_node_moves_its_job_to_another_node(api, a100_agents, users) -> None:  # type: ignore[no-untyped-def]
    """A cordon keeps the job where it runs; a drain checkpoints it and it starts again from its
    checkpoint on the other node, even as a production job that nothing else may preempt."""
    from portal.cluster.services import set_node_state

    admin = users["admin"]
    job = submit(
        api("vision-admin"),
        "drained",
        CHECKPOINTER,
        priority="production",
        checkpoint={"enabled": True, "grace_seconds": 30},
    )
    wait_for(lambda: LogLine.objects.filter(attempt__job_id=job).exists(), 60, "the job to run")
    [(first_node, _), *_] = sorted(gpus_of(job, suspended=False))
    node = Node.objects.get(name=first_node)
    set_node_state(node, "cordon", admin)
    assert state(job) == "running" and "checkpointing" not in events(job)

    set_node_state(node, "drain", admin)
    wait_for(lambda: JobAttempt.objects.filter(job_id=job, number=2).exists(), 60, "a second attempt")
    wait_for(lambda: state(job) == "running", 60, "the job to run again")
    assert {name for name, _ in gpus_of(job, suspended=False)} == {
        "a100-node-2" if first_node == "a100-node-1" else "a100-node-1"
    }
    asked = Job.objects.get(pk=job).events.filter(to_state="checkpointing").get()
    assert asked.data == {"preemption": "drain"}
    assert asked.reason.startswith(f"node {first_node} is being drained")
    requeued = Job.objects.get(pk=job).events.filter(to_state="pending").order_by("created_at").last()
    assert (
        requeued is not None
        and requeued.reason == "requeued after its node was drained: it starts again elsewhere"
    )
    second = JobAttempt.objects.get(job_id=job, number=2)
    resumed_from = LogLine.objects.filter(attempt=second, text__startswith="from ").values_list(
        "text", flat=True
    )
    wait_for(lambda: resumed_from.exists(), 30, "the resumed attempt's first line")
    assert second.resume and int(resumed_from.first().split()[1]) > 0
    assert_invariants()
    api("vision-admin").post(f"/api/v1/jobs/{job}/cancel/")


def test_the_owner_is_mailed_about_the_states_the_spec_names(
    api, a100_agents, users, live_stack, mailbox
) -> None:  # type: ignore[no-untyped-def]
    """Through the real worker and a real SMTP server: running and succeeded were asked for,
    so two mails; the states in between (scheduled, starting) send none."""
    users["alice"].email = "alice@example.org"
    users["alice"].save(update_fields=["email"])
    job = submit(api("alice"), "mailed", SLEEP.format(seconds=1), notify=["running", "succeeded"])
    wait_for(lambda: state(job) == "succeeded", 60, "the job to succeed")
    wait_for(lambda: len(mailbox.about(f"Job {job} ")) == 2, 60, "two mails about the job")
    running, succeeded = sorted(mailbox.about(f"Job {job} "), key=lambda m: "succeeded" in str(m["Subject"]))
    assert str(running["Subject"]) == f"Job {job} (mailed) is running"
    assert str(succeeded["Subject"]) == f"Job {job} (mailed) succeeded"
    assert succeeded["X-Envelope-To"] == "alice@example.org"
    body = succeeded.get_content()
    assert f"Job {job} (mailed) in VC vision succeeded" in body
    assert f"{live_stack['http']}/jobs/{job}" in body

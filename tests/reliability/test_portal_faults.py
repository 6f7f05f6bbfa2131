"""Faults of the portal's own processes and data stores (reliability-security.md F9, F10, F11):
SIGKILL of web, worker and beat, a PostgreSQL restart under a burst of submissions, a Redis
restart. A real agent runs real jobs throughout.

Covered elsewhere: F6 (a worker killed between the cycle's decision and its commit) and F7 (two
cycles at once) in tests/integration/test_cycle_safety.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest
from django.utils import timezone

from portal.accounts.models import AuditEntry
from portal.cluster.models import Node
from portal.jobs.models import Job, JobAttempt, JobEvent, LogLine
from tests.conftest import wait_for
from tests.reliability.conftest import SLEEP, job_state, wait_ready
from tests.reliability.stack import restart_postgres

pytestmark = pytest.mark.django_db(transaction=True)

HEARTBEAT_CHECK = "portal.cluster.tasks.check_node_heartbeats"


def queue(job_ids: list[int]) -> list[int]:
    """The jobs still waiting, in the scheduler's order."""
    return list(
        Job.objects.filter(pk__in=job_ids, state="pending")
        .order_by("queue_position")
        .values_list("pk", flat=True)
    )


def heard_since(node: str, moment: object) -> bool:
    return Node.objects.filter(name=node, last_heartbeat_at__gt=moment).exists()


@pytest.mark.parametrize(
    "downtime",
    [0, 5, 10],
    ids=["restarted-at-once", "down-longer-than-suspect", "down-longer-than-node-lost"],
)
def test_killing_every_portal_process_keeps_running_jobs_and_the_queue(api, agents, portal, downtime) -> None:  # type: ignore[no-untyped-def]
    """F11: web, worker and beat are SIGKILLed together and come back after `downtime` seconds:
    0, longer than the 4 s after which a silent node is suspect, or than the 8 s after which it
    is lost."""
    agent = agents("a100-node-1")
    wait_ready("a100-node-1")
    alice = api("alice")
    running = alice.submit("whole-node", SLEEP.format(seconds=300), flavor="l-A100")
    wait_for(lambda: job_state(running) == "running", 60, "the job to run")
    waiting = [alice.submit(f"waiting-{i}", SLEEP.format(seconds=1), flavor="l-A100") for i in range(3)]
    positions = Job.objects.filter(pk__in=waiting).values_list("queue_position", flat=True)
    wait_for(lambda: None not in list(positions.all()), 30, "the waiting jobs to get queue positions")
    before = queue(waiting)

    portal.kill()
    time.sleep(downtime)  # the outage lasts this long by design
    restarted = timezone.now()
    portal.start()
    wait_for(lambda: heard_since(agent.node, restarted), 60, "the agent to reconnect")
    wait_for(lambda: portal.task_succeeded(HEARTBEAT_CHECK), 30, "a heartbeat check after the restart")
    offset = portal.log_size("worker")
    wait_for(lambda: portal.task_succeeded(HEARTBEAT_CHECK, offset), 30, "a check after the reconnect")

    # The running job never stopped and was never restarted; the queue is as it was.
    assert job_state(running) == "running"
    assert list(JobAttempt.objects.filter(job_id=running).values_list("number", "state")) == [(1, "running")]
    assert JobAttempt.objects.get(job_id=running).replica_states["0"]["state"] == "running"
    assert Node.objects.get(name=agent.node).state == "ready"
    assert queue(waiting) == before

    # Cancel works after the restart, for a waiting job and for the running one.
    assert alice.post(f"/api/v1/jobs/{waiting[-1]}/cancel/").status_code == 200
    assert alice.post(f"/api/v1/jobs/{running}/cancel/").status_code == 200
    wait_for(
        lambda: JobAttempt.objects.get(job_id=running).replica_states["0"]["state"] == "exited",
        30,
        "the agent to stop the cancelled job",
    )
    wait_for(lambda: job_state(waiting[0]) == "running", 60, "the first waiting job to start")


def test_a_postgresql_restart_during_a_burst_of_submissions(api, agents, portal, invariants_checked) -> None:  # type: ignore[no-untyped-def]
    """F9: 200 submissions from 8 clients; PostgreSQL restarts once 40 have been answered. Each
    answer is 201 (and the job is stored) or 503 with Retry-After; nothing half-written."""
    agents("a100-node-1")
    wait_ready("a100-node-1")
    alice = api("alice")
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def submit(client_no: int) -> None:
        with httpx.Client(base_url=portal.http, headers=alice.client.headers, timeout=60) as client:
            for i in range(25):
                body = {
                    "name": f"burst-{client_no}-{i}",
                    "vc": "vision",
                    "flavor": "s-A100",
                    "command": ["python3", "-c", "pass"],
                }
                try:
                    response = client.post("/api/v1/jobs/", json=body)
                except httpx.TransportError as exc:  # noted, and fails the test below
                    response = httpx.Response(599, text=repr(exc))
                with lock:
                    answers.append(response)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(answers) >= 40, 120, "40 answers")
    restart_postgres()
    restarted = timezone.now()
    for thread in threads:
        thread.join(timeout=300)

    codes = Counter(r.status_code for r in answers)
    unexpected = [r.text[:300] for r in answers if r.status_code not in (201, 503)]
    assert len(answers) == 200 and set(codes) <= {201, 503}, (codes, unexpected[:3])
    assert all(r.headers.get("Retry-After") for r in answers if r.status_code == 503)
    acknowledged = {int(r.json()["id"]) for r in answers if r.status_code == 201}
    invariants_checked.update(acknowledged)
    stored = set(Job.objects.filter(name__startswith="burst-").values_list("pk", flat=True))
    assert stored == acknowledged, "a job was stored without a 201, or acknowledged and lost"
    # No orphan: an audit entry (it has no foreign key) names exactly the stored jobs.
    audited = set(AuditEntry.objects.filter(action="job.submit").values_list("object_id", flat=True))
    assert audited == {str(pk) for pk in stored}
    # The loop goes on after the database returns.
    wait_for(
        lambda: JobEvent.objects.filter(to_state="scheduled", created_at__gt=restarted).exists(),
        60,
        "a scheduling cycle after the restart",
    )


def test_a_redis_restart_loses_no_job_and_the_loop_recovers(api, agents, portal) -> None:  # type: ignore[no-untyped-def]
    """F10: Redis (broker, channel layer, cache) restarts empty while a job runs."""
    agents("a100-node-1")
    wait_ready("a100-node-1")
    alice = api("alice")
    counting = "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)\n"
    through = alice.submit("through", counting)
    wait_for(lambda: job_state(through) == "running", 60, "the job to run")
    portal.restart_redis()
    wait_for(lambda: job_state(through) == "succeeded", 60, "the job to finish after the restart")
    # The lines the portal stored are in order and none twice. (A chunk that was in flight when
    # the gateway dropped the socket may be missing: agents do not resend log chunks.)
    lines = list(LogLine.objects.filter(attempt__job_id=through).values_list("text", flat=True))
    assert lines == sorted(set(lines), key=int) and set(lines) <= {str(i) for i in range(8)}
    assert "7" in lines  # the end, sent after the restart
    after = alice.submit("after", "print('after', flush=True)\n")
    wait_for(lambda: job_state(after) == "succeeded", 60, "a job submitted after the restart to run")


def test_worker_and_beat_killed_while_the_web_takes_submissions(api, agents, portal) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL of the Celery worker and beat: submissions are still acknowledged, and once they
    are back, the cycles the dead worker never ran are made up."""
    agents("a100-node-1")
    wait_ready("a100-node-1")
    alice = api("alice")
    portal.kill("worker", "beat")
    job = alice.submit("while-no-worker", "print('ran', flush=True)\n")
    assert job_state(job) == "pending"
    portal.start("worker", "beat")
    wait_for(lambda: job_state(job) == "succeeded", 60, "the job to run after the worker returns")

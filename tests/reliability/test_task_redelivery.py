"""F8: a task that runs longer than the Redis broker's visibility timeout.

Redis has no acknowledgements of its own: kombu keeps a delivered, unacknowledged message aside
and puts it back on the queue once it has been out for longer than ``visibility_timeout``, so a
slow task that acknowledges late runs a second time while its first run is still going. Which
tasks this can hit:

- ``scheduler.tasks.schedule_cycle`` (the only task that starts attempts) acknowledges early
  (``acks_late=False``): it is never redelivered. Were it delivered twice anyway, the second copy
  waits for the advisory lock and then finds the jobs started (compare-and-set on the job state).
- ``portal.cluster.tasks.check_node_heartbeats`` acknowledges late (``CELERY_TASK_ACKS_LATE``):
  it is redelivered. It ends the attempts of lost nodes and requeues their jobs, which the next
  cycle starts again elsewhere; the second copy must find that done and change nothing.

The worker here runs on a Redis of its own with a 5 s visibility timeout, swept every second,
and two processes (so a redelivered copy runs while the first is still busy). A fault hook, set
through Redis by the test, makes the first call of a task's core step sleep past the timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobAttempt, JobEvent
from scheduler.tasks import run_cycle
from tests.conftest import database_url_of_tests, wait_for
from tests.reliability.stack import PortalStack

pytestmark = pytest.mark.django_db(transaction=True)

VISIBILITY_TIMEOUT_S = 5
SLOW_S = 12  # past the timeout and its one-second sweep, with room for a loaded machine
CYCLE = "scheduler.tasks.schedule_cycle"
HEARTBEAT_CHECK = "portal.cluster.tasks.check_node_heartbeats"

# The worker with the fault hook: `apply_plan` (the cycle's writes, before its commit) and
# `requeue_jobs_of_lost_node` (the heartbeat check's writes) record each call in Redis, and the
# first call after the test set a delay sleeps that long, before or after doing its work.
WORKER = """
import json, os, sys, time
import django
django.setup()
from celery import current_task
from portal.celery import app
import portal.cluster.tasks as heartbeat_tasks
import scheduler.tasks as cycle_tasks
from portal.lib.redis import get_redis

app.conf.broker_transport_options = {
    "visibility_timeout": TIMEOUT,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}


def hooked(name, function):
    def run(*args, **kwargs):
        redis = get_redis()
        delay = redis.getdel(f"f8:slow-before:{name}")
        if delay:
            time.sleep(float(delay))
        result = function(*args, **kwargs)
        call = {"pid": os.getpid(), "task_id": current_task.request.id, "result": result}
        redis.rpush(f"f8:calls:{name}", json.dumps(call, default=str))
        delay = redis.getdel(f"f8:slow-after:{name}")
        if delay:
            time.sleep(float(delay))
        return result
    return run


cycle_tasks.apply_plan = hooked("apply_plan", cycle_tasks.apply_plan)
heartbeat_tasks.requeue_jobs_of_lost_node = hooked(
    "requeue", heartbeat_tasks.requeue_jobs_of_lost_node
)
app.worker_main(["worker", "-l", "info", "--concurrency", "2", "-n", sys.argv[1]])
""".replace("TIMEOUT", str(VISIBILITY_TIMEOUT_S))


class RedeliveryStack(PortalStack):
    """Only a worker (no web, no beat: the test sends every task itself), with the hook above."""

    worker_prefix = "redelivery"

    def command(self, name: str) -> list[str]:
        assert name == "worker"
        return [sys.executable, "-c", WORKER, f"{self.worker_prefix}-{self.port}@%h"]

    def celery(self) -> Any:
        """A client of this worker's broker that does not become the process's current app: the
        broker stops with this module, and later tests' submissions must not send cycles to it."""
        if self._celery is None:
            from celery import Celery

            self._celery = Celery("redelivery-probe", broker=self.env["REDIS_URL"], set_as_current=False)
        return self._celery


@pytest.fixture(scope="module")
def redelivery_stack(django_db_setup: Any, tmp_path_factory: Any) -> Iterator[RedeliveryStack]:

    run_dir = tmp_path_factory.mktemp("redelivery")
    env = {
        **os.environ,
        "DATABASE_URL": database_url_of_tests(),
        "DEBUG": "true",
        "PYTHONUNBUFFERED": "1",
        "CHECKPOINT_ROOT": str(run_dir / "checkpoints"),
        "NODE_SILENT_AFTER_S": "4",
        "NODE_LOST_AFTER_S": "8",
    }
    stack = RedeliveryStack(env, run_dir)
    stack.set_paused(True)
    stack.start("worker")
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def worker(redelivery_stack: RedeliveryStack, users: dict[str, Any]) -> Iterator[RedeliveryStack]:
    """The worker, paused until the test has set the scene, paused again and idle after the test,
    before the database is reset."""
    redis = redelivery_stack.redis_client()
    for key in redis.keys("f8:*"):
        redis.delete(key)
    yield redelivery_stack
    redelivery_stack.set_paused(True)
    redelivery_stack.wait_idle()


def unpause_when_settled(stack: PortalStack) -> None:
    """Lets the worker act once anything queued while it was paused has been consumed, so that
    the only tasks it runs are the ones the test sends."""
    wait_for(lambda: stack.redis_client().llen("celery") == 0, 30, "the queue to drain")
    stack.wait_idle()
    stack.set_paused(False)


def calls(stack: PortalStack, name: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in stack.redis_client().lrange(f"f8:calls:{name}", 0, -1)]


def deliveries(stack: PortalStack, task_id: str) -> int:
    """How many times the worker received the message of `task_id`."""
    return stack.log("worker").count(f"[{task_id}] received")


def runs_finished(stack: PortalStack, task_id: str) -> int:
    return stack.log("worker").count(f"[{task_id}] succeeded in")


def submit_jobs(users: dict[str, Any], count: int, flavor: str) -> list[int]:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(users["alice"])
    ids = []
    for i in range(count):
        spec = {"name": f"f8-{i}", "vc": "vision", "flavor": flavor, "command": "true"}
        response = client.post("/api/v1/jobs/", spec, format="json")
        assert response.status_code == 201, response.content
        ids.append(response.json()["id"])
    return ids


def one_live_allocation_set_per_started_job() -> None:
    """Every started job has exactly one attempt, and 4 live allocations of it (m-A100)."""
    for job in Job.objects.filter(state="scheduled"):
        assert job.attempts.count() == 1, job
        assert Allocation.objects.filter(attempt__job=job, released_at__isnull=True).count() == 4


def test_a_cycle_longer_than_the_visibility_timeout_runs_once(worker: RedeliveryStack, users) -> None:  # type: ignore[no-untyped-def]
    """The cycle acknowledges its message when it starts, so nothing is left to redeliver: one
    delivery, one apply, after twice the timeout."""
    Node.objects.update(state="ready")
    submit_jobs(users, 6, "m-A100")  # 16 A100 in vision's reach: 4 of the 6 fit
    worker.redis_client().set("f8:slow-after:apply_plan", SLOW_S)
    unpause_when_settled(worker)
    started_at = time.monotonic()
    task_id = worker.celery().send_task(CYCLE).id
    wait_for(lambda: runs_finished(worker, task_id), SLOW_S + 60, "the slow cycle to end")
    assert time.monotonic() - started_at > SLOW_S > 2 * VISIBILITY_TIMEOUT_S
    time.sleep(2)  # a redelivery would have been received by now (the sweep runs every second)
    assert deliveries(worker, task_id) == 1
    assert [(call["task_id"], call["result"]["started"]) for call in calls(worker, "apply_plan")] == [
        (task_id, 4)
    ]
    assert Job.objects.filter(state="scheduled").count() == 4
    assert JobAttempt.objects.count() == 4
    assert Allocation.objects.filter(released_at__isnull=True).count() == 16
    one_live_allocation_set_per_started_job()


def test_a_cycle_delivered_twice_at_once_starts_each_job_once(worker: RedeliveryStack, users) -> None:  # type: ignore[no-untyped-def]
    """A duplicate of the cycle's message (the same task id, as a redelivery would be) while the
    first copy is still applying: the copy waits for the advisory lock, then finds the jobs
    started and starts nothing."""
    Node.objects.update(state="ready")
    submit_jobs(users, 6, "m-A100")
    worker.redis_client().set("f8:slow-after:apply_plan", 4)
    unpause_when_settled(worker)
    first = worker.celery().send_task(CYCLE)
    wait_for(lambda: deliveries(worker, first.id) == 1, 30, "the first copy to be received")
    worker.celery().send_task(CYCLE, task_id=first.id)
    wait_for(lambda: runs_finished(worker, first.id) == 2, 60, "both copies to end")
    applied = calls(worker, "apply_plan")
    copies = [call for call in applied if call["task_id"] == first.id]
    assert len(copies) == 2 and len({call["pid"] for call in copies}) == 2  # both really ran
    assert sorted(call["result"]["started"] for call in copies) == [0, 4]
    assert Job.objects.filter(state="scheduled").count() == 4
    assert JobAttempt.objects.count() == 4
    assert Allocation.objects.filter(released_at__isnull=True).count() == 16
    one_live_allocation_set_per_started_job()


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_redelivered_heartbeat_check_requeues_a_lost_job_once(worker: RedeliveryStack, users, when) -> None:  # type: ignore[no-untyped-def]
    """The heartbeat check acknowledges late and is redelivered while its first copy sleeps
    (before or after it requeues the lost node's job). Whichever copy comes second finds the job
    requeued and does nothing: one lost attempt, one requeue event, and the one new attempt the
    cycle started elsewhere is left alone."""
    from portal.cluster.tasks import CHECKED_AT_KEY, GRACE_KEY

    Node.objects.update(state="ready")
    (job_id,) = submit_jobs(users, 1, "m-A100")
    assert run_cycle()["started"] == 1
    (first_attempt,) = JobAttempt.objects.filter(job_id=job_id)
    lost = Node.objects.get(pk=first_attempt.allocations.values_list("node", flat=True).distinct().get())
    now = timezone.now()
    # Every other node is heard from throughout (so both copies judge the silence to be the
    # node's), the job's node has been silent for long, and the check ran just before.
    Node.objects.exclude(pk=lost.pk).update(last_heartbeat_at=now + timedelta(hours=1))
    Node.objects.filter(pk=lost.pk).update(last_heartbeat_at=now - timedelta(hours=1))
    redis = worker.redis_client()
    redis.set(CHECKED_AT_KEY, now.timestamp() - 1)
    redis.delete(GRACE_KEY)
    redis.set(f"f8:slow-{when}:requeue", SLOW_S)
    unpause_when_settled(worker)

    task_id = worker.celery().send_task(HEARTBEAT_CHECK).id
    wait_for(lambda: deliveries(worker, task_id) == 2, SLOW_S + 30, "the check to be redelivered")
    wait_for(lambda: runs_finished(worker, task_id) == 2, SLOW_S + 60, "both copies to end")
    wait_for(lambda: Job.objects.get(pk=job_id).state == "scheduled", 30, "the requeued job to start again")
    worker.wait_idle()

    requeues = [call["result"] for call in calls(worker, "requeue")]
    # One copy requeued the job. Slowed before its requeue, the first copy then finds nothing left
    # to requeue; slowed after it, the redelivered copy finds no lost node holding GPUs at all.
    assert [result for result in requeues if result] == [[job_id]]
    assert len(requeues) == (2 if when == "before" else 1)
    attempts = list(JobAttempt.objects.filter(job_id=job_id).order_by("number"))
    assert [(a.pk, a.state) for a in attempts[:1]] == [(first_attempt.pk, "lost")]
    assert len(attempts) == 2 and attempts[1].ended_at is None  # the new attempt was not ended
    assert not Allocation.objects.filter(attempt=first_attempt, released_at__isnull=True).exists()
    live = Allocation.objects.filter(attempt=attempts[1], released_at__isnull=True)
    new_nodes = set(live.values_list("node", flat=True))
    assert len(new_nodes) == 1 and lost.pk not in new_nodes
    assert JobEvent.objects.filter(job_id=job_id, to_state="lost").count() == 1
    assert JobEvent.objects.filter(job_id=job_id, to_state="pending").count() == 2  # submitted, requeued


def test_a_copy_that_read_the_lost_nodes_allocations_before_the_requeue_changes_nothing(users) -> None:  # type: ignore[no-untyped-def]
    """The narrowest window of a second copy: it read the lost node's live allocations, then
    stalled; meanwhile the other copy requeued the job and a cycle placed its next attempt on
    another node. When the stalled copy locks the job, the job is active again, but its current
    attempt holds none of the allocations the copy read: it must be left alone."""
    from portal.jobs.services import requeue_jobs_holding, requeue_jobs_of_lost_node

    Node.objects.update(state="ready")
    (job_id,) = submit_jobs(users, 1, "m-A100")
    assert run_cycle()["started"] == 1
    (first_attempt,) = JobAttempt.objects.filter(job_id=job_id)
    lost = Node.objects.get(pk=first_attempt.allocations.values_list("node", flat=True).distinct().get())
    read_before = list(
        Allocation.objects.filter(node=lost, released_at__isnull=True).values_list("pk", flat=True)
    )
    Node.objects.filter(pk=lost.pk).update(state="not-ready")
    assert requeue_jobs_of_lost_node(lost) == [job_id]
    assert run_cycle()["started"] == 1
    second_attempt = JobAttempt.objects.get(job_id=job_id, number=2)

    assert requeue_jobs_holding(Allocation.objects.filter(pk__in=read_before), "stale copy") == []
    second_attempt.refresh_from_db()
    assert second_attempt.ended_at is None and Job.objects.get(pk=job_id).state == "scheduled"
    assert Allocation.objects.filter(attempt=second_attempt, released_at__isnull=True).count() == 4
    assert JobEvent.objects.filter(job_id=job_id, to_state="lost").count() == 1

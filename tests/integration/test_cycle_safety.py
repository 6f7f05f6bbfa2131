"""Two cycles at once never allocate a GPU twice, and a worker killed mid-cycle leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from rest_framework.test import APIClient

from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobAttempt
from scheduler import core
from scheduler.store import apply_plan, load_snapshot
from scheduler.tasks import load_profile, run_cycle
from tests.conftest import database_url_of_tests, wait_for
from tests.integration.invariants import assert_invariants

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]


def advisory_lock_waits(cursor: Any, worker_pids: list[int]) -> int:
    """How many advisory locks the worker's session waits for. Only its own session counts:
    pg_locks spans every database on the server, and other tests' workers may be waiting for
    locks of their own."""
    if not worker_pids:
        return 0
    cursor.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = %s",
        [worker_pids[0]],
    )
    return int(cursor.fetchone()[0])


@pytest.fixture
def ready_cluster_with_jobs(users: dict[str, Any], paused_loop: None) -> list[int]:
    Node.objects.update(state="ready")
    client = APIClient()
    client.force_authenticate(users["alice"])
    ids = []
    for i in range(6):
        spec = {"name": f"j{i}", "vc": "vision", "flavor": "m-A100", "command": "true"}
        ids.append(client.post("/api/v1/jobs/", spec, format="json").json()["id"])
    return ids


def test_two_plans_from_one_snapshot_never_double_book(ready_cluster_with_jobs) -> None:  # type: ignore[no-untyped-def]
    """Without the lock (as if two workers raced), the second plan loses every compare-and-set."""
    now = time.time()
    first, second = load_snapshot(now), load_snapshot(now)
    profile = load_profile()
    plan_a, plan_b = core.decide(first.snapshot, profile, now), core.decide(second.snapshot, profile, now)
    assert plan_a.starts and [s.job_id for s in plan_a.starts] == [s.job_id for s in plan_b.starts]
    with transaction.atomic():
        applied_a = apply_plan(plan_a, first, now)
    with transaction.atomic():
        applied_b = apply_plan(plan_b, second, now)
    assert applied_a["started"] == 4  # 16 A100 in vision's reach, 4 GPUs each
    assert applied_b["started"] == 0
    assert Allocation.objects.filter(released_at__isnull=True).count() == 16
    assert_invariants()


def test_concurrent_cycles_are_serialised_by_the_advisory_lock(ready_cluster_with_jobs) -> None:  # type: ignore[no-untyped-def]
    results: list[Any] = []
    barrier = threading.Barrier(4)

    def cycle() -> None:
        barrier.wait()
        try:
            results.append(run_cycle())
        finally:
            connection.close()

    threads = [threading.Thread(target=cycle) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    started = sum(r["started"] for r in results if r is not None)
    assert started == 4
    assert Job.objects.filter(state="scheduled").count() == 4
    assert_invariants()


KILL_AFTER_APPLY = """
import os, signal, django
django.setup()
import scheduler.tasks as tasks
from scheduler.store import apply_plan

def apply_then_die(plan, loaded, now):
    result = apply_plan(plan, loaded, now)
    print("applied", result, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies before its transaction commits

tasks.apply_plan = apply_then_die
tasks.run_cycle()
"""


def test_a_worker_killed_mid_cycle_leaves_nothing_half_applied(ready_cluster_with_jobs) -> None:  # type: ignore[no-untyped-def]

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_URL": database_url_of_tests(),
        "DEBUG": "true",
    }
    result = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_APPLY],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == -9, result.stderr[-2000:]
    assert "'started': 4" in result.stdout  # it really had written four starts before dying
    assert not Allocation.objects.exists()
    assert not JobAttempt.objects.exists()
    assert set(Job.objects.values_list("state", flat=True)) == {"pending"}
    assert all(job.events.count() == 1 for job in Job.objects.all())
    # The next cycle starts from a clean slate and the lock was released with the dead session.
    assert run_cycle()["started"] == 4
    assert_invariants()


def test_a_cycle_queued_behind_another_does_not_run_once_the_loop_is_paused(ready_cluster_with_jobs) -> None:  # type: ignore[no-untyped-def]
    """A worker's cycle that passed the pause check and waits for the lock sees the pause once
    it has the lock: pausing for maintenance stops cycles already queued, not only new ones."""
    from scheduler.tasks import CYCLE_LOCK, schedule_cycle, set_loop_paused

    set_loop_paused(False)
    results: list[Any] = []
    worker_pids: list[int] = []

    def worker() -> None:
        try:
            with connection.cursor() as own:  # the session the cycle below runs on
                own.execute("SELECT pg_backend_pid()")
                worker_pids.append(own.fetchone()[0])
            results.append(schedule_cycle())
        finally:
            connection.close()

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [CYCLE_LOCK])  # a cycle in progress
        thread = threading.Thread(target=worker)
        thread.start()

        waiting = partial(advisory_lock_waits, cursor, worker_pids)
        assert wait_for(waiting, 20, "the worker's cycle to wait for the lock") == 1
        set_loop_paused(True)
        cursor.execute("SELECT pg_advisory_unlock(%s)", [CYCLE_LOCK])
    thread.join(timeout=60)
    assert results == [{"paused": True}]
    assert Job.objects.filter(state="pending").count() == 6
    assert not Allocation.objects.exists()


def test_a_paused_loop_starts_nothing(ready_cluster_with_jobs, capsys) -> None:  # type: ignore[no-untyped-def]
    from scheduler.tasks import schedule_cycle

    assert schedule_cycle() == {"paused": True}
    assert Job.objects.filter(state="pending").count() == 6
    call_command("scheduler_loop", "status")
    assert capsys.readouterr().out.strip() == "paused"


def test_requests_while_a_requested_cycle_waits_add_no_waiter(ready_cluster_with_jobs) -> None:  # type: ignore[no-untyped-def]
    """A requested cycle waiting behind one in progress keeps the request mark until it holds
    the lock (its snapshot is still to come), so further requests coalesce into it instead of
    each queueing another worker behind the lock; once it holds the lock, a new request
    queues the next cycle. (The loop stays paused for the live stack's worker; the cycle
    below is the one `schedule_cycle` runs for a request.)"""
    from portal.lib.redis import get_redis
    from scheduler.tasks import CYCLE_LOCK, QUEUED_KEY, QUEUED_TTL_MS

    redis = get_redis()
    redis.delete(QUEUED_KEY)  # the fixture's submissions asked for cycles
    results: list[Any] = []
    worker_pids: list[int] = []

    def worker() -> None:
        try:
            with connection.cursor() as own:
                own.execute("SELECT pg_backend_pid()")
                worker_pids.append(own.fetchone()[0])
            results.append(run_cycle(wait=True, requested=True))
        finally:
            connection.close()

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [CYCLE_LOCK])  # a cycle in progress
        assert redis.set(QUEUED_KEY, 1, px=QUEUED_TTL_MS, nx=True)  # what request_cycle did
        thread = threading.Thread(target=worker)
        thread.start()

        waiting = partial(advisory_lock_waits, cursor, worker_pids)
        assert wait_for(waiting, 20, "the requested cycle to wait for the lock") == 1
        # A request now (request_cycle's test-and-set) finds the mark and queues nothing.
        assert not redis.set(QUEUED_KEY, 1, px=QUEUED_TTL_MS, nx=True)
        cursor.execute("SELECT pg_advisory_unlock(%s)", [CYCLE_LOCK])
    thread.join(timeout=60)
    assert [r["started"] for r in results] == [4]
    assert not redis.exists(QUEUED_KEY)  # the next request queues a cycle again

"""GPU health writers lock rows in the order of every other writer: the jobs, then the nodes,
then the GPUs.

record_gpu_health locked the failing GPU and only then the job on it (to requeue it) and the
node (its health event refers to the node; an Xid that needs a reboot drains it). A scheduling
cycle that held the job (to suspend it for another job's time slice on that GPU) and then
locked the GPU FOR SHARE, a hello that held the node and then wrote its GPUs, and, once a drain
held the node, a cancellation of the job on a second failing GPU (it writes the node's
revision) each waited for it while it waited for them. Returning a GPU to service locked the GPU
and then the node, against the same hello. After a hello, the requeue of the jobs on the GPUs
the agent found failed locked the second job only after the first one's requeue had written the
node. PostgreSQL broke each deadlock by failing one side. Here the other writer holds its first
row while the GPU writer comes in, and only then takes the next; with the order of locks the
same on both sides, both go through, one after the other."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from agents.protocol import GpuSample, utc_now
from portal.cluster.models import Gpu, Node
from portal.cluster.services import clear_gpu_health, record_gpu_health, record_hello
from portal.jobs.choices import JobState
from portal.jobs.models import Allocation, Job
from portal.jobs.services import cancel_job
from scheduler import core
from scheduler.store import load_snapshot, still_placeable
from scheduler.tasks import run_cycle
from tests.conftest import wait_for
from tests.portal.agentgw.test_agent_consumer import hello
from tests.portal.store_helpers import placed_attempt, run, submit
from tests.portal.test_report_lock_order import waiting_for_a_lock
from tests.portal.test_time_slicing_store import every_cycle_a_new_turn

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "a100-node-1"


def failure(gpu: Gpu, *xids: int) -> GpuSample:
    return GpuSample(
        gpu_uuid=gpu.uuid, time=utc_now(), healthy=False, health_reason="xid failure", xid_events=list(xids)
    )


def in_another_connection(work: Callable[[], Any], outcome: dict[str, Any]) -> threading.Thread:
    def call() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            outcome["pid"] = cursor.fetchone()[0]
        try:
            outcome["result"] = work()
        except Exception as error:  # the test reports whatever broke it
            outcome["error"] = error
        finally:
            connection.close()

    return threading.Thread(target=call)


def start_and_wait_for_its_lock(other: threading.Thread, outcome: dict[str, Any]) -> None:
    """Starts the other connection's writer, waits until it waits for a lock this test holds,
    and gives this side's next locks a timeout, so that a wait that never ends fails the test."""
    other.start()
    wait_for(lambda: "pid" in outcome, 10, "the other connection")
    wait_for(lambda: waiting_for_a_lock(outcome["pid"]), 10, "the other writer to wait for a lock")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '5s'")


def test_a_failing_gpu_waits_for_a_cycle_that_gives_its_job_s_turn_to_another(  # type: ignore[no-untyped-def]
    api_for, paused_loop
) -> None:
    """The cycle locks the jobs it moves (the time-sliced job it suspends, the job taking the
    turn) and then, for the start, the node and GPUs FOR SHARE (still_placeable): the GPUs of
    the suspended job, one of which fails meanwhile."""
    Node.objects.update(state="ready")
    alice = api_for("alice")
    sliced = submit(alice, "sliced", time_sliceable=True)
    plain = submit(alice, "plain")
    run_cycle(every_cycle_a_new_turn())
    run(sliced)
    run(plain)
    waiting = submit(alice, "waiting", time_sliceable=True)
    now = time.time()
    with transaction.atomic():
        loaded = load_snapshot(now)
        plan = core.decide(loaded.snapshot, every_cycle_a_new_turn(), now)
    [suspend], [start] = plan.suspends, plan.starts
    assert (int(suspend.job_id), int(start.job_id)) == (sliced, waiting)
    gpu = Gpu.objects.filter(allocations__attempt__job_id=sliced).select_related("node").first()
    assert gpu is not None and gpu.index in start.placement[0].gpu_indices

    outcome: dict[str, Any] = {}
    failing = in_another_connection(lambda: record_gpu_health(gpu.node, [failure(gpu)]), outcome)
    with transaction.atomic():
        # The cycle: the jobs it moves first, in id order ...
        jobs = Job.objects.select_for_update().order_by("pk").in_bulk([sliced, waiting])
        start_and_wait_for_its_lock(failing, outcome)
        # ... then the node and GPUs it places on, which the GPU's failure must not be holding.
        assert still_placeable([(jobs[waiting], start)], loaded) == [(jobs[waiting], start)]
    failing.join(timeout=30)

    assert not failing.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] == [gpu.uuid]
    assert Job.objects.get(pk=sliced).state == JobState.PENDING  # requeued once the cycle let go
    assert not Gpu.objects.get(pk=gpu.pk).healthy


def test_a_failing_gpu_waits_for_a_cancellation_of_the_job_on_a_second_failing_gpu(  # type: ignore[no-untyped-def]
    api_for, users, paused_loop
) -> None:
    """One GPU fails with an Xid that drains the node, another one, running a job, fails in the
    same batch; the job is being cancelled (freeing its GPU writes the node's revision)."""
    node, attempt = placed_attempt(api_for)
    job = attempt.job
    used = Gpu.objects.filter(allocations__attempt=attempt).order_by("index").first()
    free = Gpu.objects.filter(node=node).exclude(allocations__attempt=attempt).order_by("index").first()
    assert used is not None
    assert free is not None
    samples = [failure(free, 79), failure(used)]

    outcome: dict[str, Any] = {}
    failing = in_another_connection(lambda: record_gpu_health(node, samples), outcome)
    with transaction.atomic():
        # The cancellation: the job first ...
        job = Job.objects.select_for_update().get(pk=job.pk)
        start_and_wait_for_its_lock(failing, outcome)
        # ... then the node (its desired-set revision), which the drain must not be holding.
        cancel_job(job, users["alice"])
    failing.join(timeout=30)

    assert not failing.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] == [free.uuid, used.uuid]
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED  # it had ended: nothing to requeue
    node.refresh_from_db()
    assert node.state == "draining"
    assert not Gpu.objects.filter(pk__in=[free.pk, used.pk], healthy=True).exists()


@pytest.mark.parametrize("xids", [(), (79,)], ids=["ecc", "xid that drains the node"])
def test_a_failing_gpu_waits_for_a_hello_holding_the_node(users, paused_loop, xids) -> None:  # type: ignore[no-untyped-def]
    """A hello locks the node and then writes its GPUs; the failure report locked the GPU and
    then the node: its health event refers to the node (the key share lock of a foreign key
    waits for the hello's lock), and an Xid that needs a reboot drains it."""
    node = Node.objects.get(name=NODE)
    uuids = {gpu.index: gpu.uuid for gpu in Gpu.objects.filter(node=node)}
    gpu = Gpu.objects.get(node=node, index=0)

    outcome: dict[str, Any] = {}
    failing = in_another_connection(lambda: record_gpu_health(node, [failure(gpu, *xids)]), outcome)
    with transaction.atomic():
        # The hello: the node first (its first statement) ...
        Node.objects.select_for_update().get(pk=node.pk)
        start_and_wait_for_its_lock(failing, outcome)
        # ... then the GPUs, which the failure report must not be holding.
        record_hello(node, hello(NODE, uuids))
    failing.join(timeout=30)

    assert not failing.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] == [gpu.uuid]
    node.refresh_from_db()
    assert (node.state == "draining") == bool(xids)
    assert not Gpu.objects.get(pk=gpu.pk).healthy


def test_returning_a_gpu_to_service_waits_for_a_hello_holding_the_node(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """An admin returns a GPU to service while its node's agent says hello: the GPU's health
    event refers to the node, which the hello holds while it writes the node's GPUs."""
    node = Node.objects.get(name=NODE)
    uuids = {gpu.index: gpu.uuid for gpu in Gpu.objects.filter(node=node)}
    gpu = Gpu.objects.get(node=node, index=0)
    assert record_gpu_health(node, [failure(gpu)]) == [gpu.uuid]

    outcome: dict[str, Any] = {}
    clearing = in_another_connection(lambda: clear_gpu_health(gpu, users["admin"]), outcome)
    with transaction.atomic():
        Node.objects.select_for_update().get(pk=node.pk)  # the hello: the node first ...
        start_and_wait_for_its_lock(clearing, outcome)
        record_hello(node, hello(NODE, uuids))  # ... then its GPUs (this one stays out)
    clearing.join(timeout=30)

    assert not clearing.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] is True
    assert Gpu.objects.get(pk=gpu.pk).healthy


def test_the_requeue_after_a_hello_waits_for_a_cancellation_of_its_second_job(  # type: ignore[no-untyped-def]
    api_for, users, paused_loop
) -> None:
    """An agent restarts and finds two GPUs failed, each running a job; the job on the second
    one is being cancelled. The requeue locked the first job, wrote the node's revision freeing
    its GPU, and then waited for the second job, whose cancellation waited for the node."""
    Node.objects.exclude(name=NODE).update(state="cordoned")
    Node.objects.filter(name=NODE).update(state="ready")
    node = Node.objects.get(name=NODE)
    alice = api_for("alice")
    for name in ("one", "two"):
        submit(alice, name, flavor="s-A100")
    assert run_cycle()["started"] == 2
    held = Allocation.objects.filter(node=node, released_at__isnull=True).order_by("gpu__index")
    lowest: dict[int, int] = {}  # each job's first GPU: the requeue goes through them by index
    for job_id, index in held.values_list("attempt__job_id", "gpu__index"):
        lowest.setdefault(job_id, index)
    (first, first_gpu), (second, second_gpu) = sorted(lowest.items(), key=lambda item: item[1])
    uuids = {gpu.index: gpu.uuid for gpu in Gpu.objects.filter(node=node)}
    greeting = hello(NODE, uuids, {first_gpu: "xid 79", second_gpu: "xid 79"})

    outcome: dict[str, Any] = {}
    restarted = in_another_connection(lambda: record_hello(node, greeting), outcome)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=second)
        start_and_wait_for_its_lock(restarted, outcome)
        cancel_job(job, users["alice"])
    restarted.join(timeout=30)

    assert not restarted.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert Job.objects.get(pk=first).state == JobState.PENDING
    assert Job.objects.get(pk=second).state == JobState.CANCELLED
    assert not Allocation.objects.filter(node=node, released_at__isnull=True).exists()

"""A time-sliced job's suspensions count as time it did not run, everywhere alike.

While a job is suspended, the job that took its turn holds its GPUs. Its suspended periods used
to count as run time twice over: in the scheduler's attained service (a time-sliced job looked
older to the LAS and Gittins orders than it was; the simulator counts only runs), and in the
usage report and its VC's monthly budget, which charged both jobs for the same GPUs. Every path
out of `suspended` ends the suspension, so a suspension never runs on after its attempt."""

from __future__ import annotations

import importlib
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.apps import apps
from django.utils import timezone

from agents.protocol import ExitReason
from portal.cluster import budgets
from portal.cluster.models import Node, VirtualCluster
from portal.jobs.accounting import job_usage, usage_report
from portal.jobs.models import Allocation, Job, JobAttempt, Suspension
from portal.jobs.services import enforce_time_limits, requeue_jobs_of_lost_node
from scheduler import core
from scheduler.store import earlier_service, load_snapshot
from scheduler.tasks import run_cycle
from tests.integration.scripted_agents import ScriptedAgents
from tests.portal.store_helpers import run, submit
from tests.portal.test_time_slicing_store import every_cycle_a_new_turn

pytestmark = pytest.mark.django_db(transaction=True)

GPUS = 8  # the jobs' flavor: a whole A100 node
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def state(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


@pytest.fixture
def turn_taken(api_for: Any, paused_loop: Any) -> tuple[Any, int, int]:
    """Two time-sliceable jobs of alice's on the one ready A100 node: `sliced` ran and is now
    suspended, `waiting` took its turn on its GPUs and runs."""
    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    Node.objects.filter(name="a100-node-1").update(state="ready")
    alice = api_for("alice")
    sliced = submit(alice, "sliced", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    run(sliced)
    waiting = submit(alice, "waiting", time_sliceable=True)
    result = run_cycle(every_cycle_a_new_turn())
    assert result is not None and result["suspended"] == 1
    run(waiting)
    assert state(sliced) == "suspended" and state(waiting) == "running"
    return alice, sliced, waiting


def attempt_of(job_id: int) -> JobAttempt:
    return Job.objects.get(pk=job_id).current_attempt()


def set_history(job_id: int, placed_at: datetime, *suspensions: tuple[datetime, datetime | None]) -> None:
    """The job's current attempt was placed (and started) at `placed_at` and suspended in
    `suspensions`; the last one may still be open (its end None), as the job's own is."""
    attempt = attempt_of(job_id)
    JobAttempt.objects.filter(pk=attempt.pk).update(created_at=placed_at, started_at=placed_at)
    Allocation.objects.filter(attempt=attempt).update(created_at=placed_at)
    Suspension.objects.filter(attempt=attempt).delete()
    for started_at, ended_at in suspensions:
        Suspension.objects.create(attempt=attempt, started_at=started_at, ended_at=ended_at)


def in_snapshot(job_id: int, now: float) -> core.PendingJob | core.RunningJob:
    snapshot = load_snapshot(now).snapshot
    return next(job for job in (*snapshot.pending, *snapshot.running) if job.id == str(job_id))


def test_a_suspension_is_open_while_the_job_is_suspended_and_ends_when_it_resumes(turn_taken) -> None:  # type: ignore[no-untyped-def]
    _, sliced, waiting = turn_taken
    [suspension] = Suspension.objects.filter(attempt=attempt_of(sliced))
    assert suspension.ended_at is None
    assert not Suspension.objects.filter(attempt__job_id=waiting).exists()

    result = run_cycle(every_cycle_a_new_turn())  # the next turn: sliced resumes, waiting waits
    assert result is not None and result["resumed"] == 1
    assert state(sliced) == "running" and state(waiting) == "suspended"
    suspension.refresh_from_db()
    assert suspension.ended_at is not None
    assert suspension.ended_at == pytest.approx(attempt_of(sliced).resumed_at, abs=timedelta(seconds=5))
    assert Suspension.objects.filter(attempt=attempt_of(waiting), ended_at__isnull=True).count() == 1


def test_attained_service_leaves_out_the_time_suspended(turn_taken) -> None:  # type: ignore[no-untyped-def]
    _, sliced, waiting = turn_taken
    now = timezone.now()
    # Placed 1000 s ago, suspended for the last 400 s: it ran 600 s.
    set_history(sliced, now - timedelta(seconds=1000), (now - timedelta(seconds=400), None))
    # The job that took its turn 400 s ago counts all of them.
    set_history(waiting, now - timedelta(seconds=400))
    suspended = in_snapshot(sliced, now.timestamp())
    assert isinstance(suspended, core.PendingJob) and suspended.suspended_on
    assert suspended.attained_gpu_s == pytest.approx(GPUS * 600.0, abs=GPUS * 1.0)
    assert in_snapshot(waiting, now.timestamp()).attained_gpu_s == pytest.approx(GPUS * 400.0, abs=GPUS * 1.0)

    run_cycle(every_cycle_a_new_turn())  # it resumes
    assert state(sliced) == "running"
    now = timezone.now()
    # Placed 1000 s ago, suspended from 700 s to 400 s ago: it ran 700 s.
    set_history(
        sliced,
        now - timedelta(seconds=1000),
        (now - timedelta(seconds=700), now - timedelta(seconds=400)),
    )
    running = in_snapshot(sliced, now.timestamp())
    assert isinstance(running, core.RunningJob)
    assert running.attained_gpu_s == pytest.approx(GPUS * 700.0, abs=GPUS * 1.0)


def test_the_usage_report_charges_the_gpus_of_a_turn_to_the_job_that_ran(turn_taken) -> None:  # type: ignore[no-untyped-def]
    """A report for [since, until) leaves out the suspended job's suspensions within the period,
    and only their part inside it; the job that took its turn is charged as before."""
    alice, sliced, waiting = turn_taken
    since = (timezone.now() - 4 * HOUR).replace(second=0, microsecond=0)
    until = since + 2 * HOUR
    # sliced: placed an hour before the period; suspended across its start (30 of those 60
    # minutes inside it) and again from 90 minutes in, until now (30 minutes inside it).
    set_history(sliced, since - HOUR, (since - 30 * MINUTE, since + 30 * MINUTE), (since + 90 * MINUTE, None))
    # waiting took that last turn: 90 minutes in, until now.
    set_history(waiting, since + 90 * MINUTE)

    query = f"since={since.isoformat()}&until={until.isoformat()}".replace("+", "%2B")
    rows = alice.get(f"/api/v1/usage/?group=job&{query}").json()["results"]
    hours = {row["job"]: row["allocated_gpu_hours"] for row in rows}
    assert hours == {sliced: pytest.approx(GPUS * 1.0), waiting: pytest.approx(GPUS * 0.5)}
    [vc] = alice.get(f"/api/v1/usage/?group=vc&{query}").json()["results"]
    assert vc["allocated_gpu_hours"] == pytest.approx(GPUS * 1.5)  # each GPU-hour once

    # The job's whole usage: it held its GPUs for 90 minutes before its current suspension.
    detail = alice.get(f"/api/v1/jobs/{sliced}/").json()
    assert detail["usage"]["allocated_gpu_hours"] == pytest.approx(GPUS * 1.5, abs=1e-3)


def test_a_budget_counts_the_hours_the_usage_report_counts(turn_taken) -> None:  # type: ignore[no-untyped-def]
    _, sliced, waiting = turn_taken
    month = budgets.month_start(timezone.now())
    now = month + 3 * HOUR
    # sliced: placed before the month, suspended across its start (30 minutes in it) and for
    # the last hour; waiting took that last turn.
    set_history(sliced, month - HOUR, (month - 30 * MINUTE, month + 30 * MINUTE), (month + 2 * HOUR, None))
    set_history(waiting, month + 2 * HOUR)
    vision = VirtualCluster.objects.get(name="vision")

    used = budgets.gpu_hours_this_month([vision], now)[vision.pk]
    assert used == pytest.approx(GPUS * 1.5 + GPUS * 1.0)
    [row] = usage_report(Job.objects.filter(virtual_cluster=vision), "vc", month, now, now)
    assert row["allocated_gpu_hours"] == pytest.approx(used)
    # A budget between the hours run and those with the suspensions counted is not spent.
    vision.gpu_hours_per_month = 25
    assert budgets.spent_message(vision, used, now) == ""


def cancel(alice: Any, job_id: int) -> None:
    assert alice.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 200


def node_lost(alice: Any, job_id: int) -> None:
    assert job_id in requeue_jobs_of_lost_node(Node.objects.get(name="a100-node-1"))


def ends_on_its_own(alice: Any, job_id: int) -> None:
    ScriptedAgents().end(Job.objects.get(pk=job_id), ExitReason.SUCCEEDED, 0)


def time_limit(alice: Any, job_id: int) -> None:
    """Its limit passed long ago and its agents never confirmed the stop: it is ended anyway."""
    job = Job.objects.get(pk=job_id)
    JobAttempt.objects.filter(pk=attempt_of(job_id).pk).update(
        started_at=timezone.now() - timedelta(seconds=job.time_limit_s + 3600)
    )
    assert enforce_time_limits(timezone.now(), 600, 300)["stopping"] == 1
    assert enforce_time_limits(timezone.now(), 600, 300)["forced"] == 1


@pytest.mark.parametrize(
    ("end", "ended"),
    [
        (cancel, "cancelled"),
        (node_lost, "pending"),
        (ends_on_its_own, "succeeded"),
        (time_limit, "timed-out"),
    ],
)
def test_an_attempt_ended_while_suspended_counts_only_its_run(turn_taken, end, ended) -> None:  # type: ignore[no-untyped-def]
    alice, sliced, _ = turn_taken
    attempt = attempt_of(sliced)
    end(alice, sliced)
    assert state(sliced) == ended
    attempt.refresh_from_db()
    assert attempt.ended_at is not None
    [suspension] = Suspension.objects.filter(attempt=attempt)
    assert suspension.ended_at == pytest.approx(attempt.ended_at, abs=timedelta(seconds=5))

    # Placed 1000 s before its end, suspended for the last 600 s of it: it ran 400 s.
    end_at = timezone.now() - HOUR
    JobAttempt.objects.filter(pk=attempt.pk).update(
        created_at=end_at - timedelta(seconds=1000),
        started_at=end_at - timedelta(seconds=1000),
        ended_at=end_at,
    )
    Allocation.objects.filter(attempt=attempt).update(
        created_at=end_at - timedelta(seconds=1000), released_at=end_at
    )
    Suspension.objects.filter(pk=suspension.pk).update(
        started_at=end_at - timedelta(seconds=600), ended_at=end_at
    )
    assert job_usage([sliced])[sliced].allocated_gpu_s == pytest.approx(GPUS * 400.0)
    # The service the scheduler keeps for it, for when it runs again.
    assert earlier_service([Job.objects.get(pk=sliced)]) == {sliced: pytest.approx(GPUS * 400.0)}
    if ended == "pending":
        requeued = in_snapshot(sliced, time.time())
        assert requeued.attained_gpu_s == pytest.approx(GPUS * 400.0)


def test_a_pause_ends_the_suspension_as_the_job_runs_again_to_write_its_checkpoint(
    api_for, paused_loop
) -> None:  # type: ignore[no-untyped-def]
    """Paused (or told to leave its parked GPUs) a suspended job is unfrozen to checkpoint: from
    then on it runs, and counts."""
    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    Node.objects.filter(name="a100-node-1").update(state="ready")
    alice = api_for("alice")
    sliced = submit(alice, "sliced", time_sliceable=True, checkpoint={"enabled": True})
    run_cycle(every_cycle_a_new_turn())
    run(sliced)
    submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(sliced) == "suspended"
    assert alice.post(f"/api/v1/jobs/{sliced}/hold/").status_code == 200
    assert state(sliced) == "checkpointing"
    [suspension] = Suspension.objects.filter(attempt__job_id=sliced)
    assert suspension.ended_at is not None


def test_the_migration_opens_the_suspension_of_a_job_suspended_before_it(turn_taken) -> None:  # type: ignore[no-untyped-def]
    """A job suspended when the release is installed had no suspension recorded: it gets one
    from its move to suspended, and a job that is not suspended gets none."""
    _, sliced, waiting = turn_taken
    suspended_at = Job.objects.get(pk=sliced).events.get(to_state="suspended").created_at
    Suspension.objects.all().delete()
    migration = importlib.import_module("portal.jobs.migrations.0018_attempt_suspensions")
    migration.open_current_suspensions(apps, None)
    [suspension] = Suspension.objects.all()
    assert (suspension.attempt_id, suspension.started_at, suspension.ended_at) == (
        attempt_of(sliced).pk,
        suspended_at,
        None,
    )
    assert state(waiting) == "running"

"""The finished jobs the store hands the core: what history-based policies (the Gittins
index, estimated ends) learn from. Only jobs that ran count, with the GPU-seconds of all
their attempts, oldest first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from portal.cluster.models import Node
from portal.jobs.choices import JobState
from portal.jobs.models import Job, JobAttempt
from portal.jobs.services import transition_job
from scheduler.store import finished_service, load_snapshot
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import submit
from tests.portal.test_time_slicing_store import every_cycle_a_new_turn

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def finish(job_id: int, run_s: float, finished_at: datetime) -> None:
    job = Job.objects.get(pk=job_id)
    assert transition_job(job, JobState.RUNNING, label="test")
    job.refresh_from_db()
    assert transition_job(job, JobState.SUCCEEDED, label="test")
    attempt = JobAttempt.objects.get(job_id=job_id)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=T0, ended_at=T0 + timedelta(seconds=run_s))
    Job.objects.filter(pk=job_id).update(finished_at=finished_at)


def test_finished_jobs_with_their_gpu_seconds_oldest_first(api_for: Any, paused_loop: Any) -> None:
    Node.objects.update(state="ready")
    alice = api_for("alice")
    later = submit(alice, "later")
    earlier = submit(alice, "earlier")
    run_cycle(every_cycle_a_new_turn())
    never_ran = submit(alice, "never-ran")
    assert alice.post(f"/api/v1/jobs/{never_ran}/cancel/").json()["state"] == "cancelled"
    gpus = Job.objects.get(pk=later).total_gpus
    finish(later, 600, T0 + timedelta(hours=2))
    finish(earlier, 100, T0 + timedelta(hours=1))

    finished = finished_service()
    assert finished.jobs == ((gpus, gpus * 100.0), (gpus, gpus * 600.0))
    assert finished.owners == (("vision", "alice"), ("vision", "alice"))
    assert load_snapshot(T0.timestamp()).snapshot.finished.jobs == finished.jobs


def test_the_last_jobs_of_each_width_so_a_rare_width_is_not_crowded_out(
    api_for: Any, paused_loop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    Node.objects.update(state="ready")
    alice = api_for("alice")
    wide = submit(alice, "wide")
    narrow = [submit(alice, f"narrow-{k}", flavor="s-A100") for k in range(2)]
    run_cycle(every_cycle_a_new_turn())
    wide_gpus, narrow_gpus = (Job.objects.get(pk=pk).total_gpus for pk in (wide, narrow[0]))
    assert wide_gpus != narrow_gpus
    finish(wide, 600, T0 + timedelta(hours=1))
    finish(narrow[0], 100, T0 + timedelta(hours=2))
    finish(narrow[1], 200, T0 + timedelta(hours=3))

    monkeypatch.setattr("scheduler.store.FINISHED_PER_WIDTH", 1)
    # One window of the last job would hold the newest narrow job alone.
    assert finished_service().jobs == ((wide_gpus, wide_gpus * 600.0), (narrow_gpus, narrow_gpus * 200.0))

    # Looking back only two jobs, the wide one is out of sight.
    monkeypatch.setattr("scheduler.store.FINISHED_LOOKBACK", 2)
    assert finished_service().jobs == ((narrow_gpus, narrow_gpus * 200.0),)

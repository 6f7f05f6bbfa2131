"""A requeued job keeps the service of its earlier attempts in the scheduler's snapshot.

Counted from its current attempt only, a preempted job came back to the queue as new: the LAS
and Gittins orders ranked it first and it preempted its preemptor back, over and over (on ITP
cluster06 replayed that way, 28,136 preemptions instead of 1,807)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.jobs.models import Allocation, Job, JobAttempt
from portal.jobs.services import requeue_jobs_holding
from scheduler.store import load_snapshot
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import placed_attempt

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_requeued_job_keeps_its_earlier_attempts_service(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    node, attempt = placed_attempt(api_for)
    job = attempt.job
    gpus = job.total_gpus
    requeue_jobs_holding(Allocation.objects.filter(node=node, released_at__isnull=True), "node lost")
    ended = timezone.now() - timedelta(seconds=100)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=ended - timedelta(seconds=300), ended_at=ended)
    assert Job.objects.get(pk=job.pk).state == "pending"

    [waiting] = [j for j in load_snapshot(time.time()).snapshot.pending if j.id == str(job.pk)]
    assert waiting.attained_gpu_s == pytest.approx(gpus * 300.0)

    assert run_cycle()["started"] == 1  # the second attempt
    second = Job.objects.get(pk=job.pk).current_attempt()
    assert second.number == 2
    JobAttempt.objects.filter(pk=second.pk).update(created_at=timezone.now() - timedelta(seconds=50))
    [running] = [j for j in load_snapshot(time.time()).snapshot.running if j.id == str(job.pk)]
    assert running.attained_gpu_s == pytest.approx(gpus * 350.0, abs=gpus * 5.0)

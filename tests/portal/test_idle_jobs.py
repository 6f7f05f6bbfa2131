from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.cluster.models import Gpu, VirtualCluster
from portal.jobs.models import Allocation, Job, JobAttempt, TelemetrySample
from portal.jobs.services import report_idle_jobs

pytestmark = pytest.mark.django_db
WINDOW = 1800


def running_job(api_for, small_job, name, utilization, priority="training") -> Job:  # type: ignore[no-untyped-def]
    spec = {**small_job, "name": name, "priority": priority}
    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", spec, format="json").json()["id"])
    now = timezone.now()
    started = now - timedelta(hours=2)
    attempt = JobAttempt.objects.create(job=job, number=1, started_at=started, state="running")
    Job.objects.filter(pk=job.pk).update(state="running", started_at=started)
    gpus = Gpu.objects.filter(allocations__isnull=True, model="A100").order_by("node__name", "index")[:2]
    for gpu in list(gpus):
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node)
        for minute in range(0, 40, 5):
            TelemetrySample.objects.create(
                attempt=attempt,
                gpu_uuid=gpu.uuid,
                time=now - timedelta(minutes=minute),
                utilization_pct=utilization,
            )
    job.refresh_from_db()
    return job


def test_idle_jobs_are_reported_once_and_busy_ones_never(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    idle = running_job(api_for, small_job, "idle", utilization=1.5)
    busy = running_job(api_for, small_job, "busy", utilization=80.0)
    assert report_idle_jobs(timezone.now(), 5, WINDOW) == [idle.pk]
    assert report_idle_jobs(timezone.now(), 5, WINDOW) == []
    event = idle.events.get(to_state="")
    assert event.reason.startswith("idle: every GPU under 5 % utilization for 30 min")
    assert Job.objects.get(pk=idle.pk).state == "running"  # the default policy only tells
    events = api_for("alice").get(f"/api/v1/jobs/{idle.pk}/events/").json()["results"]
    assert any(e["reason"].startswith("idle:") for e in events)
    assert not busy.events.filter(reason__startswith="idle").exists()


def test_the_vc_policy_can_stop_opportunistic_idle_jobs(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    VirtualCluster.objects.filter(name="vision").update(idle_policy="stop-opportunistic")
    opportunistic = running_job(api_for, small_job, "spare", utilization=0.0, priority="opportunistic")
    training = running_job(api_for, small_job, "real", utilization=0.0, priority="training")
    assert sorted(report_idle_jobs(timezone.now(), 5, WINDOW)) == sorted([opportunistic.pk, training.pk])
    opportunistic.refresh_from_db()
    assert opportunistic.state == "cancelled" and "idle policy" in opportunistic.end_reason
    assert not Allocation.objects.filter(attempt__job=opportunistic, released_at__isnull=True).exists()
    assert Job.objects.get(pk=training.pk).state == "running"

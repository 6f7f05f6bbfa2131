from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.jobs.models import Job, JobAttempt, TelemetrySample
from portal.jobs.services import downsample_telemetry

pytestmark = pytest.mark.django_db


def test_old_samples_become_averages_and_expired_ones_go(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1)
    now = timezone.now().replace(second=0, microsecond=0)

    def sample(at, util, energy):  # type: ignore[no-untyped-def]
        TelemetrySample.objects.create(
            attempt=attempt,
            gpu_uuid="GPU-x",
            time=at,
            utilization_pct=util,
            power_w=util * 2,
            energy_j=energy,
        )

    recent = now - timedelta(minutes=5)
    for second in range(0, 10):  # one 10 s bucket two hours ago
        sample(now - timedelta(hours=2) + timedelta(seconds=second), 10.0 * second, 100.0 + second)
    for second in range(0, 60, 5):  # one minute bucket two days ago
        sample(now - timedelta(days=2) + timedelta(seconds=second), 50.0, 1000.0 + second)
    sample(recent, 42.0, 5.0)
    sample(now - timedelta(days=40), 1.0, 1.0)

    counts = downsample_telemetry(timezone.now(), retention_days=30)
    assert counts["deleted"] == 1
    rows = list(
        TelemetrySample.objects.order_by("time").values("time", "utilization_pct", "energy_j", "resolution_s")
    )
    assert [(r["resolution_s"], r["utilization_pct"], r["energy_j"]) for r in rows] == [
        (60, 50.0, 1055.0),
        (10, 45.0, 109.0),  # mean of 0..90, the counter's maximum
        (0, 42.0, 5.0),  # recent samples stay as sent
    ]
    assert rows[1]["time"] == now - timedelta(hours=2)
    # Running it again changes nothing.
    downsample_telemetry(timezone.now(), retention_days=30)
    assert TelemetrySample.objects.count() == 3

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.cluster.models import Gpu
from portal.jobs.models import Allocation, Job, JobAttempt, TelemetrySample

pytestmark = pytest.mark.django_db


@pytest.fixture
def measured_job(api_for, small_job) -> Job:  # type: ignore[no-untyped-def]
    """Two GPUs held for 30 minutes, sampled three times a minute apart at 50 % and 200 W; one GPU
    has an energy counter (30 kJ over the samples), the other not."""
    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1)
    start = timezone.now() - timedelta(hours=1)
    gpus = list(Gpu.objects.filter(node__name="a100-node-1").order_by("index")[:2])
    for gpu in gpus:
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node)
    Allocation.objects.filter(attempt=attempt).update(
        created_at=start, released_at=start + timedelta(minutes=30)
    )
    for i in range(3):
        for gpu, energy in ((gpus[0], 15_000.0 * i), (gpus[1], None)):
            TelemetrySample.objects.create(
                attempt=attempt,
                gpu_uuid=gpu.uuid,
                time=start + timedelta(minutes=i),
                utilization_pct=50.0,
                power_w=200.0,
                energy_j=energy,
            )
    return job


def test_a_job_reports_allocated_and_used_gpu_hours_and_energy(api_for, measured_job) -> None:  # type: ignore[no-untyped-def]
    usage = api_for("bob").get(f"/api/v1/jobs/{measured_job.pk}/").json()["usage"]
    assert usage["allocated_gpu_hours"] == pytest.approx(1.0)  # 2 GPUs x 30 min
    assert usage["used_gpu_hours"] == pytest.approx(2 * 0.5 * 120 / 3600, abs=1e-4)
    assert usage["energy_kwh"] == pytest.approx((30_000 + 200 * 120) / 3.6e6, abs=1e-4)


def test_the_usage_report_sums_per_vc_and_exports_csv_within_the_tenant(api_for, measured_job) -> None:  # type: ignore[no-untyped-def]
    report = api_for("alice").get("/api/v1/usage/?group=vc").json()
    assert report["results"] == [
        {
            "key": "vision",
            "vc": "vision",
            "jobs": 1,
            "allocated_gpu_hours": 1.0,
            "used_gpu_hours": pytest.approx(0.0333, abs=1e-4),
            "energy_kwh": pytest.approx(0.015, abs=1e-4),
        }
    ]
    assert api_for("carol").get("/api/v1/usage/?group=vc").json()["results"] == []
    csv = api_for("alice").get("/api/v1/usage/?group=user&format=csv")
    assert csv["Content-Type"].startswith("text/csv")
    lines = csv.content.decode().splitlines()
    assert lines[0] == "user,jobs,allocated_gpu_hours,used_gpu_hours,energy_kwh"
    assert lines[1].startswith("alice,1,1.0,")
    assert api_for("alice").get("/api/v1/usage/?since=2020-01-01&until=2020-02-01").json()["results"] == []
    assert api_for("alice").get("/api/v1/usage/?group=planet").status_code == 400
    refused_csv = api_for("alice").get("/api/v1/usage/?group=planet&format=csv")
    assert refused_csv.status_code == 400  # in JSON, so the message is not lost
    assert refused_csv.json() == {"group": ["One of: job, tenant, user, vc."]}
    assert api_for("alice").get("/api/v1/usage/?since=yesterday").status_code == 400


def test_admins_see_a_jobs_usage_in_django_admin(cluster_admin_client, measured_job) -> None:  # type: ignore[no-untyped-def]
    page = cluster_admin_client.get(f"/admin/jobs/job/{measured_job.pk}/change/").content.decode()
    assert "1.0 / 0.0333 / 0.015" in page

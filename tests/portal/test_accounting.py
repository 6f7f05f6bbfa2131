from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounts.choices import Role
from portal.accounts.models import Membership, Tenant
from portal.cluster.models import Gpu
from portal.jobs.models import Allocation, Job, JobAttempt, TelemetrySample
from tests.conftest import SMALL_JOB

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


def test_a_period_that_ends_before_it_starts_is_refused_by_name(api_for) -> None:  # type: ignore[no-untyped-def]
    """It answered 200 with no rows, which reads as "no usage" (`gpuportal usage` printed "No
    GPU usage from 2026-12-01 to 2026-11-01" and exited 0)."""
    answer = api_for("alice").get("/api/v1/usage/?since=2026-12-01&until=2026-11-01")
    assert answer.status_code == 400
    assert answer.json() == {
        "until": [
            "The period ends before it starts: until (2026-11-01 00:00:00 UTC) must be after since"
            " (2026-12-01 00:00:00 UTC)."
        ]
    }
    assert api_for("alice").get("/api/v1/usage/?since=2026-11-01&until=2026-11-01").status_code == 400
    # Without since, the period is the 30 days before until, however far back until is.
    earlier = api_for("alice").get("/api/v1/usage/?until=2000-01-31")
    assert earlier.status_code == 200, earlier.json()
    assert (earlier.json()["since"], earlier.json()["until"]) == (
        "2000-01-01T00:00:00Z",
        "2000-01-31T00:00:00Z",
    )


@pytest.mark.parametrize("impossible", ["2026-11-31", "2026-13-01", "2026-11-01T24:30:00"])
def test_an_impossible_date_is_refused_by_name_not_a_server_error(api_for, impossible) -> None:  # type: ignore[no-untyped-def]
    answer = api_for("alice").get(f"/api/v1/usage/?since={impossible}")
    assert answer.status_code == 400
    assert answer.json() == {"since": ["Give an ISO 8601 date or time."]}


def test_csv_cells_that_a_spreadsheet_would_run_as_formulas_are_text(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """Django allows '-', '+' and '@' in user names: `-1+1` in the user column would be a formula."""
    sly = User.objects.create_user("-1+1", password="x")
    Membership.objects.create(user=sly, tenant=Tenant.objects.get(name="vision"), role=Role.MEMBER)
    client = APIClient()
    client.force_authenticate(sly)
    job = Job.objects.get(pk=client.post("/api/v1/jobs/", small_job, format="json").json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1)
    gpu = Gpu.objects.filter(node__name="a100-node-1").order_by("index").first()
    Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node)
    start = timezone.now() - timedelta(hours=2)
    Allocation.objects.filter(attempt=attempt).update(
        created_at=start, released_at=start + timedelta(hours=1)
    )
    lines = api_for("alice").get("/api/v1/usage/?group=user&format=csv").content.decode().splitlines()
    assert lines[1:] == ["'-1+1,1,1.0,0.0,0.0"]  # the quote makes it text; numbers stay numbers


def test_admins_see_a_jobs_usage_in_django_admin(cluster_admin_client, measured_job) -> None:  # type: ignore[no-untyped-def]
    page = cluster_admin_client.get(f"/admin/jobs/job/{measured_job.pk}/change/").content.decode()
    assert "1.0 / 0.0333 / 0.015" in page


# -- a period's report counts only what happened in the period ---------------------------------

# The period [SINCE, UNTIL) of the tests below: two hours that ended two hours ago.
SINCE = (timezone.now() - timedelta(hours=4)).replace(second=0, microsecond=0)
UNTIL = SINCE + timedelta(hours=2)
MINUTE = timedelta(minutes=1)
HOURS = timedelta(hours=1)
FIGURES = ("jobs", "allocated_gpu_hours", "used_gpu_hours", "energy_kwh")


def held(
    api_for,  # type: ignore[no-untyped-def]
    user: str,
    vc: str,
    node: str,
    gpu_index: int,
    start: datetime,
    end: datetime | None,
    samples: Sequence[tuple[datetime, float, float, float | None]] = (),
) -> Job:
    """A job of `user` whose one attempt was placed at `start` on one GPU and held it until
    `end` (None: still holds it), with telemetry samples (time, utilization %, W, counter J)."""
    job_id = api_for(user).post("/api/v1/jobs/", {**SMALL_JOB, "vc": vc}, format="json").json()["id"]
    attempt = JobAttempt.objects.create(job_id=job_id, number=1, started_at=start, ended_at=end)
    JobAttempt.objects.filter(pk=attempt.pk).update(created_at=start)
    gpu = Gpu.objects.select_related("node").get(node__name=node, index=gpu_index)
    held_gpu(attempt, gpu, start, end, samples)
    return Job.objects.get(pk=job_id)


def held_gpu(
    attempt: JobAttempt,
    gpu: Gpu,
    start: datetime,
    end: datetime | None,
    samples: Sequence[tuple[datetime, float, float, float | None]] = (),
) -> None:
    """The attempt's allocation of `gpu`, placed at `start` and held until `end`, with its
    telemetry samples (time, utilization %, W, counter J)."""
    allocation = Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node, released_at=end)
    Allocation.objects.filter(pk=allocation.pk).update(created_at=start)
    for time, utilization, power, energy in samples:
        TelemetrySample.objects.create(
            attempt=attempt,
            gpu_uuid=gpu.uuid,
            time=time,
            utilization_pct=utilization,
            power_w=power,
            energy_j=energy,
        )


def report(api_for, user: str, since: datetime, until: datetime, group: str = "job", **extra: str):  # type: ignore[no-untyped-def]
    response = api_for(user).get(
        "/api/v1/usage/", {"since": since.isoformat(), "until": until.isoformat(), "group": group, **extra}
    )
    assert response.status_code == 200, response.content
    return response


def figures(row: dict) -> tuple[int, float, float, float]:  # type: ignore[type-arg]
    return row["jobs"], row["allocated_gpu_hours"], row["used_gpu_hours"], row["energy_kwh"]


@pytest.fixture
def across_the_start(api_for) -> Job:  # type: ignore[no-untyped-def]
    """Alice held a GPU from an hour before SINCE to 30 min after it, sampled every 10 min at
    SINCE-55 min, ..., SINCE-5 min, SINCE+5 min, ..., SINCE+25 min at 50 % and 100 W, with a
    counter that rises 60 kJ between samples."""
    samples = [(SINCE - 55 * MINUTE + 10 * i * MINUTE, 50.0, 100.0, 60_000.0 * i) for i in range(9)]
    return held(
        api_for, "alice", "vision", "a100-node-1", 0, SINCE - 60 * MINUTE, SINCE + 30 * MINUTE, samples
    )


def test_a_job_across_the_periods_start_counts_only_its_part_inside(api_for, across_the_start) -> None:  # type: ignore[no-untyped-def]
    before = held(api_for, "alice", "vision", "a100-node-1", 1, SINCE - 3 * HOURS, SINCE - 90 * MINUTE)
    rows = report(api_for, "alice", SINCE, UNTIL).json()["results"]
    assert [row["key"] for row in rows] == [str(across_the_start.pk)]  # not `before`
    # 30 min held inside; the sample interval across SINCE counts its 5 min inside (and the
    # counter's rise over it pro rata), then two whole intervals: 25 min at 50 %, 150 kJ.
    assert figures(rows[0]) == (
        1,
        0.5,
        pytest.approx(25 / 2 / 60, abs=1e-4),
        pytest.approx(150_000 / 3.6e6, abs=1e-4),
    )

    # The period before gets the rest: consecutive periods add up to the job's whole life.
    earlier = report(api_for, "alice", SINCE - 2 * HOURS, SINCE).json()["results"]
    assert {row["key"] for row in earlier} == {str(across_the_start.pk), str(before.pk)}
    whole = api_for("alice").get(f"/api/v1/jobs/{across_the_start.pk}/").json()["usage"]
    assert whole == {
        "allocated_gpu_hours": 1.5,
        "used_gpu_hours": pytest.approx(80 / 2 / 60, abs=1e-4),  # 8 intervals of 10 min at 50 %
        "energy_kwh": pytest.approx(480_000 / 3.6e6, abs=1e-4),
    }
    part_before = next(row for row in earlier if row["key"] == str(across_the_start.pk))
    for name in whole:
        assert part_before[name] + rows[0][name] == pytest.approx(whole[name], abs=2e-4)


def test_a_job_still_running_counts_up_to_until(api_for) -> None:  # type: ignore[no-untyped-def]
    """Placed an hour before the period and never released: listed although its attempt began
    before the period, and charged for the whole period, not up to now."""
    held(api_for, "alice", "vision", "a100-node-1", 2, SINCE - 60 * MINUTE, None)
    rows = report(api_for, "alice", SINCE, UNTIL, group="vc").json()["results"]
    assert [figures(row) for row in rows] == [(1, 2.0, 0.0, 0.0)]


def test_telemetry_outside_the_period_is_not_counted(api_for) -> None:  # type: ignore[no-untyped-def]
    """Placed an hour into the period and held an hour past its end, sampled every 10 min: at
    50 % and 200 W up to UNTIL, at 100 % and 400 W after it; no energy counter."""
    start = SINCE + 60 * MINUTE
    samples = [
        (start + 10 * i * MINUTE, *((50.0, 200.0) if i <= 6 else (100.0, 400.0)), None) for i in range(13)
    ]
    held(api_for, "alice", "vision", "a100-node-1", 3, start, UNTIL + 60 * MINUTE, samples)
    rows = report(api_for, "alice", SINCE, UNTIL).json()["results"]
    # The hour inside: six intervals of 10 min at 50 % and 200 W.
    assert [figures(row) for row in rows] == [(1, 1.0, 0.5, pytest.approx(0.2, abs=1e-4))]


def test_the_csv_has_the_json_rows_and_the_queries_do_not_grow_with_jobs(  # type: ignore[no-untyped-def]
    api_for, across_the_start
) -> None:
    running = held(api_for, "bob", "vision", "a100-node-1", 2, SINCE - 60 * MINUTE, None)
    late = held(api_for, "alice", "vision", "a100-node-1", 3, SINCE + 60 * MINUTE, UNTIL + 60 * MINUTE)
    for group, names in (("job", {across_the_start.pk, running.pk, late.pk}), ("user", {"alice", "bob"})):
        rows = report(api_for, "alice", SINCE, UNTIL, group=group).json()["results"]
        assert {row[group] for row in rows} == names
        csv = report(api_for, "alice", SINCE, UNTIL, group=group, format="csv").content.decode()
        expected = [",".join(str(row[name]) for name in (group, *FIGURES)) for row in rows]
        assert csv.splitlines() == [",".join((group, *FIGURES)), *expected]

    with CaptureQueriesContext(connection) as three_jobs:
        report(api_for, "alice", SINCE, UNTIL)
    with CaptureQueriesContext(connection) as one_job:
        rows = report(api_for, "alice", SINCE + 35 * MINUTE, SINCE + 50 * MINUTE).json()["results"]
    assert [row["key"] for row in rows] == [str(running.pk)]
    assert len(three_jobs) == len(one_job)


def test_another_tenants_jobs_never_appear_in_a_period(api_for, across_the_start) -> None:  # type: ignore[no-untyped-def]
    """Carol (tenant speech) held a GPU across the period's start too: her report has it, alice's
    never, in any grouping."""
    carols = held(api_for, "carol", "speech", "a100-node-2", 0, SINCE - 60 * MINUTE, SINCE + 90 * MINUTE)
    alices_key = {"job": str(across_the_start.pk), "tenant": "vision", "vc": "vision", "user": "alice"}
    for group, key in alices_key.items():
        rows = report(api_for, "alice", SINCE, UNTIL, group=group).json()["results"]
        assert [(row["key"], *figures(row)[:2]) for row in rows] == [(key, 1, 0.5)], group
    rows = report(api_for, "carol", SINCE, UNTIL).json()["results"]
    assert [(row["key"], *figures(row)[:2]) for row in rows] == [(str(carols.pk), 1, 1.5)]

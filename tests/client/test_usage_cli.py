"""`gpuportal usage` against a real portal: the rows and figures of the usage report as a table
and as the portal's CSV file, the tenant's jobs only, and the API's message for bad input."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from gpuportal import cli
from portal.accounts.services import create_api_token
from portal.cluster.models import Gpu
from portal.jobs.models import Job, JobAttempt
from tests.portal.test_accounting import held_gpu

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def job_with_usage(
    user: Any,
    vc: str,
    node: str,
    gpu_indices: list[int],
    minutes: int,
    utilization_pct: float,
    power_w: float,
) -> Job:
    """A job submitted over the API that held the GPUs for `minutes` an hour ago and ended, with
    two samples per GPU at its start and end: so each GPU counts `minutes` of allocated time,
    the same time weighted by `utilization_pct`, and `power_w` over it as energy.

    In one transaction: committed on its own, the submission asked the live stack's worker for a
    cycle, which could place the job on a real agent before it was marked ended here, and that
    attempt's own telemetry then counted too (2.51 used GPU-hours instead of 2.50, once)."""
    with transaction.atomic():
        client = APIClient()
        client.force_authenticate(user)
        response = client.post(
            "/api/v1/jobs/",
            {"name": "measured", "vc": vc, "flavor": "s-A100", "command": "true"},
            format="json",
        )
        assert response.status_code == 201, response.content
        job = Job.objects.get(pk=response.json()["id"])
        start = timezone.now() - timedelta(hours=1)
        end = start + timedelta(minutes=minutes)
        attempt = JobAttempt.objects.create(
            job=job, number=1, state="succeeded", started_at=start, ended_at=end
        )
        gpus = Gpu.objects.filter(node__name=node, index__in=gpu_indices).select_related("node")
        for gpu in gpus:
            samples = [(moment, utilization_pct, power_w, None) for moment in (start, end)]
            held_gpu(attempt, gpu, start, end, samples)
        Job.objects.filter(pk=job.pk).update(state="succeeded", started_at=start, finished_at=end)
    return job


@pytest.fixture
def usage(users: dict[str, Any]) -> dict[str, Job]:
    """In VC vision: alice 2 GPUs for 30 min at 100 % and 400 W (1 GPU-hour, 1 used, 0.4 kWh),
    bob 4 GPUs for 45 min at 50 % and 300 W (3 GPU-hours, 1.5 used, 0.9 kWh). In VC speech,
    another tenant's, carol 2 GPUs for 60 min."""
    return {
        "alice": job_with_usage(users["alice"], "vision", "a100-node-1", [0, 1], 30, 100.0, 400.0),
        "bob": job_with_usage(users["bob"], "vision", "a100-node-1", [2, 3, 4, 5], 45, 50.0, 300.0),
        "carol": job_with_usage(users["carol"], "speech", "a100-node-2", [0, 1], 60, 100.0, 400.0),
    }


@pytest.fixture
def alice_token(users: dict[str, Any]) -> str:
    return create_api_token(users["alice"], "usage test")[1]


def table_rows(stdout: str) -> list[list[str]]:
    """The table's lines split into cells, without the header line."""
    lines = stdout.splitlines()
    return [line.split() for line in lines[1:]]


def test_usage_prints_a_row_per_vc_and_per_user_of_the_tenant(run_cli, alice_token, usage) -> None:  # type: ignore[no-untyped-def]
    per_vc = run_cli(alice_token, "usage")
    assert per_vc.returncode == 0, per_vc.stderr
    assert per_vc.stdout.splitlines()[0].split() == [
        "VC",
        "JOBS",
        "GPU-HOURS",
        "USED",
        "GPU-HOURS",
        "ENERGY",
        "KWH",
    ]
    assert table_rows(per_vc.stdout) == [["vision", "2", "4.00", "2.50", "1.30"]]

    per_user = run_cli(alice_token, "usage", "--group", "user")
    assert per_user.returncode == 0, per_user.stderr
    assert per_user.stdout.splitlines()[0].split()[0] == "USER"
    assert table_rows(per_user.stdout) == [
        ["bob", "1", "3.00", "1.50", "0.90"],  # largest first
        ["alice", "1", "1.00", "1.00", "0.40"],
    ]

    per_job = run_cli(alice_token, "usage", "--group", "job", "-o", "json")
    assert per_job.returncode == 0, per_job.stderr
    rows = json.loads(per_job.stdout)["results"]
    assert [row["key"] for row in rows] == [str(usage["bob"].pk), str(usage["alice"].pk)]
    assert rows[0]["allocated_gpu_hours"] == pytest.approx(3.0)
    # As a table a job's row has no JOBS column, which would say 1 on every line.
    per_job = run_cli(alice_token, "usage", "--group", "job")
    assert per_job.stdout.splitlines()[0].split()[:2] == ["JOB", "GPU-HOURS"]
    assert table_rows(per_job.stdout) == [
        [str(usage["bob"].pk), "3.00", "1.50", "0.90"],
        [str(usage["alice"].pk), "1.00", "1.00", "0.40"],
    ]

    before = run_cli(alice_token, "usage", "--since", "2020-01-01", "--until", "2020-02-01")
    assert before.returncode == 0 and before.stdout == ""
    assert "No GPU usage" in before.stderr


def test_usage_csv_is_the_portals_file(run_cli, alice_token, usage) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(alice_token, "usage", "--group", "user", "--csv")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "user,jobs,allocated_gpu_hours,used_gpu_hours,energy_kwh",
        "bob,1,3.0,1.5,0.9",
        "alice,1,1.0,1.0,0.4",
    ]


def test_bad_input_prints_the_portals_message_and_exits_2(run_cli, alice_token) -> None:  # type: ignore[no-untyped-def]
    for extra in ((), ("--csv",)):
        bogus = run_cli(alice_token, "usage", "--group", "bogus", *extra)
        assert bogus.returncode == cli.USAGE, bogus.stderr
        assert "error: the portal refused the usage query" in bogus.stderr
        assert "group: One of: job, tenant, user, vc." in bogus.stderr
        assert bogus.stdout == ""

    bad_date = run_cli(alice_token, "usage", "--since", "yesterday")
    assert bad_date.returncode == cli.USAGE, bad_date.stderr
    assert "since: Give an ISO 8601 date or time." in bad_date.stderr
    assert "Traceback" not in bogus.stderr + bad_date.stderr

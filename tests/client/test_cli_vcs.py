"""`gpuportal vcs` against a real portal: the virtual clusters of the caller's tenants with the
demo seed's quotas (vision lends at most 4 of its V100) and the GPUs their jobs hold, an admin's
stop, a monthly GPU-hour budget used and spent, another tenant's VC answering like one that does
not exist, and the API's objects as JSON."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from gpuportal import cli
from portal.accounts.services import create_api_token
from portal.cluster.models import Gpu, Quota, VirtualCluster
from portal.jobs.models import Allocation, Job, JobAttempt

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

HEADER = ["VC", "TENANT", "MODEL", "IN USE", "GUARANTEED", "BORROW LIMIT", "LENDS", "BUDGET", "STATE"]
RIGHT_ALIGNED = ("IN USE", "GUARANTEED", "BORROW LIMIT", "LENDS")  # LENDS: a number or "all"


def api_client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@transaction.atomic  # as job_with_usage in test_usage_cli: no cycle of the live stack sees it pending
def running_job(user: Any, vc: str, node: str, gpu_indices: list[int]) -> Job:
    """A job submitted over the API that holds these GPUs now, as a placement would leave it: a
    running attempt whose allocations are not released."""
    response = api_client(user).post(
        "/api/v1/jobs/", {"name": "holding", "vc": vc, "flavor": "s-A100", "command": "true"}, format="json"
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1, state="running", started_at=timezone.now())
    for gpu in Gpu.objects.filter(node__name=node, index__in=gpu_indices).select_related("node"):
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node)
    Job.objects.filter(pk=job.pk).update(state="running", started_at=attempt.started_at)
    return job


@transaction.atomic
def job_that_held_gpus(
    user: Any, vc: str, node: str, gpu_indices: list[int], start: datetime, end: datetime
) -> Job:
    """A job submitted over the API that held these GPUs from `start` to `end` and succeeded: so
    each GPU counts (end - start) of allocated time, as the usage report and the budget count it."""
    response = api_client(user).post(
        "/api/v1/jobs/", {"name": "held", "vc": vc, "flavor": "s-A100", "command": "true"}, format="json"
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1, state="succeeded", started_at=start, ended_at=end)
    for gpu in Gpu.objects.filter(node__name=node, index__in=gpu_indices).select_related("node"):
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node, released_at=end)
    Allocation.objects.filter(attempt=attempt).update(created_at=start)  # auto_now_add set it to now
    Job.objects.filter(pk=job.pk).update(state="succeeded", started_at=start, finished_at=end)
    return job


def two_gpu_hours_this_month(user: Any, vc: str) -> datetime:
    """8 GPUs held for the 15 minutes up to now (2 GPU-hours this month), and 8 for an hour of the
    previous month, which a monthly budget does not count. Returns now."""
    now = datetime.now(UTC)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if now - timedelta(minutes=16) < month_start:
        pytest.skip("the first minutes of a month (UTC) have no room for 15 minutes of this month's usage")
    all_gpus = list(range(8))
    job_that_held_gpus(
        user, vc, "a100-node-1", all_gpus, now - timedelta(minutes=15, seconds=5), now - timedelta(seconds=5)
    )
    last_month = month_start - timedelta(hours=2)
    job_that_held_gpus(user, vc, "a100-node-2", all_gpus, last_month, last_month + timedelta(hours=1))
    return now


def first_of_next_month(now: datetime) -> str:
    return f"{now.year + 1}-01-01" if now.month == 12 else f"{now.year}-{now.month + 1:02d}-01"


@pytest.fixture
def tokens(users: dict[str, Any]) -> dict[str, str]:
    return {name: create_api_token(users[name], "vcs test")[1] for name in ("alice", "carol")}


def split_cells(line: str) -> list[str]:
    """Cells are apart by two spaces or more; one space stays inside a cell ("IN USE")."""
    return re.split(r" {2,}", line.strip())


def table(stdout: str) -> tuple[str, list[list[str]]]:
    """The header line as printed, and the rows split into cells."""
    header, *lines = stdout.splitlines()
    return header, [split_cells(line) for line in lines]


def assert_numbers_right_aligned(stdout: str) -> None:
    """Each number (or LENDS's "all") ends where its column's header ends."""
    header, *lines = stdout.splitlines()
    for column in RIGHT_ALIGNED:
        end = header.index(column) + len(column)
        for line in lines:
            assert line[end - 1].isalnum() and line[end : end + 1] in ("", " "), (column, line)


def test_vcs_lists_the_tenants_quotas_and_the_gpus_in_use(run_cli, tokens, users) -> None:  # type: ignore[no-untyped-def]
    before = run_cli(tokens["alice"], "vcs")
    assert before.returncode == 0, before.stderr
    header, rows = table(before.stdout)
    assert split_cells(header) == HEADER
    assert rows == [
        ["vision", "vision", "A100", "0", "8", "8", "all", "-", "open"],
        ["vision", "vision", "V100", "0", "8", "4", "4", "-", "open"],
    ]
    assert "speech" not in before.stdout  # another tenant's
    assert before.stderr == ""
    assert_numbers_right_aligned(before.stdout)

    running_job(users["alice"], "vision", "a100-node-1", [0, 1])
    running_job(users["carol"], "speech", "a100-node-2", [0, 1, 2])
    after = run_cli(tokens["alice"], "vcs")
    assert after.returncode == 0, after.stderr
    assert table(after.stdout)[1] == [
        ["vision", "vision", "A100", "2", "8", "8", "all", "-", "open"],
        ["vision", "vision", "V100", "0", "8", "4", "4", "-", "open"],
    ]

    carol = run_cli(tokens["carol"], "vcs")
    assert carol.returncode == 0, carol.stderr
    assert table(carol.stdout)[1] == [
        ["speech", "speech", "A100", "3", "8", "8", "all", "-", "open"],
        ["speech", "speech", "V100", "0", "8", "4", "all", "-", "open"],
    ]


def test_vcs_name_shows_one_vc_and_another_tenants_is_not_found(run_cli, tokens, users) -> None:  # type: ignore[no-untyped-def]
    shown = run_cli(tokens["alice"], "vcs", "vision")
    assert shown.returncode == 0, shown.stderr
    details, quotas = shown.stdout.split("\n\n")
    assert [split_cells(line) for line in details.splitlines()] == [
        ["VC", "vision"],
        ["Tenant", "vision"],
        ["Description", "-"],
        ["Queue order", "First in, first out"],
        ["Per-user limits", "none"],
        ["Monthly budget", "none"],
        ["State", "open"],
    ]
    header, rows = table(quotas)
    assert split_cells(header) == ["MODEL", "IN USE", "GUARANTEED", "BORROW LIMIT", "LENDS"]
    assert rows == [["A100", "0", "8", "8", "all"], ["V100", "0", "8", "4", "4"]]

    VirtualCluster.objects.filter(name="vision").update(
        description="Computer vision [team]",
        max_gpus_per_user=4,
        max_cpus_per_user=256,
        max_memory_gb_per_user=4096,
        max_pending_jobs_per_user=1,
    )
    Quota.objects.filter(virtual_cluster__name="vision", gpu_model="A100").update(lending_limit=0)
    running_job(users["alice"], "vision", "a100-node-1", [0])
    changed = run_cli(tokens["alice"], "vcs", "vision")
    assert changed.returncode == 0, changed.stderr
    details, quotas = changed.stdout.split("\n\n")
    lines = {cells[0]: cells[1] for cells in map(split_cells, details.splitlines())}
    assert lines["Description"] == "Computer vision [team]"  # user text, not markup
    assert (
        lines["Per-user limits"] == "4 GPUs in use, 256 CPUs in use, 4096 GB of memory in use, 1 pending job"
    )
    assert table(quotas)[1][0] == ["A100", "1", "8", "8", "0"]  # lends none, not "all"

    others = run_cli(tokens["alice"], "vcs", "speech")
    missing = run_cli(tokens["alice"], "vcs", "no-such-vc")
    assert others.returncode == missing.returncode == cli.NOT_FOUND
    assert others.stderr == "error: virtual cluster speech not found\n"
    assert missing.stderr == "error: virtual cluster no-such-vc not found\n"
    assert others.stdout == missing.stdout == ""


def test_a_stopped_vc_says_held(run_cli, tokens) -> None:  # type: ignore[no-untyped-def]
    VirtualCluster.objects.filter(name="vision").update(stop_policy="hold")
    held = run_cli(tokens["alice"], "vcs")
    assert held.returncode == 0, held.stderr
    assert [row[-1] for row in table(held.stdout)[1]] == ["held", "held"]
    assert held.stderr == "Stopped by an admin, no job starts in: vision (held).\n"
    shown = run_cli(tokens["alice"], "vcs", "vision")
    assert ["State", "held by an admin: none of its jobs starts; running ones go on"] in map(
        split_cells, shown.stdout.splitlines()
    )

    VirtualCluster.objects.filter(name="vision").update(stop_policy="hold-and-drain")
    drained = run_cli(tokens["alice"], "vcs")
    assert [row[-1] for row in table(drained.stdout)[1]] == ["held, drained", "held, drained"]
    assert "vision (held, drained)" in drained.stderr
    shown = run_cli(tokens["alice"], "vcs", "vision")
    assert "held and drained by an admin" in shown.stdout


def test_a_monthly_budget_shows_the_gpu_hours_used_this_month_and_when_it_is_spent(  # type: ignore[no-untyped-def]
    run_cli, tokens, users
) -> None:
    now = two_gpu_hours_this_month(users["alice"], "vision")
    month = f"{now:%B}"
    VirtualCluster.objects.filter(name="vision").update(gpu_hours_per_month=1000)
    used = run_cli(tokens["alice"], "vcs")
    assert used.returncode == 0, used.stderr
    assert split_cells(used.stdout.splitlines()[0]) == HEADER
    assert [row[-2] for row in table(used.stdout)[1]] == ["2.0 / 1,000 GPU-h", "2.0 / 1,000 GPU-h"]
    assert used.stderr == ""  # nothing is held back
    assert_numbers_right_aligned(used.stdout)
    shown = run_cli(tokens["alice"], "vcs", "vision")
    assert shown.returncode == 0, shown.stderr
    assert ["Monthly budget", f"2.0 of 1,000 GPU-hours used in {month} (UTC)"] in map(
        split_cells, shown.stdout.splitlines()
    )

    VirtualCluster.objects.filter(name="vision").update(gpu_hours_per_month=2)
    spent = run_cli(tokens["alice"], "vcs")
    assert spent.returncode == 0, spent.stderr
    assert [row[-2:] for row in table(spent.stdout)[1]] == [["2.0 / 2 GPU-h, spent", "open"]] * 2
    until = first_of_next_month(now)
    assert spent.stderr == f"Monthly GPU-hour budget spent, no job starts until {until} in: vision.\n"
    shown = run_cli(tokens["alice"], "vcs", "vision")
    assert [
        "Monthly budget",
        f"2.0 of 2 GPU-hours used in {month} (UTC): spent, none of its jobs starts until {until}"
        " or until an admin raises it; running ones go on",
    ] in map(split_cells, shown.stdout.splitlines())
    as_json = json.loads(run_cli(tokens["alice"], "vcs", "vision", "-o", "json").stdout)
    assert (as_json["gpu_hours_per_month"], as_json["gpu_hours_this_month"], as_json["budget_spent"]) == (
        2,
        2.0,
        True,
    )

    carol = run_cli(tokens["carol"], "vcs")  # another tenant's VC without a budget
    assert [row[-2] for row in table(carol.stdout)[1]] == ["-", "-"]
    assert carol.stderr == ""


def assert_same_vcs(printed: list[dict[str, Any]], from_api: list[dict[str, Any]]) -> None:
    """The same VC objects, but for gpu_hours_this_month: it grows while a job holds GPUs, so two
    requests a moment apart may differ by its rounding step (0.01)."""

    def apart(vc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        rest = dict(vc)
        return rest, rest.pop("gpu_hours_this_month")

    assert [apart(vc)[0] for vc in printed] == [apart(vc)[0] for vc in from_api]
    for mine, theirs in zip(printed, from_api, strict=True):
        assert apart(mine)[1] == pytest.approx(apart(theirs)[1], abs=0.011)


def test_vcs_json_prints_the_apis_objects(run_cli, tokens, users) -> None:  # type: ignore[no-untyped-def]
    VirtualCluster.objects.filter(name="vision").update(stop_policy="hold", max_gpus_per_user=4)
    running_job(users["alice"], "vision", "a100-node-1", [0, 1])
    api = api_client(users["alice"])

    listed = run_cli(tokens["alice"], "vcs", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert_same_vcs(json.loads(listed.stdout), api.get("/api/v1/virtual-clusters/").json()["results"])
    assert [vc["name"] for vc in json.loads(listed.stdout)] == ["vision"]

    one = run_cli(tokens["alice"], "vcs", "vision", "-o", "json")
    assert one.returncode == 0, one.stderr
    vision = json.loads(one.stdout)
    assert_same_vcs([vision], [api.get("/api/v1/virtual-clusters/vision/").json()])
    assert vision["stop_policy"] == "hold"
    assert vision["quotas"] == [
        {"gpu_model": "A100", "guaranteed": 8, "borrow_limit": 8, "lending_limit": None, "in_use": 2},
        {"gpu_model": "V100", "guaranteed": 8, "borrow_limit": 4, "lending_limit": 4, "in_use": 0},
    ]


def test_list_of_another_tenants_vc_reads_as_one_that_does_not_exist(run_cli, tokens) -> None:  # type: ignore[no-untyped-def]
    """`list --vc NAME` of a VC the user cannot see said "You have no jobs here" (exit 0)."""
    others = run_cli(tokens["alice"], "list", "--vc", "speech")
    missing = run_cli(tokens["alice"], "list", "--vc", "no-such-vc", "--all")
    assert others.returncode == missing.returncode == cli.NOT_FOUND
    assert others.stderr == "error: virtual cluster speech not found\n"
    assert missing.stderr == "error: virtual cluster no-such-vc not found\n"
    assert others.stdout == missing.stdout == ""

    own = run_cli(tokens["alice"], "list", "--vc", "vision")
    assert own.returncode == 0, own.stderr
    assert own.stderr == "You have no jobs here (--all shows your tenants' jobs).\n"

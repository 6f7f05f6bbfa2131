"""A VC's monthly GPU-hour budget: the hours its jobs held this month (UTC) are counted as the
usage report counts allocated time; once they reach the budget none of its jobs starts (reason
budget-spent, no place in the queue) while its running jobs go on and other VCs' jobs start;
raised in Django admin, the budget lets them start at the next cycle. The tenant's admins are
told at 80 % and at 100 %, once each a month, by mail (real SMTP on loopback) and on their
webhooks (a real receiver on loopback)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from portal.cluster.budgets import gpu_hours_this_month, month_start, next_month_start, notify_budgets
from portal.cluster.models import Node, VirtualCluster
from portal.jobs.choices import JobState
from portal.jobs.models import Allocation, Job
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile, post_vc_change, run, submit
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)


def change_budget(client: Any, gpu_hours: int | None) -> None:
    """Sets vision's budget as a cluster admin does, through the admin's change form."""
    response = post_vc_change(client, gpu_hours_per_month=gpu_hours)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert VirtualCluster.objects.get(name="vision").gpu_hours_per_month == gpu_hours


def started(api_for: Any, user: str, name: str, vc: str) -> int:
    job = submit(api_for(user), name, vc=vc, flavor="s-A100")
    run_cycle(live_profile())
    run(job)
    return job


def test_the_hours_are_clipped_to_the_month_and_counted_per_vc(api_for: Any, paused_loop: Any) -> None:
    Node.objects.update(state="ready")
    vision_job = started(api_for, "alice", "vision-job", "vision")
    speech_job = started(api_for, "carol", "speech-job", "speech")
    start = month_start(timezone.now())
    hour = timedelta(hours=1)
    # vision's 2 GPUs were taken 5 hours before the month began and given back 2 hours into it;
    # speech's 2 were taken 1 hour into the month and are still held.
    Allocation.objects.filter(attempt__job_id=vision_job).update(
        created_at=start - 5 * hour, released_at=start + 2 * hour
    )
    Allocation.objects.filter(attempt__job_id=speech_job).update(created_at=start + hour)
    vcs = list(VirtualCluster.objects.order_by("name"))
    by_name = {vc.name: vc.pk for vc in vcs}

    hours = gpu_hours_this_month(vcs, start + 3 * hour)
    assert hours[by_name["vision"]] == pytest.approx(4.0)
    assert hours[by_name["speech"]] == pytest.approx(4.0)
    hours = gpu_hours_this_month(vcs, start + 1.5 * hour)
    assert hours[by_name["vision"]] == pytest.approx(3.0)
    assert hours[by_name["speech"]] == pytest.approx(1.0)
    # Next month nothing of this month counts but what is still held.
    hours = gpu_hours_this_month(vcs, next_month_start(start) + 2 * hour)
    assert hours[by_name["vision"]] == 0.0
    assert hours[by_name["speech"]] == pytest.approx(4.0)


def test_a_spent_budget_starts_none_of_the_vcs_jobs_until_an_admin_raises_it(
    api_for: Any, cluster_admin_client: Any, paused_loop: Any
) -> None:
    Node.objects.update(state="ready")
    running = started(api_for, "alice", "running", "vision")
    # Held for the last two hours (or since the month began, if that was later).
    taken = max(timezone.now() - timedelta(hours=2), month_start(timezone.now()))
    Allocation.objects.filter(attempt__job_id=running).update(created_at=taken)
    vc = api_for("alice").get("/api/v1/virtual-clusters/vision/").json()
    assert (vc["gpu_hours_per_month"], vc["budget_spent"]) == (None, False)
    assert vc["gpu_hours_this_month"] > 0

    change_budget(cluster_admin_client, 1)
    waiting = submit(api_for("alice"), "waiting", flavor="s-A100")
    elsewhere = submit(api_for("carol"), "elsewhere", vc="speech", flavor="s-A100")
    run_cycle(live_profile())

    job = Job.objects.get(pk=waiting)
    assert (job.state, job.pending_reason, job.queue_position) == (JobState.PENDING, "budget-spent", None)
    now = timezone.now()
    assert re.fullmatch(
        rf"VC vision has used \d+\.\d of its 1 GPU-hours for {month_start(now):%B} \(UTC\): none of its "
        rf"jobs starts until {next_month_start(now):%Y-%m-%d} or until an admin raises its budget",
        job.pending_message,
    ), job.pending_message
    assert Job.objects.get(pk=elsewhere).state == JobState.SCHEDULED
    assert Job.objects.get(pk=running).state == JobState.RUNNING  # it runs on past the budget
    vc = api_for("alice").get("/api/v1/virtual-clusters/vision/").json()
    assert (vc["gpu_hours_per_month"], vc["budget_spent"]) == (1, True)
    assert vc["gpu_hours_this_month"] >= 1.0

    change_budget(cluster_admin_client, 1000)
    run_cycle(live_profile())
    assert Job.objects.get(pk=waiting).state == JobState.SCHEDULED
    vc = api_for("alice").get("/api/v1/virtual-clusters/vision/").json()
    assert (vc["gpu_hours_per_month"], vc["budget_spent"]) == (1000, False)


def test_a_budget_below_one_gpu_hour_is_refused(cluster_admin_client: Any) -> None:
    response = post_vc_change(cluster_admin_client, gpu_hours_per_month=0)
    assert response.status_code == 200  # the form again, with its error
    assert "Ensure this value is greater than or equal to 1." in response.content.decode()
    assert VirtualCluster.objects.get(name="vision").gpu_hours_per_month is None


def test_the_tenant_admins_are_told_at_80_and_at_100_percent_once_a_month(
    api_for: Any,
    users: Any,
    cluster_admin_client: Any,
    mailbox: Any,
    settings: Any,
    receiver: WebhookReceiver,
    eager_tasks: None,
    paused_loop: Any,
) -> None:
    settings.MAIL_ENABLED, settings.MAILERS = True, mailbox.mailers()
    for name in ("vision-admin", "alice"):
        users[name].email = f"{name}@example.org"
        users[name].save(update_fields=["email"])
        hook = api_for(name).post(
            "/api/v1/webhooks/", {"url": f"{receiver.url}/{name}", "format": "json"}, format="json"
        )
        assert hook.status_code == 201, hook.json()
    Node.objects.update(state="ready")
    running = started(api_for, "alice", "running", "vision")
    # Ten days into this month the job has held its 2 GPUs for 4 hours: 8 GPU-hours.
    now = month_start(timezone.now()) + timedelta(days=10)
    Allocation.objects.filter(attempt__job_id=running).update(created_at=now - timedelta(hours=4))
    change_budget(cluster_admin_client, 10)

    assert notify_budgets(now) == ["vision"]
    [mail] = mailbox.about("VC vision: GPU-hour budget")
    assert mail["X-Envelope-To"] == "vision-admin@example.org"  # the tenant's admins only
    text = (
        f"VC vision has used 8.0 of its 10 GPU-hours for {now:%B} (UTC): once it has used them all, "
        f"none of its jobs starts until {next_month_start(now):%Y-%m-%d} or until an admin raises its budget"
    )
    assert text in mail.get_content()
    [delivery] = receiver.deliveries
    assert delivery.path == "/vision-admin"
    assert (delivery.json()["event"], delivery.json()["vc"], delivery.json()["text"]) == (
        "vc.budget",
        "vision",
        text,
    )
    assert delivery.json()["url"] == "https://portal.example.org/vcs/vision"
    assert notify_budgets(now + timedelta(minutes=1)) == []  # told once

    change_budget(cluster_admin_client, 8)  # now spent
    assert notify_budgets(now + timedelta(minutes=2)) == ["vision"]
    assert notify_budgets(now + timedelta(minutes=3)) == []
    spent = mailbox.about("VC vision: GPU-hour budget")[-1].get_content()
    assert f"VC vision has used 8.1 of its 8 GPU-hours for {now:%B} (UTC): none of its jobs starts" in spent
    assert [d.path for d in receiver.deliveries] == ["/vision-admin", "/vision-admin"]

    # A raised budget is told of afresh: 80 % of 20 is reached 4 hours later.
    change_budget(cluster_admin_client, 20)
    assert notify_budgets(now + timedelta(hours=3)) == []
    assert notify_budgets(now + timedelta(hours=4)) == ["vision"]
    assert (
        "has used 16.0 of its 20 GPU-hours" in mailbox.about("VC vision: GPU-hour budget")[-1].get_content()
    )

    # Next month the count starts again (the budget back at 8): 2 GPUs for an hour is under 80 %.
    change_budget(cluster_admin_client, 8)
    assert notify_budgets(next_month_start(now) + timedelta(hours=1)) == []
    assert notify_budgets(next_month_start(now) + timedelta(hours=3.5)) == ["vision"]  # 7 of 8

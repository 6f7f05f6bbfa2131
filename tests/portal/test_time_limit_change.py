"""A job's time limit changes after submission (Slurm's `scontrol update TimeLimit`): its owner
may lower it, an admin of its tenant raise it too, never past its flavor's limit nor a year;
each change leaves an event and an audit entry, and a raised limit is warned about again. The
stop at the limit belongs to the attempt it was made for."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from agents.protocol import ExitReason
from portal.accounts.models import AuditEntry
from portal.jobs import services
from portal.jobs.models import Job, JobAttempt
from scheduler import core
from scheduler.store import preempt_job
from scheduler.tasks import run_cycle
from tests.integration.scripted_agents import ScriptedAgents
from tests.portal.store_helpers import placed_attempt, submit

pytestmark = pytest.mark.django_db(transaction=True)


def limit_of(job_id: int) -> int:
    return Job.objects.get(pk=job_id).time_limit_s


def test_the_owner_lowers_a_tenant_admin_raises_up_to_the_flavors_limit(api_for: Any) -> None:
    alice, admin, bob = api_for("alice"), api_for("vision-admin"), api_for("bob")
    job_id = submit(alice, "long", flavor="s-A100")  # s-A100: at most 72 h
    url = f"/api/v1/jobs/{job_id}/time-limit/"
    assert limit_of(job_id) == 72 * 3600

    lowered = alice.post(url, {"time_limit": "1h30m"}, format="json")
    assert lowered.status_code == 200, lowered.json()
    assert lowered.json()["time_limit_s"] == 5400
    Job.objects.filter(pk=job_id).update(time_limit_warned=True)  # as if warned before the end

    raised = alice.post(url, {"time_limit": "2h"}, format="json")
    assert raised.status_code == 403
    assert (
        raised.json()["detail"]
        == "Only an admin of the job's tenant may raise its time limit; you may lower it."
    )
    assert bob.post(url, {"time_limit": "1h"}, format="json").status_code == 403  # not his job
    too_long = admin.post(url, {"time_limit": "73h"}, format="json")
    assert too_long.json() == {"time_limit": ["At most 3d, the limit of flavor s-A100."]}
    assert admin.post(url, {"time_limit": "soon"}, format="json").json()["time_limit"] == [
        "'soon' is not a duration such as 3600, '90m', '36h' or '2d'."
    ]
    assert admin.post(url, {"time_limit": "2d"}, format="json").status_code == 200
    job = Job.objects.get(pk=job_id)
    assert (job.time_limit_s, job.time_limit_warned) == (2 * 86400, False)

    reasons = list(
        job.events.filter(reason__startswith="time limit changed").values_list("reason", flat=True)
    )
    assert reasons == ["time limit changed: 3d -> 1h30m", "time limit changed: 1h30m -> 2d"]
    audited = AuditEntry.objects.filter(action="job.time_limit", object_id=str(job_id))
    assert list(audited.order_by("id").values_list("actor__username", flat=True)) == ["alice", "vision-admin"]

    assert alice.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 200
    ended = alice.post(url, {"time_limit": "1h"}, format="json")
    assert ended.status_code == 409 and "no longer applies" in ended.json()["detail"]


def test_no_limit_is_longer_than_a_year(api_for: Any, users: dict[str, Any], paused_loop: Any) -> None:
    """Without a flavor nothing else bounds it, and a limit past the integer column (some 68
    years) was a 500 on submission and on a change."""
    alice = api_for("alice")
    resources = {"gpus": 1, "gpu_model": "A100", "cpu": 4, "memory_gb": 16}
    body = {"name": "x", "vc": "vision", "resources": resources, "command": "true"}
    for limit in ["30000d", 10**12, "9" * 5000 + "d"]:
        refused = alice.post("/api/v1/jobs/", {**body, "time_limit": limit}, format="json")
        assert refused.status_code == 400
        assert refused.json() == {"time_limit": ["A duration is at most 365d (a year)."]}
    accepted = alice.post("/api/v1/jobs/", {**body, "time_limit": "365d"}, format="json")
    assert accepted.status_code == 201
    job_id = accepted.json()["id"]

    url = f"/api/v1/jobs/{job_id}/time-limit/"
    too_long = api_for("vision-admin").post(url, {"time_limit": "366d"}, format="json")
    assert too_long.json() == {"time_limit": ["A duration is at most 365d (a year)."]}
    with pytest.raises(services.JobRejected) as refused_change:
        services.change_time_limit(Job.objects.get(pk=job_id), users["vision-admin"], 2**31)
    assert refused_change.value.field == "time_limit"
    assert limit_of(job_id) == 365 * 86400


def test_a_time_limit_stop_does_not_outlive_its_attempt(api_for: Any, paused_loop: Any) -> None:
    """A job told to stop at its limit may be preempted (or drained, or requeued) before its
    agent confirms. The stop went with the job: its next attempt's 'running' report was taken
    for the stop's and ignored (the job stayed 'scheduled', holding its GPUs), and its end was
    called a timeout."""
    agents = ScriptedAgents()
    _, attempt = placed_attempt(api_for)
    agents.converge()
    job = Job.objects.get(pk=attempt.job_id)
    assert job.state == "running"
    JobAttempt.objects.filter(pk=attempt.pk).update(
        started_at=timezone.now() - timedelta(seconds=job.time_limit_s + 5)
    )
    assert services.enforce_time_limits(timezone.now(), 600, 300)["stopping"] == 1
    job = Job.objects.get(pk=job.pk)
    assert job.stop_reason == "time-limit"

    preemption = core.Preemption(
        core.JobId(str(job.pk)), "priority", "for a bigger one", 30.0, core.JobId("")
    )
    with transaction.atomic():
        assert preempt_job(job, preemption)
    agents.end(job, ExitReason.STOPPED, 143)  # SIGTERM, as the stop request asked
    job = Job.objects.get(pk=job.pk)
    assert (job.state, job.stop_reason) == ("pending", "")

    assert run_cycle()["started"] == 1
    agents.converge()
    job = Job.objects.get(pk=job.pk)
    assert job.state == "running" and job.current_attempt().pk != attempt.pk
    # Nor is the next attempt stopped, or forced out, for the limit its predecessor reached.
    assert services.enforce_time_limits(timezone.now() + timedelta(seconds=600), 60, 300) == {
        "warned": 0,
        "stopping": 0,
        "forced": 0,
    }
    agents.end(job, ExitReason.SUCCEEDED, 0)
    assert Job.objects.get(pk=job.pk).state == "succeeded"

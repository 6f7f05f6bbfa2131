"""POST /api/v1/jobs/ID/hold/ on a running job pauses it, and .../release/ resumes it: for the
job's owner and its tenant's admins, as for a pending job; a member of the tenant is refused,
and another tenant does not learn the job exists."""

from __future__ import annotations

from typing import Any

import pytest

from portal.cluster.models import Node
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from portal.live.hub import channel_for
from portal.live.publish import job_group
from scheduler.tasks import run_cycle
from tests.integration.scripted_agents import ScriptedAgents
from tests.portal.hint_helpers import HintListener

pytestmark = pytest.mark.django_db(transaction=True)


def running_job(api_for: Any, **spec: Any) -> int:
    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    Node.objects.filter(name="a100-node-1").update(state="ready")
    body = {"name": "train", "vc": "vision", "flavor": "s-A100", "command": "sleep 600", **spec}
    response = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    assert run_cycle()["started"] == 1
    ScriptedAgents().converge()
    job_id = int(response.json()["id"])
    assert Job.objects.get(pk=job_id).state == JobState.RUNNING
    return job_id


def test_the_owner_or_a_tenant_admin_pauses_and_resumes_a_running_job(api_for: Any, paused_loop: Any) -> None:
    job_id = running_job(api_for, checkpoint={"enabled": True})
    hold, release = f"/api/v1/jobs/{job_id}/hold/", f"/api/v1/jobs/{job_id}/release/"
    assert api_for("carol").post(hold).status_code == 404  # another tenant's job
    assert api_for("bob").post(hold).status_code == 403  # a member, not the owner
    assert api_for("victor").post(hold).status_code == 403  # a viewer
    assert Job.objects.get(pk=job_id).state == JobState.RUNNING

    paused = api_for("vision-admin").post(hold)
    assert paused.status_code == 200, paused.json()
    shown = paused.json()
    assert (shown["state"], shown["on_hold"], shown["paused"], shown["pending_reason"]) == (
        "checkpointing",
        True,
        True,
        "held",
    )
    assert shown["pending_message"] == "Paused by vision-admin: resumes from its checkpoint when released"
    assert api_for("alice").post(hold).status_code == 409  # already held
    assert api_for("alice").get(f"/api/v1/jobs/{job_id}/").json()["paused"] is True

    assert api_for("carol").post(release).status_code == 404
    assert api_for("bob").post(release).status_code == 403
    resumed = api_for("alice").post(release)
    assert resumed.status_code == 200
    assert (resumed.json()["on_hold"], resumed.json()["paused"]) == (False, False)


def test_a_running_job_without_checkpointing_is_refused_with_409(api_for: Any, paused_loop: Any) -> None:
    job_id = running_job(api_for)
    refused = api_for("alice").post(f"/api/v1/jobs/{job_id}/hold/")
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"Job {job_id} has no checkpointing; pausing it would lose its work. "
        "Cancel it or resubmit with checkpoint.enabled"
    )
    listed = api_for("alice").get("/api/v1/jobs/").json()["results"]
    assert [(j["state"], j["on_hold"], j["paused"]) for j in listed] == [("running", False, False)]


def test_a_pause_reaches_open_pages_at_once(api_for: Any, paused_loop: Any) -> None:
    """The pause's hint is handed to the sender by the time the request answers: an open page
    does not wait for its next poll to see the job checkpointing."""
    job_id = running_job(api_for, checkpoint={"enabled": True})
    with HintListener(channel_for(job_group(job_id))) as listener:  # the start's hints dropped
        assert api_for("alice").post(f"/api/v1/jobs/{job_id}/hold/").status_code == 200
        hints = [hint for _, hint in listener.hints()]
    hint = next((h for h in hints if h["state"] == "checkpointing"), None)
    assert hint is not None, hints
    assert hint["pending_reason"] == "held"
    assert hint["pending_message"].startswith("Paused by alice")

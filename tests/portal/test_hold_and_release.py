"""A pending job can be held (Slurm's `scontrol hold`): it does not start, however much room
there is, until its owner or a tenant admin releases it; both leave an event and an audit
entry. Holding a job that holds GPUs: tests/portal/test_pause_running_job.py."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.cluster.models import Node
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from portal.live.hub import channel_for
from portal.live.publish import job_group
from scheduler.tasks import run_cycle
from tests.portal.hint_helpers import HintListener
from tests.portal.store_helpers import live_profile, submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_held_job_waits_until_released(api_for: Any, paused_loop: Any) -> None:
    Node.objects.update(state="ready")
    alice, bob = api_for("alice"), api_for("bob")
    job_id = submit(alice, "held", flavor="s-A100")
    held = alice.post(f"/api/v1/jobs/{job_id}/hold/")
    assert held.status_code == 200 and held.json()["on_hold"] is True
    assert held.json()["pending_reason"] == "held"
    assert alice.post(f"/api/v1/jobs/{job_id}/hold/").status_code == 409  # already held

    run_cycle(live_profile())
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.pending_reason, job.pending_message) == (
        JobState.PENDING,
        "held",
        "Held by alice: it does not start until released.",
    )
    assert bob.post(f"/api/v1/jobs/{job_id}/release/").status_code == 403  # not his job
    assert alice.post(f"/api/v1/jobs/{job_id}/release/").status_code == 200
    assert alice.post(f"/api/v1/jobs/{job_id}/release/").status_code == 409  # not held
    run_cycle(live_profile())
    assert Job.objects.get(pk=job_id).state == JobState.SCHEDULED
    assert alice.post(f"/api/v1/jobs/{job_id}/hold/").status_code == 200  # stopped and held
    assert alice.post(f"/api/v1/jobs/{job_id}/hold/").status_code == 409  # already held

    reasons = list(Job.objects.get(pk=job_id).events.values_list("reason", flat=True))
    assert "held: it does not start until released" in reasons
    assert "released: it may start again" in reasons
    actions = set(AuditEntry.objects.filter(object_id=str(job_id)).values_list("action", flat=True))
    assert {"job.hold", "job.release"} <= actions


def test_a_cancelled_held_job_is_not_held_and_cannot_be_released(api_for: Any, paused_loop: Any) -> None:
    """A release of an ended job used to succeed: it wrote 'released: it may start again' on a
    cancelled job, which still read held."""
    alice = api_for("alice")
    job_id = submit(alice, "held", flavor="s-A100")
    assert alice.post(f"/api/v1/jobs/{job_id}/hold/").status_code == 200
    cancelled = alice.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["on_hold"] is False
    released = alice.post(f"/api/v1/jobs/{job_id}/release/")
    assert released.status_code == 409
    assert released.json()["detail"] == f"Job {job_id} has already ended (cancelled)."
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.on_hold) == (JobState.CANCELLED, False)
    assert not job.events.filter(reason__startswith="released").exists()


def test_hold_and_release_reach_open_pages_at_once(api_for: Any, paused_loop: Any) -> None:
    """A page following the job hears the hold and the release over Redis, without waiting for
    its next poll (the hub forwards what arrives on the job's channel to its browsers)."""
    alice = api_for("alice")
    job_id = submit(alice, "watched", flavor="s-A100")
    with HintListener(channel_for(job_group(job_id))) as listener:  # the submission's dropped

        def next_hint(seen: int) -> dict[str, Any]:
            """The first hint of the action newer than version `seen` (the job before it): a
            page drops older ones."""
            newer = [hint for _, hint in listener.hints() if hint["version"] > seen]
            assert newer, "no hint was published for the job"
            return dict(newer[0])

        before = Job.objects.get(pk=job_id).version
        assert alice.post(f"/api/v1/jobs/{job_id}/hold/").status_code == 200
        hint = next_hint(before)
        assert (hint["job"], hint["state"], hint["pending_reason"]) == (job_id, "pending", "held")
        assert hint["pending_message"] == "Held by alice: it does not start until released."
        before = Job.objects.get(pk=job_id).version
        assert alice.post(f"/api/v1/jobs/{job_id}/release/").status_code == 200
        assert next_hint(before)["pending_reason"] == "new"


def test_a_cycle_that_read_the_job_before_its_hold_does_not_overwrite_the_hold(
    api_for: Any, paused_loop: Any
) -> None:
    from scheduler import core
    from scheduler.store import record_pending_statuses

    alice = api_for("alice")
    job_id = submit(alice, "held", flavor="s-A100")
    # What a cycle that loaded the job before the hold would record when it ends.
    stale = core.PendingStatus(
        core.JobId(str(job_id)), core.ReasonCode.INSUFFICIENT_GPUS, "no GPUs free", None
    )
    assert alice.post(f"/api/v1/jobs/{job_id}/hold/").status_code == 200
    record_pending_statuses((stale,), core.Snapshot(nodes=(), vcs=(), running=(), pending=()))
    job = Job.objects.get(pk=job_id)
    assert (job.pending_reason, job.queue_position) == ("held", None), job.pending_message

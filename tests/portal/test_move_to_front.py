"""An owner moves a pending job to the front of their own jobs (Slurm's `scontrol top`): the
next cycle starts it before their earlier jobs, other users' jobs keep their places, and the
move leaves an event and an audit entry."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.cluster.models import Node
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from portal.jobs.services import transition_job
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile, submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_moved_job_starts_before_its_owners_earlier_jobs_and_no_one_elses(
    api_for: Any, paused_loop: Any
) -> None:
    Node.objects.update(state="ready")
    profile = live_profile()
    alice, bob = api_for("alice"), api_for("bob")
    blocker = submit(alice, "blocker")
    run_cycle(profile)
    assert transition_job(Job.objects.get(pk=blocker), JobState.RUNNING, label="test")
    first, bobs, last = submit(alice, "first"), submit(bob, "bobs"), submit(alice, "last")
    run_cycle(profile)
    assert Job.objects.get(pk=first).state == JobState.SCHEDULED  # one 8-GPU node was free
    assert transition_job(Job.objects.get(pk=first), JobState.RUNNING, label="test")
    early = submit(alice, "early")  # now alice has `last` and `early` waiting, bob `bobs`
    run_cycle(profile)
    order = lambda: sorted([bobs, last, early], key=lambda pk: Job.objects.get(pk=pk).queue_position)  # noqa: E731
    assert order() == [bobs, last, early]

    moved = alice.post(f"/api/v1/jobs/{early}/top/")
    assert moved.status_code == 200 and moved.json()["topped_at"]
    run_cycle(profile)
    assert order() == [bobs, early, last]  # bob keeps the first place; alice's swap
    event = Job.objects.get(pk=early).events.last()
    assert event.actor_label == "alice" and "moved to the front of alice's pending jobs" in event.reason
    assert AuditEntry.objects.filter(action="job.top", object_id=str(early)).exists()

    # Bob may not move alice's job (a member, not a tenant admin); a running job cannot move.
    assert bob.post(f"/api/v1/jobs/{last}/top/").status_code == 403
    assert alice.post(f"/api/v1/jobs/{first}/top/").status_code == 409
    assert api_for("carol").post(f"/api/v1/jobs/{last}/top/").status_code == 404

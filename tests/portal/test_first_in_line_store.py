"""GPUs freed for a job go to that job: the store marks a job first in line when the last cycle
told it to wait for its victims, and moved when a migration stopped it, and the cycle places
either before jobs ahead of it in the queue."""

from __future__ import annotations

from typing import Any

import pytest

from portal.cluster.models import Node
from portal.jobs.choices import PENDING_MOVED, PENDING_REQUEUED, JobState
from portal.jobs.models import Job
from portal.jobs.services import transition_job
from scheduler import core
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("code", "goes_first"),
    [
        pytest.param(PENDING_MOVED, True, id="moved"),
        pytest.param(core.ReasonCode.WAITING_FOR_PREEMPTION.value, True, id="waiting-for-preemption"),
        pytest.param(PENDING_REQUEUED, False, id="requeued"),
    ],
)
def test_a_job_gpus_were_freed_for_starts_before_an_earlier_one(
    api_for: Any, paused_loop: Any, code: str, goes_first: bool
) -> None:
    """Vision's two 8-GPU nodes, one taken: room for one of two 8-GPU jobs. FIFO inside the
    queue would start `early`; `claimant` starts instead when its pending code says the GPUs
    were freed for it."""
    Node.objects.update(state="ready")
    profile = live_profile()
    alice = api_for("alice")
    blocker = submit(alice, "blocker")
    run_cycle(profile)
    blocker_job = Job.objects.get(pk=blocker)
    assert transition_job(blocker_job, JobState.RUNNING, label="test")
    early = submit(alice, "early")
    claimant = submit(alice, "claimant")
    Job.objects.filter(pk=claimant).update(pending_reason=code)

    run_cycle(profile)
    states = dict(Job.objects.filter(pk__in=[early, claimant]).values_list("pk", "state"))
    started, waiting = (claimant, early) if goes_first else (early, claimant)
    assert states == {started: JobState.SCHEDULED, waiting: JobState.PENDING}

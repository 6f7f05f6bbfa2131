"""A VC may limit how many jobs one user has waiting (Slurm's MaxSubmitJobs for pending jobs):
past it a submission is refused with a message naming the limit, a job array all or nothing;
other users, and the user once some jobs started or were cancelled, submit as before."""

from __future__ import annotations

from typing import Any

import pytest

from portal.cluster.models import VirtualCluster
from portal.jobs.models import Job
from tests.portal.store_helpers import submit

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = {"name": "small", "vc": "vision", "flavor": "s-A100", "command": "sleep 60"}


def test_a_user_past_the_vcs_limit_of_waiting_jobs_is_refused(api_for: Any) -> None:
    VirtualCluster.objects.filter(name="vision").update(max_pending_jobs_per_user=2)
    alice, bob = api_for("alice"), api_for("bob")
    first = submit(alice, "one", flavor="s-A100")
    submit(alice, "two", flavor="s-A100")
    refused = alice.post("/api/v1/jobs/", SMALL, format="json")
    assert refused.status_code == 400
    assert refused.json() == {
        "vc": [
            "You have 2 pending jobs in VC vision, which allows 2 per user. "
            "Wait for some to start, or cancel some."
        ]
    }
    assert Job.objects.filter(owner__username="alice").count() == 2  # nothing stored
    submit(bob, "bobs", flavor="s-A100")  # the limit is per user
    assert alice.post(f"/api/v1/jobs/{first}/cancel/").status_code == 200
    submit(alice, "three", flavor="s-A100")  # one waits no more
    assert alice.get("/api/v1/virtual-clusters/vision/").json()["max_pending_jobs_per_user"] == 2


def test_a_job_array_past_the_limit_is_refused_whole(api_for: Any) -> None:
    VirtualCluster.objects.filter(name="vision").update(max_pending_jobs_per_user=3)
    alice = api_for("alice")
    submit(alice, "waiting", flavor="s-A100")
    array = {"jobs": [{**SMALL, "name": f"item-{i}"} for i in range(3)]}
    refused = alice.post("/api/v1/jobs/bulk/", array, format="json")
    assert refused.status_code == 400, refused.json()
    message = "You have 1 pending job in VC vision, which allows 3 per user; these 3 would make 4."
    assert message in str(refused.json())
    assert Job.objects.filter(owner__username="alice").count() == 1
    two = {"jobs": array["jobs"][:2]}
    assert alice.post("/api/v1/jobs/bulk/", two, format="json").status_code == 201
    assert Job.objects.filter(owner__username="alice").count() == 3

"""A job's time limit changes after submission (Slurm's `scontrol update TimeLimit`): its owner
may lower it, an admin of its tenant raise it too, never past its flavor's limit; each change
leaves an event and an audit entry, and a raised limit is warned about again."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.jobs.models import Job
from tests.portal.store_helpers import submit

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

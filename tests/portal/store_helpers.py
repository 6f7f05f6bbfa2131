"""What the tests of the scheduler's store share: the live tests' profile, submitting through
the API, placing a job on a known node, and moving a job on as an agent's report would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from portal.cluster.models import Node, VirtualCluster
from portal.jobs.choices import JobState
from portal.jobs.models import Job, JobAttempt
from portal.jobs.services import transition_job
from scheduler import core

LIVE_PROFILE = Path(__file__).resolve().parents[1] / "testdata" / "live-profile.json"


def live_profile() -> core.Profile:
    return core.Profile.from_dict(json.loads(LIVE_PROFILE.read_text()))


def submit(client: Any, name: str, **spec: Any) -> int:
    """Submits an 8-GPU job (a whole A100 node) to vision unless `spec` says otherwise."""
    body = {"name": name, "vc": "vision", "flavor": "l-A100", "command": "sleep 600", **spec}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


def run(job_id: int) -> None:
    """What the agents' reports would do: scheduled -> running."""
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SCHEDULED
    assert transition_job(job, JobState.RUNNING, label="test")


def placed_attempt(api_for: Any, command: str = "sleep 600") -> tuple[Node, JobAttempt]:
    """A two-GPU job (s-A100) of alice's placed by a real cycle on a100-node-1 (the only ready node)."""
    from scheduler.tasks import run_cycle

    Node.objects.exclude(name="a100-node-1").update(state="cordoned")
    node = Node.objects.get(name="a100-node-1")
    Node.objects.filter(pk=node.pk).update(state="ready")
    body = {"name": "placed", "vc": "vision", "flavor": "s-A100", "command": command}
    response = api_for("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    assert run_cycle()["started"] == 1
    return node, JobAttempt.objects.get(job_id=response.json()["id"])


def vc_change_form(name: str = "vision", **fields: Any) -> dict[str, str]:
    """The VC's change form in Django admin as a cluster admin would post it: its current values,
    with `fields` changed (None posts an empty field), and no quota rows unless `fields` say."""
    vc = VirtualCluster.objects.get(name=name)
    form = {
        "tenant": vc.tenant_id,
        "name": vc.name,
        "description": vc.description,
        "queueing_policy": vc.queueing_policy,
        "stop_policy": vc.stop_policy,
        "idle_policy": vc.idle_policy,
        "allowed_mounts": "[]",
        "quotas-TOTAL_FORMS": "0",
        "quotas-INITIAL_FORMS": "0",
        **fields,
    }
    return {field: "" if value is None else str(value) for field, value in form.items()}


def post_vc_change(client: Any, name: str = "vision", **fields: Any) -> Any:
    vc = VirtualCluster.objects.get(name=name)
    return client.post(f"/admin/cluster/virtualcluster/{vc.pk}/change/", vc_change_form(name, **fields))

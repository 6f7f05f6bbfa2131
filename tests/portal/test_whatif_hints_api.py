"""A cycle stores what-if hints on blocked jobs; the job API shows them and clears them."""

from __future__ import annotations

from typing import Any

import pytest

from portal.cluster.models import Node
from scheduler.tasks import run_cycle

pytestmark = pytest.mark.django_db(transaction=True)


def submit(client: Any, name: str, flavor: str) -> int:
    response = client.post(
        "/api/v1/jobs/", {"name": name, "vc": "vision", "flavor": flavor, "command": "true"}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def test_a_quota_bound_job_is_offered_the_other_model_s_flavor(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    Node.objects.update(state="ready")
    alice = api_for("alice")
    # vision may hold 8 + 8 borrowed A100: two 8-GPU jobs take all of it.
    first, second = submit(alice, "a", "l-A100"), submit(alice, "b", "l-A100")
    blocked = submit(alice, "c", "l-A100")
    run_cycle()
    states = {j["id"]: j["state"] for j in alice.get("/api/v1/jobs/?limit=10").json()["results"]}
    assert states[first] == states[second] == "scheduled" and states[blocked] == "pending"

    job = alice.get(f"/api/v1/jobs/{blocked}/").json()
    assert job["pending_reason"] == "vc-quota"
    hints = {h["kind"]: h for h in job["whatif_hints"]}
    other_model = hints["gpu-model"]
    assert other_model["gpu_model"] == "V100" and other_model["flavor"] == "l-V100"
    assert other_model["starts_now"] is True and other_model["estimated_start_at"] is not None
    assert (other_model["replicas"], other_model["gpus_per_replica"]) == (1, 8)
    assert "l-V100" in other_model["message"]
    # Fewer A100s cannot help: the VC's A100 quota is used up until a job ends.
    assert "fewer-gpus" not in hints or hints["fewer-gpus"]["starts_now"] is False

    # The hint is right: the same job on the proposed flavor starts in the next cycle.
    taken = submit(alice, "c-on-v100", other_model["flavor"])
    run_cycle()
    assert alice.get(f"/api/v1/jobs/{taken}/").json()["state"] == "scheduled"

    alice.post(f"/api/v1/jobs/{blocked}/cancel/")
    assert alice.get(f"/api/v1/jobs/{blocked}/").json()["whatif_hints"] == []


def test_other_tenants_do_not_see_hints_of_a_job(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    Node.objects.update(state="ready")
    alice = api_for("alice")
    submit(alice, "a", "l-A100")
    submit(alice, "b", "l-A100")
    blocked = submit(alice, "c", "l-A100")
    run_cycle()
    assert api_for("carol").get(f"/api/v1/jobs/{blocked}/").status_code == 404

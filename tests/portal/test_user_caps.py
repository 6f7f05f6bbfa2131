"""A VC's per-user CPU and memory caps through the portal: an admin sets them (positive whole
numbers), tenants read them, the store hands them to the core in its units, a real cycle keeps
a user's job waiting while it would take them past one, and a job that on its own asks for more
than a cap allows is refused at submission."""

from __future__ import annotations

import time
from typing import Any

import pytest

from portal.cluster.models import Node, VirtualCluster
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from scheduler import core
from scheduler.store import load_snapshot
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile, post_vc_change, submit

pytestmark = pytest.mark.django_db(transaction=True)


def vcs_in_snapshot() -> dict[str, core.VirtualCluster]:
    return {vc.name: vc for vc in load_snapshot(time.time()).snapshot.vcs}


def test_an_admin_sets_the_caps_tenants_read_them_and_the_snapshot_carries_them(
    users: Any, api_for: Any, cluster_admin_client: Any
) -> None:
    response = post_vc_change(cluster_admin_client, max_cpus_per_user=0, max_memory_gb_per_user=-1)
    assert response.status_code == 200  # the form again, with its errors
    assert response.context["adminform"].form.errors.keys() == {"max_cpus_per_user", "max_memory_gb_per_user"}

    response = post_vc_change(cluster_admin_client, max_cpus_per_user=96, max_memory_gb_per_user=512)
    assert response.status_code == 302, response.content.decode()[:2000]
    vcs = vcs_in_snapshot()
    assert (vcs["vision"].max_cpu_milli_per_user, vcs["vision"].max_memory_mib_per_user) == (
        96_000,
        512 * 1024,
    )
    assert (vcs["speech"].max_cpu_milli_per_user, vcs["speech"].max_memory_mib_per_user) == (None, None)

    alice = api_for("alice")
    shown = alice.get("/api/v1/virtual-clusters/vision/").json()
    assert (shown["max_cpus_per_user"], shown["max_memory_gb_per_user"]) == (96, 512)
    assert alice.patch("/api/v1/virtual-clusters/vision/", {"max_cpus_per_user": 1000}).status_code == 405

    post_vc_change(cluster_admin_client, max_cpus_per_user=None, max_memory_gb_per_user=None)
    assert vcs_in_snapshot()["vision"].max_cpu_milli_per_user is None


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        (
            {"max_cpus_per_user": 100},
            "user alice holds 64 of 100 CPUs allowed per user in VC vision; job needs 64",
        ),
        (
            {"max_memory_gb_per_user": 300},
            "user alice holds 256 GB of 300 GB of memory allowed per user in VC vision; job needs 256 GB",
        ),
    ],
    ids=["cpu", "memory"],
)
def test_a_job_waits_while_it_would_take_its_user_past_a_cap(
    api_for: Any, paused_loop: Any, caps: dict[str, int], message: str
) -> None:
    Node.objects.update(state="ready")  # 16 A100 on two nodes of 256 CPUs and 2048 GB
    VirtualCluster.objects.filter(name="vision").update(**caps)
    alice, bob = api_for("alice"), api_for("bob")
    first = submit(alice, "first", flavor="s-A100")  # 2 A100, 64 CPUs, 256 GB each
    second = submit(alice, "second", flavor="s-A100")
    bobs = submit(bob, "bobs", flavor="s-A100")

    run_cycle(live_profile())
    assert Job.objects.get(pk=first).state == JobState.SCHEDULED
    assert Job.objects.get(pk=bobs).state == JobState.SCHEDULED  # the cap is per user
    waiting = Job.objects.get(pk=second)
    assert (waiting.state, waiting.pending_reason, waiting.pending_message) == (
        JobState.PENDING,
        "user-limit",
        message,
    )
    shown = alice.get(f"/api/v1/jobs/{second}/").json()
    assert (shown["pending_reason"], shown["pending_message"]) == ("user-limit", message)

    assert alice.post(f"/api/v1/jobs/{first}/cancel/").status_code == 200  # its CPU and memory free
    run_cycle(live_profile())
    assert Job.objects.get(pk=second).state == JobState.SCHEDULED


@pytest.mark.parametrize(
    ("caps", "spec", "field", "message"),
    [
        (
            {"max_cpus_per_user": 100},
            {"flavor": "m-A100"},
            "flavor",
            "The job asks for 128 CPUs but VC vision allows one user at most 100, so it could never start.",
        ),
        (
            {"max_cpus_per_user": 100},
            {"flavor": "s-A100", "replicas": 2},
            "replicas",
            "The job asks for 128 CPUs (2 replicas of 64) but VC vision allows one user at most 100, "
            "so it could never start.",
        ),
        (
            {"max_memory_gb_per_user": 512},
            {"resources": {"gpus": 1, "gpu_model": "A100", "cpu": 8, "memory_gb": 600}},
            "resources",
            "The job asks for 600 GB of memory but VC vision allows one user at most 512 GB, so it "
            "could never start.",
        ),
        (
            {"max_gpus_per_user": 4},
            {"flavor": "l-A100"},
            "flavor",
            "The job asks for 8 GPUs but VC vision allows one user at most 4, so it could never start.",
        ),
    ],
    ids=["cpu", "cpu-of-all-replicas", "memory", "gpus"],
)
def test_a_job_wider_than_a_cap_is_refused_at_submission(
    api_for: Any, caps: dict[str, int], spec: dict[str, Any], field: str, message: str
) -> None:
    VirtualCluster.objects.filter(name="vision").update(**caps)
    alice = api_for("alice")
    body = {"name": "wide", "vc": "vision", "command": "sleep 600", **spec}
    for path in ("/api/v1/jobs/", "/api/v1/jobs/dry-run/"):
        response = alice.post(path, body, format="json")
        assert (response.status_code, response.json()) == (400, {field: [message]}), path
    assert not Job.objects.exists()
    # With the cap at what the job asks for in all, it is accepted.
    (name,) = caps
    asked = {"max_cpus_per_user": 128, "max_memory_gb_per_user": 600, "max_gpus_per_user": 8}[name]
    VirtualCluster.objects.filter(name="vision").update(**{name: asked})
    response = alice.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()

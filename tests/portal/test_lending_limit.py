"""A VC's lending limit (Kueue's lendingLimit) through the portal: the store hands it to the
core with the quota, and a real cycle keeps the GPUs a VC does not lend free for it, until an
admin lets them be lent."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client

from portal.accounts.models import Tenant
from portal.cluster.models import Node, Quota, VirtualCluster
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from scheduler import core
from scheduler.store import load_snapshot
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile, submit

pytestmark = pytest.mark.django_db(transaction=True)


def quotas_in_snapshot(vc_name: str) -> dict[str, core.Quota]:
    vcs = {vc.name: vc for vc in load_snapshot(time.time()).snapshot.vcs}
    return {quota.gpu_model: quota for quota in vcs[core.VcName(vc_name)].quotas}


def test_the_snapshot_carries_each_quotas_lending_limit(users: Any) -> None:
    Quota.objects.filter(virtual_cluster__name="speech", gpu_model="A100").update(lending_limit=0)
    assert quotas_in_snapshot("speech") == {
        "A100": core.Quota("A100", 8, 8, lending_limit=0),
        "V100": core.Quota("V100", 8, 4, lending_limit=None),
    }
    assert quotas_in_snapshot("vision")["V100"].lending_limit == 4  # the demo's

    Quota.objects.filter(virtual_cluster__name="speech", gpu_model="A100").update(lending_limit=None)
    assert quotas_in_snapshot("speech")["A100"].lending_limit is None


def test_gpus_a_vc_does_not_lend_stay_free_until_an_admin_lends_them(
    api_for: Any, cluster_admin_client: Any, paused_loop: Any
) -> None:
    Node.objects.update(state="ready")  # 16 A100 on two nodes, none in use
    keeper = VirtualCluster.objects.create(name="keeper", tenant=Tenant.objects.get(name="speech"))
    kept = Quota.objects.create(
        virtual_cluster=keeper, gpu_model="A100", guaranteed=8, borrow_limit=0, lending_limit=0
    )
    borrower = VirtualCluster.objects.create(name="borrower", tenant=Tenant.objects.get(name="vision"))
    Quota.objects.create(virtual_cluster=borrower, gpu_model="A100", guaranteed=0, borrow_limit=16)
    alice = api_for("alice")
    first = submit(alice, "first", vc="borrower")  # 8 A100 each, all of them borrowed
    second = submit(alice, "second", vc="borrower")

    run_cycle(live_profile())
    assert Job.objects.get(pk=first).state == JobState.SCHEDULED  # the 8 nobody keeps
    waiting = Job.objects.get(pk=second)
    assert (waiting.state, waiting.pending_reason) == (JobState.PENDING, "not-lent")
    assert "borrower" in waiting.pending_message and "kept free" in waiting.pending_message
    assert alice.get(f"/api/v1/jobs/{second}/").json()["pending_reason"] == "not-lent"

    form = {
        "virtual_cluster": keeper.pk,
        "gpu_model": "A100",
        "guaranteed": 8,
        "borrow_limit": 0,
        "lending_limit": "",  # lends all
    }
    response = cluster_admin_client.post(f"/admin/cluster/quota/{kept.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    kept.refresh_from_db()
    assert kept.lending_limit is None

    run_cycle(live_profile())
    assert Job.objects.get(pk=second).state == JobState.SCHEDULED


def test_an_all_models_quota_row_admits_jobs_and_counts_every_model_in_use(
    api_for: Any, cluster_admin_client: Any, paused_loop: Any
) -> None:
    """docs/scheduler.md: a quota's gpu_model is a model or '*' for all models. The scheduler's
    core falls back to the '*' row for a model without one, so submission must too (it refused
    'no quota for A100'), and the row's in-use counts every model, in the API, in Django admin
    and in the metrics."""
    from tests.portal.metrics.test_metrics import scrape, value

    Node.objects.update(state="ready")
    vision = VirtualCluster.objects.get(name="vision")
    Quota.objects.filter(virtual_cluster=vision).exclude(gpu_model="V100").delete()
    Quota.objects.create(virtual_cluster=vision, gpu_model="*", guaranteed=16, borrow_limit=0)
    alice = api_for("alice")
    a100 = submit(alice, "on-the-star-row")  # 8 A100: only the '*' row covers A100
    too_big = alice.post(
        "/api/v1/jobs/",
        {
            "name": "x",
            "vc": "vision",
            "resources": {"gpus": 8, "gpu_model": "A100", "cpu": 1, "memory_gb": 1},
            "replicas": 3,
            "command": "true",
        },
        format="json",
    )
    assert too_big.status_code == 400 and "at most 16" in str(too_big.json())  # the '*' row's limit
    run_cycle(live_profile())
    assert Job.objects.get(pk=a100).state == JobState.SCHEDULED

    (vc,) = [v for v in alice.get("/api/v1/virtual-clusters/").json()["results"] if v["name"] == "vision"]
    in_use = {q["gpu_model"]: q["in_use"] for q in vc["quotas"]}
    assert in_use == {"*": 8, "V100": 0}  # the model's own row wins for V100
    samples = scrape(Client(), REMOTE_ADDR="127.0.0.1")
    assert value(samples, "gpuportal_vc_gpus_allocated", vc="vision", model="*") == 8
    page = cluster_admin_client.get("/admin/cluster/quota/").content.decode()
    assert "8 / 16 + 0" in page

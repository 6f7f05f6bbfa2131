"""The nodes API carries each GPU's latest reading (numbers only) for the cluster grid."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents.protocol import GpuProcess, GpuSample
from portal.cluster.models import Node
from portal.cluster.services import store_telemetry

pytestmark = pytest.mark.django_db


def test_a_gpu_shows_its_latest_reading_without_processes(api_for) -> None:  # type: ignore[no-untyped-def]
    node = Node.objects.get(name="a100-node-1")
    gpu = node.gpus.get(index=3)
    old = GpuSample(gpu_uuid=gpu.uuid, time=datetime(2026, 1, 1, 12, 0, tzinfo=UTC), utilization_pct=10.0)
    new = GpuSample(
        gpu_uuid=gpu.uuid,
        time=datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC),
        utilization_pct=87.5,
        memory_used_mib=40_000,
        memory_total_mib=81_920,
        temperature_c=61.0,
        power_w=312.0,
        processes=[GpuProcess(pid=4242, used_memory_mib=39_000, attempt_id="secret-attempt-7")],
    )
    store_telemetry([(node.pk, [old]), (node.pk, [new])])

    body = api_for("carol").get("/api/v1/nodes/a100-node-1/").json()
    gpus = {g["index"]: g for g in body["gpus"]}
    reading = gpus[3]["latest"]
    assert reading["utilization_pct"] == 87.5
    assert (reading["memory_used_mib"], reading["memory_total_mib"]) == (40_000, 81_920)
    assert (reading["temperature_c"], reading["power_w"]) == (61.0, 312.0)
    assert "processes" not in reading and "secret-attempt" not in str(body)


def test_a_gpu_names_its_job_only_to_that_job_s_tenant(api_for, paused_loop) -> None:  # type: ignore[no-untyped-def]
    from portal.cluster.models import Node as NodeModel
    from scheduler.tasks import run_cycle

    NodeModel.objects.update(state="ready")
    spec = {"name": "x", "vc": "vision", "flavor": "l-A100", "command": "true"}
    job_id = api_for("alice").post("/api/v1/jobs/", spec, format="json").json()["id"]
    run_cycle()

    def holders(user: str) -> set[int | None]:
        nodes = api_for(user).get("/api/v1/nodes/").json()
        nodes = nodes["results"] if isinstance(nodes, dict) else nodes
        return {g["job"] for n in nodes for g in n["gpus"] if g["allocated"]}

    assert holders("bob") == {job_id}
    assert holders("carol") == {None}


def test_cluster_admins_cordon_and_uncordon_from_the_api(api_for, users) -> None:  # type: ignore[no-untyped-def]
    from portal.accounts.models import AuditEntry

    admin = api_for("admin")
    response = admin.post("/api/v1/nodes/a100-node-2/state/", {"action": "cordon", "reason": "bad fan"})
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["state_reason"]) == ("cordoned", "bad fan")
    assert Node.objects.get(name="a100-node-2").state == "cordoned"
    assert AuditEntry.objects.filter(action="node.cordon").exists()

    bad = admin.post("/api/v1/nodes/a100-node-2/state/", {"action": "explode"})
    assert bad.status_code == 400 and "action" in bad.json()
    assert Node.objects.get(name="a100-node-2").state == "cordoned"


def test_uncordoning_a_node_whose_agent_is_long_silent_leaves_it_not_ready(api_for, settings) -> None:  # type: ignore[no-untyped-def]
    """Ready means an agent is there to run the work: one last heard an hour ago is not."""
    from datetime import timedelta

    from django.utils import timezone

    settings.NODE_SILENT_AFTER_S = 30
    admin = api_for("admin")
    an_hour_ago, just_now = timezone.now() - timedelta(hours=1), timezone.now() - timedelta(seconds=5)
    for heard, state in [(an_hour_ago, "not-ready"), (just_now, "ready")]:
        Node.objects.filter(name="a100-node-2").update(state="cordoned", last_heartbeat_at=heard)
        response = admin.post("/api/v1/nodes/a100-node-2/state/", {"action": "uncordon"})
        assert response.status_code == 200 and response.json()["state"] == state
        assert Node.objects.get(name="a100-node-2").state == state

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

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from portal.cluster.models import Gpu, Node
from portal.jobs.models import Allocation, Job, JobAttempt

pytestmark = pytest.mark.django_db


def scrape(client: Client, **headers: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    matches = [v for got, v in samples[name] if all(got.get(k) == want for k, want in labels.items())]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return matches[0]


def test_only_allowed_addresses_or_the_token_may_scrape(users, settings) -> None:  # type: ignore[no-untyped-def]
    settings.METRICS_ALLOWED_IPS = []
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    client = Client()
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token").status_code == 200
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403


def test_gpus_jobs_and_telemetry_are_reported_with_their_labels(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    api_for("carol").post("/api/v1/jobs/", {**small_job, "vc": "speech"}, format="json")
    attempt = JobAttempt.objects.create(job=job, number=1)
    gpus = list(Gpu.objects.filter(node__name="a100-node-1").order_by("index")[:2])
    for gpu in gpus:
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node)
    Job.objects.filter(pk=job.pk).update(state="running")
    Gpu.objects.filter(node__name="a100-node-2", index=7).update(healthy=False)
    node = Node.objects.get(name="a100-node-1")
    cache = redis.Redis.from_url(settings.REDIS_URL)
    sample = {"gpu_uuid": gpus[0].uuid, "utilization_pct": 87.5, "memory_used_mib": 1024, "power_w": 310.0}
    cache.hset(f"telemetry:node:{node.pk}", gpus[0].uuid, json.dumps(sample))
    try:
        samples = scrape(Client())
    finally:
        cache.delete(f"telemetry:node:{node.pk}")
    assert value(samples, "gpuportal_node_gpus", node="a100-node-1", model="A100") == 8
    assert value(samples, "gpuportal_node_gpus_allocated", node="a100-node-1", model="A100") == 2
    assert value(samples, "gpuportal_node_gpus_healthy", node="a100-node-2", model="A100") == 7
    assert value(samples, "gpuportal_vc_gpus_allocated", vc="vision", model="A100") == 2
    assert value(samples, "gpuportal_vc_gpus_guaranteed", vc="vision", model="A100") == 8
    # Only quotas with a lending limit have one (the demo's vision V100); the others lend all.
    lending = samples["gpuportal_vc_gpus_lending_limit"]
    assert lending == [({"vc": "vision", "tenant": "vision", "model": "V100"}, 4.0)]
    assert value(samples, "gpuportal_tenant_gpus_allocated", tenant="vision", model="A100") == 2
    assert value(samples, "gpuportal_jobs", state="running") == 1
    assert value(samples, "gpuportal_pending_jobs", reason="new") == 1
    labels = {"node": "a100-node-1", "gpu": "0", "job": str(job.pk), "vc": "vision", "tenant": "vision"}
    assert value(samples, "gpuportal_gpu_utilization_percent", **labels) == 87.5
    assert value(samples, "gpuportal_gpu_memory_used_bytes", **labels) == 1024 * 1024 * 1024
    assert value(samples, "gpuportal_gpu_power_watts", **labels) == 310.0


def test_scheduling_cycles_fill_the_duration_histogram(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    from scheduler.tasks import run_cycle

    before = scrape(Client())
    count_before = value(before, "gpuportal_scheduling_cycle_seconds_count")
    run_cycle()
    run_cycle()
    after = scrape(Client())
    assert value(after, "gpuportal_scheduling_cycle_seconds_count") == count_before + 2
    assert value(after, "gpuportal_scheduling_cycle_seconds_bucket", le="+Inf") == count_before + 2
    assert value(after, "gpuportal_scheduling_cycle_seconds_sum") > value(
        before, "gpuportal_scheduling_cycle_seconds_sum"
    )


def test_migrations_and_time_slice_suspensions_are_counted(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    from portal.jobs.models import JobEvent

    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    for data, to_state in (
        ({"preemption": "defrag"}, "checkpointing"),
        ({"preemption": "defrag"}, "checkpointing"),
        ({"preemption": "priority"}, "checkpointing"),
        ({"time_slice": "suspend"}, "suspended"),
    ):
        JobEvent.objects.create(job=job, from_state="running", to_state=to_state, data=data)
    samples = scrape(Client())
    assert value(samples, "gpuportal_migrations_total", reason="defrag") == 2
    assert value(samples, "gpuportal_migrations_total", reason="time-slice-move") == 0
    assert value(samples, "gpuportal_preemptions_total", reason="priority") == 1
    assert value(samples, "gpuportal_time_slice_suspensions_total") == 1

"""Telemetry ingestion: many simulated agents streaming GPU samples to one portal web process.

    python -m bench.telemetry [--agents 1000] [--gpus 8] [--hz 1] [--seconds 20] [--json]

Every GPU is held by a running job, so each sample takes the portal's full path: the latest
value per GPU in Redis, the job's history row in PostgreSQL, and the push to browsers watching
the job. Reports ingestion lag (from a sample's timestamp until the portal holds it), samples
dropped (sent but never stored), and the CPU the web process used, as a share of one core.
Goal: lag p99 < 2 s, nothing dropped, <= 50 % of one core. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import websockets

from agents.protocol import (
    GpuInfo,
    GpuSample,
    GpuTopology,
    Hello,
    HostInfo,
    RuntimeInfo,
    TelemetryBatch,
    encode,
    utc_now,
)
from bench.django_setup import portal_database
from portal.devstack import free_port, port_open, wait_until

REPO = Path(__file__).resolve().parent.parent


def prepare(agents: int, gpus: int) -> dict[str, str]:
    """Nodes with agent tokens, and one running job holding all GPUs of each node."""
    from django.contrib.auth.models import User

    from portal.accounts.models import Tenant, hash_secret
    from portal.cluster.models import Gpu, Node, PriorityClass, Quota, VirtualCluster
    from portal.jobs.models import Allocation, Job, JobAttempt

    user = User.objects.create(username="bench")
    tenant = Tenant.objects.create(name="bench")
    vc = VirtualCluster.objects.create(name="bench", tenant=tenant)
    Quota.objects.create(virtual_cluster=vc, gpu_model="A100", guaranteed=agents * gpus)
    pc = PriorityClass.objects.create(name="training", value=500, is_default=True)
    tokens = {f"bench-{i:05d}": f"gpp_bench_token_{i:05d}_{random.getrandbits(64):x}" for i in range(agents)}
    nodes = Node.objects.bulk_create(
        [
            Node(name=name, state="ready", token_hash=hash_secret(token), cpu=256, memory_gb=2048)
            for name, token in tokens.items()
        ]
    )
    gpu_rows = Gpu.objects.bulk_create(
        [
            Gpu(node=n, index=g, uuid=f"GPU-{n.name}-{g}", model="A100", memory_mb=81920)
            for n in nodes
            for g in range(gpus)
        ]
    )
    jobs = Job.objects.bulk_create(
        [
            Job(
                tenant=tenant,
                virtual_cluster=vc,
                owner=user,
                name=n.name,
                spec={"command": ["true"]},
                priority_class=pc,
                priority=500,
                gpu_model="A100",
                gpus_per_replica=gpus,
                cpu_per_replica=1,
                memory_gb_per_replica=1,
                time_limit_s=86400,
                state="running",
            )
            for n in nodes
        ]
    )
    attempts = JobAttempt.objects.bulk_create([JobAttempt(job=j, number=1, state="running") for j in jobs])
    Allocation.objects.bulk_create(
        [
            Allocation(attempt=attempts[i // gpus], gpu=gpu, node_id=gpu.node_id)
            for i, gpu in enumerate(gpu_rows)
        ]
    )
    return tokens


def hello(node: str, gpus: int) -> str:
    return encode(
        Hello(
            node_name=node,
            agent_version="bench",
            host=HostInfo(hostname=node, cpu_count=256, memory_total_mib=2_097_152, simulated=True),
            runtime=RuntimeInfo(kind="process"),
            gpus=[
                GpuInfo(
                    index=g,
                    uuid=f"GPU-{node}-{g}",
                    model="NVIDIA A100-SXM4-80GB",
                    memory_total_mib=81920,
                    topology=GpuTopology(numa_node=g // 4, pcie_switch=f"sw{g // 2}", nvlink_group="nv"),
                )
                for g in range(gpus)
            ],
        )
    )


async def agent(url: str, node: str, token: str, gpus: int, hz: float, until: float, sent: list[int]) -> None:
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None, open_timeout=120
    ) as ws:
        await ws.send(hello(node, gpus))
        await ws.recv()  # welcome
        period = 1 / hz
        await asyncio.sleep(random.random() * period)  # agents are not in lockstep
        while time.monotonic() < until:
            now = utc_now()
            batch = TelemetryBatch(
                samples=[
                    GpuSample(
                        gpu_uuid=f"GPU-{node}-{g}",
                        time=now,
                        utilization_pct=random.uniform(60, 99),
                        memory_used_mib=40000,
                        memory_total_mib=81920,
                        power_w=300.0,
                        temperature_c=60.0,
                    )
                    for g in range(gpus)
                ]
            )
            await ws.send(encode(batch))
            sent[0] += gpus
            await asyncio.sleep(period)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def watch_lag(redis_url: str, node_ids: list[int], until: float, lags: list[float]) -> None:
    """Polls random nodes' latest samples; a sample's lag is when it was first seen minus its time."""
    from datetime import datetime

    import redis.asyncio as aioredis

    cache = aioredis.Redis.from_url(redis_url)
    seen: set[tuple[int, str]] = set()
    while time.monotonic() < until:
        for node_id in random.sample(node_ids, min(20, len(node_ids))):
            for raw in (await cache.hgetall(f"telemetry:node:{node_id}")).values():
                sample = json.loads(raw)
                key = (node_id, sample["time"])
                if key not in seen:
                    seen.add(key)
                    lags.append(time.time() - datetime.fromisoformat(sample["time"]).timestamp())
        await asyncio.sleep(0.05)
    await cache.aclose()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hz", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with portal_database() as env:
        from portal.cluster.models import Node
        from portal.jobs.models import TelemetrySample

        tokens = prepare(args.agents, args.gpus)
        node_ids = list(Node.objects.values_list("pk", flat=True))
        port = free_port()
        web = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "uvicorn"),
                "portal.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--lifespan",
                "off",
                "--log-level",
                "warning",
            ],
            cwd=REPO,
            env={**env, "LOG_LEVEL": "WARNING"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: port_open(port), 30, "the web server")
            sent = [0]
            lags: list[float] = []

            async def run() -> None:
                until = time.monotonic() + args.seconds
                url = f"ws://127.0.0.1:{port}/ws/agent/"
                await asyncio.gather(
                    *(
                        agent(url, node, token, args.gpus, args.hz, until, sent)
                        for node, token in tokens.items()
                    ),
                    watch_lag(env["REDIS_URL"], node_ids, until + 2, lags),
                )

            cpu_before, wall_before = cpu_seconds(web.pid), time.monotonic()
            asyncio.run(run())
            cpu_used = cpu_seconds(web.pid) - cpu_before
            wall = time.monotonic() - wall_before
            stored = TelemetrySample.objects.count()
        finally:
            web.terminate()
            web.wait(timeout=10)
    result: dict[str, Any] = {
        "benchmark": "telemetry",
        "agents": args.agents,
        "gpus_per_agent": args.gpus,
        "hz": args.hz,
        "seconds": round(wall, 1),
        "samples_sent": sent[0],
        "samples_stored": stored,
        "samples_dropped": max(0, sent[0] - stored),
        "lag_p50_s": round(percentile(lags, 0.5), 3),
        "lag_p99_s": round(percentile(lags, 0.99), 3),
        "lag_observations": len(lags),
        "web_cpu_share_of_one_core": round(cpu_used / wall, 3),
        "mean_lag_s": round(statistics.fmean(lags), 3) if lags else None,
        "goal": {"lag_p99_s": 2.0, "samples_dropped": 0, "web_cpu_share_of_one_core": 0.5},
    }
    if not args.json:
        for key, value in result.items():
            print(f"{key:>28}: {value}", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

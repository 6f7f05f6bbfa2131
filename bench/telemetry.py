"""Telemetry ingestion: many simulated agents streaming GPU samples to one portal web process.

    python -m bench.telemetry [--agents 1000] [--gpus 8] [--hz 1] [--seconds 30] [--json]

Every GPU is held by a running job, so each sample takes the portal's full path: the latest
value per GPU in Redis, the job's history row in PostgreSQL, and the push to browsers watching
the job. The agents are websockets of one asyncio process sending pre-encoded batches, so one
process can play a thousand. All agents connect and say hello first; the measurement covers
only the streaming that follows. Reports ingestion lag (from a sample's timestamp until it is
the latest in Redis, read ten times a second for up to 200 nodes), samples dropped (sent but not
in the history once the agents have disconnected and the portal has written what it held), and
the CPU the web process used (all its threads) as a share of one core, with the simulated
agents' and the whole machine's for context.
Goal: lag p99 < 2 s, nothing dropped, <= 50 % of one core. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import websockets

from agents.protocol import (
    GpuInfo,
    GpuSample,
    GpuTopology,
    Heartbeat,
    Hello,
    HostInfo,
    RuntimeInfo,
    TelemetryBatch,
    decode_from_portal,
    encode,
)
from bench.django_setup import portal_database
from bench.report import print_result
from portal.devstack import free_port, port_open, wait_until

REPO = Path(__file__).resolve().parent.parent
# The web process runs as deployed (DEBUG off: no query log), on plain HTTP on loopback.
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "bench-only-secret-key",
    # The key the bench's own process derives (DEBUG), so each reads what the other encrypted.
    "FIELD_ENCRYPTION_KEYS": "TgPiMYwE8KRLDh79iBOYzsjhksFrRZiqmgwbjPEP3as=",
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "SECURE_SSL_REDIRECT": "false",
}


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


def batch_template(node: str, gpus: int) -> tuple[str, str]:
    """One agent's telemetry message with a placeholder time, encoded once: an agent then only
    puts the time in, so one process can play a thousand agents."""
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
    text = encode(
        TelemetryBatch(
            samples=[
                GpuSample(
                    gpu_uuid=f"GPU-{node}-{g}",
                    time=placeholder,
                    utilization_pct=round(random.uniform(60, 99), 1),
                    memory_used_mib=40000,
                    memory_total_mib=81920,
                    power_w=300.0,
                    temperature_c=60.0,
                )
                for g in range(gpus)
            ]
        )
    )
    return text, json.dumps(placeholder.isoformat().replace("+00:00", "Z"))


HEARTBEAT = encode(Heartbeat(uptime_s=3600))


class Agent:
    """A simulated agent: a websocket that says hello, then sends a batch of one sample per GPU
    at the given rate, and heartbeats."""

    def __init__(self, url: str, node: str, token: str, gpus: int) -> None:
        self.url, self.node, self.token, self.gpus = url, node, token, gpus
        self.template, self.placeholder = batch_template(node, gpus)
        self.ws: Any = None

    async def connect(self, limit: asyncio.Semaphore) -> None:
        async with limit:
            self.ws = await websockets.connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                max_size=None,
                open_timeout=120,
            )
            await self.ws.send(hello(self.node, self.gpus))
            welcome = decode_from_portal(await self.ws.recv())
            self.heartbeat_interval_s = welcome.heartbeat_interval_s or 10
            await self.ws.recv()  # desired set

    async def stream(self, hz: float, until: float, sent: list[int]) -> None:
        period = 1 / hz
        await asyncio.sleep(random.random() * period)  # agents are not in lockstep
        next_at = time.monotonic()
        heartbeat_at = next_at + random.random() * self.heartbeat_interval_s
        while next_at < until:
            now = json.dumps(datetime.now(UTC).isoformat().replace("+00:00", "Z"))
            await self.ws.send(self.template.replace(self.placeholder, now))
            sent[0] += self.gpus
            if next_at >= heartbeat_at:  # as real agents do, at the interval the portal asked for
                await self.ws.send(HEARTBEAT)
                heartbeat_at += self.heartbeat_interval_s
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def close(self) -> None:
        await self.ws.close()


def cpu_seconds(pid: int) -> float:
    return cpu_seconds_of(Path(f"/proc/{pid}/stat"))


def cpu_seconds_of(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU time of each thread of a process: the web process's event loop against its writers."""
    return {int(task.name): cpu_seconds_of(task / "stat") for task in Path(f"/proc/{pid}/task").iterdir()}


def counters(web_pid: int) -> dict[str, float]:
    """CPU seconds so far of the web process (all threads, its event loop thread, the others),
    of this process (the simulated agents) and of the whole machine."""
    threads = thread_cpu_seconds(web_pid)
    return {
        "at": time.monotonic(),
        "web": cpu_seconds(web_pid),
        "web_loop": threads.pop(web_pid),
        "web_other_threads": sum(threads.values()),
        "bench": cpu_seconds(os.getpid()),
        "machine": machine_busy_seconds(),
    }


def machine_busy_seconds() -> float:
    """CPU time all processes on the machine used (all cores), for context."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


async def watch_lag(redis_url: str, nodes: dict[int, str], until: float, lags: list[float]) -> None:
    """Reads the latest sample of the first GPU of up to 200 nodes ten times a second, in one
    pipeline; a batch's lag is when its sample is first seen minus its time (so up to 0.1 s too
    high)."""
    import redis.asyncio as aioredis

    cache = aioredis.Redis.from_url(redis_url)
    last: dict[int, bytes] = {}
    while time.monotonic() < until:
        async with cache.pipeline(transaction=False) as pipe:
            for node_id, name in nodes.items():
                pipe.hget(f"telemetry:node:{node_id}", f"GPU-{name}-0")
            values = await pipe.execute()
        seen_at = time.time()
        for node_id, raw in zip(nodes, values, strict=True):
            if raw is not None and raw != last.get(node_id):
                last[node_id] = raw
                lags.append(seen_at - datetime.fromisoformat(json.loads(raw)["time"]).timestamp())
        await asyncio.sleep(0.1)
    await cache.aclose()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def logged_errors(output: str) -> int:
    """Errors the web process logged (its JSON log lines at ERROR or worse, and tracebacks), e.g.
    a refused Redis connection while a thousand agents leave at once."""
    count = 0
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                count += json.loads(line).get("level") in ("ERROR", "CRITICAL")
            except ValueError:
                continue
        elif line.startswith("Traceback"):
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hz", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with portal_database() as env:
        from portal.cluster.models import Node
        from portal.jobs.models import TelemetrySample

        tokens = prepare(args.agents, args.gpus)
        nodes = dict(Node.objects.values_list("pk", "name"))
        watched = dict(random.sample(sorted(nodes.items()), min(200, len(nodes))))
        port = free_port()
        web_log = tempfile.TemporaryFile()  # noqa: SIM115 (read back once the web process ends)
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
            env={**env, **PRODUCTION, "LOG_LEVEL": "WARNING"},
            stdout=web_log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: port_open(port), 30, "the web server")
            sent = [0]
            lags: list[float] = []
            figures: dict[str, float] = {}

            async def run() -> None:
                url = f"ws://127.0.0.1:{port}/ws/agent/"
                agents = [Agent(url, node, token, args.gpus) for node, token in tokens.items()]
                started = time.monotonic()
                limit = asyncio.Semaphore(50)
                await asyncio.gather(*(a.connect(limit) for a in agents))
                figures["connect_s"] = time.monotonic() - started
                # Measured from here: every agent is connected and greeted, only telemetry flows.
                figures["streaming_from"] = time.time()
                start = time.monotonic()
                until = start + args.seconds
                before = counters(web.pid)

                async def measure_at_the_end() -> dict[str, Any]:
                    await asyncio.sleep(until - time.monotonic())
                    return counters(web.pid)

                after, *_ = await asyncio.gather(
                    measure_at_the_end(),
                    *(a.stream(args.hz, until, sent) for a in agents),
                    watch_lag(env["REDIS_URL"], watched, until + 2, lags),  # the last samples land
                )
                figures["wall_s"] = after["at"] - before["at"]
                for key in ("web", "web_loop", "web_other_threads", "bench", "machine"):
                    figures[f"{key}_cpu_s"] = after[key] - before[key]
                await asyncio.gather(*(a.close() for a in agents))

            asyncio.run(run())
            # Closing a connection writes what the portal still holds; wait for the last writes.
            deadline = time.monotonic() + 30
            while (stored := TelemetrySample.objects.count()) < sent[0] and time.monotonic() < deadline:
                time.sleep(0.5)
            since = datetime.fromtimestamp(figures["streaming_from"], UTC)
            heard = Node.objects.filter(last_heartbeat_at__gt=since).count()
        finally:
            web.terminate()
            web.wait(timeout=30)
            web_log.seek(0)
            errors = logged_errors(web_log.read().decode(errors="replace"))
            web_log.close()
    wall = figures["wall_s"]
    result: dict[str, Any] = {
        "benchmark": "telemetry",
        "agents": args.agents,
        "gpus_per_agent": args.gpus,
        "hz": args.hz,
        "connect_s": round(figures["connect_s"], 1),
        "seconds": round(wall, 1),
        "samples_sent": sent[0],
        "samples_stored": stored,
        "samples_dropped": max(0, sent[0] - stored),
        "nodes_heartbeat_recorded": heard,
        "lag_p50_s": round(percentile(lags, 0.5), 3),
        "lag_p99_s": round(percentile(lags, 0.99), 3),
        "lag_max_s": round(max(lags), 3) if lags else None,
        "lag_observations": len(lags),
        "web_cpu_share_of_one_core": round(figures["web_cpu_s"] / wall, 3),
        "web_event_loop_thread_share": round(figures["web_loop_cpu_s"] / wall, 3),
        "web_other_threads_share": round(figures["web_other_threads_cpu_s"] / wall, 3),
        "bench_agents_cpu_share_of_one_core": round(figures["bench_cpu_s"] / wall, 3),
        "machine_busy_cores": round(figures["machine_cpu_s"] / wall, 2),
        "web_errors_logged": errors,
        "goal": {"lag_p99_s": 2.0, "samples_dropped": 0, "web_cpu_share_of_one_core": 0.5},
    }
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

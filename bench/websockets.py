"""Browser websockets held by one ASGI process, and how fast job events reach them.

    python -m bench.websockets [--clients 1000] [--rate 1] [--seconds 60] [--json]

One uvicorn process (as deployed, DEBUG off) on private PostgreSQL and Redis. `--clients`
browsers, each with a signed-in session of its own, open /ws/live/ with the site's origin and
subscribe to their tenant's jobs. The bench then changes a job `--rate` times a second through
the portal's own publish path (portal.live.publish.publish_job_change: Redis pub/sub to the web
process's fan-out hub, as the scheduler and the agent gateway send it), so every browser gets `--rate`
messages a second. Delivery latency is from the publish call until a browser has the message
(both ends in this process, one clock). Reports p50/p99 latency, messages missed, connections
lost, and the web process's CPU and memory. Goal (issue #9, anchor W1): p99 <= 250 ms, no
disconnects. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any

import websockets
import websockets.exceptions

from bench.django_setup import portal_database
from bench.portal_stack import (
    PRODUCTION,
    add_bench_cluster,
    cpu_seconds,
    load_average,
    machine_busy_seconds,
    percentile,
    rss_mib,
    start_web,
    stop,
)
from bench.report import print_result
from portal.devstack import free_port


def browser_sessions(username: str, count: int) -> list[str]:
    """Session keys of `count` sign-ins of one user, stored as Django's login() stores them."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import User
    from django.test import override_settings

    user = User.objects.get(username=username)
    store = import_module(settings.SESSION_ENGINE).SessionStore
    keys = []
    # Signed with the web server's key, as its login() would have.
    with override_settings(SECRET_KEY=PRODUCTION["SECRET_KEY"]):
        for _ in range(count):
            session = store()
            session[SESSION_KEY] = str(user.pk)
            session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
            session[HASH_SESSION_KEY] = user.get_session_auth_hash()
            session.create()
            keys.append(session.session_key)
    return keys


def bench_job() -> Any:
    from django.contrib.auth.models import User

    from portal.cluster.models import PriorityClass, VirtualCluster
    from portal.jobs.models import Job

    vc = VirtualCluster.objects.select_related("tenant").get(name="bench")
    pc = PriorityClass.objects.create(name="training", value=500, is_default=True)
    return Job.objects.create(
        tenant=vc.tenant,
        virtual_cluster=vc,
        owner=User.objects.get(username="bench"),
        name="watched",
        spec={"command": ["true"]},
        priority_class=pc,
        priority=500,
        gpu_model="A100",
        gpus_per_replica=1,
        cpu_per_replica=1,
        memory_gb_per_replica=1,
        time_limit_s=3600,
    )


class Browser:
    def __init__(self, url: str, origin: str, session_key: str) -> None:
        self.url, self.origin, self.session_key = url, origin, session_key
        self.ws: Any = None
        self.lost: str | None = None
        self.received = 0

    async def connect(self, limit: asyncio.Semaphore) -> None:
        async with limit:
            self.ws = await websockets.connect(
                self.url,
                additional_headers={"Cookie": f"sessionid={self.session_key}", "Origin": self.origin},
                ping_interval=None,  # browsers answer the server's pings but send none
                open_timeout=120,
                max_size=None,
            )
            await self.ws.send(json.dumps({"subscribe": "jobs"}))
            answer = json.loads(await self.ws.recv())
            if answer.get("subscribed") != "jobs":
                raise SystemExit(f"subscribing failed: {answer}")

    async def listen(self, job_id: int, sent: dict[int, float], latencies: list[float]) -> None:
        try:
            async for text in self.ws:
                now = time.monotonic()
                message = json.loads(text)
                if message.get("kind") == "job" and message.get("job") == job_id:
                    self.received += 1
                    latencies.append(now - sent[message["version"]])
        except websockets.exceptions.ConnectionClosed as exc:
            self.lost = f"{exc.rcvd.code if exc.rcvd else 'no close frame'}"


def publish(job: Any, rate: float, seconds: float, sent: dict[int, float]) -> None:
    """Runs in a thread of its own, as Django code must (publishing checks for a transaction)."""
    from portal.live.publish import publish_job_change

    start = time.monotonic()
    n = 0
    while (planned := start + n / rate) < start + seconds:
        time.sleep(max(0.0, planned - time.monotonic()))
        job.version += 1
        sent[job.version] = time.monotonic()
        publish_job_change(job)  # outside a transaction: sent at once, by the background sender
        n += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.websockets")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=1.0, help="job changes per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    load_before = load_average()
    figures: dict[str, Any] = {}
    latencies: list[float] = []
    sent: dict[int, float] = {}
    with portal_database() as env:
        add_bench_cluster(nodes=1)
        job = bench_job()
        keys = browser_sessions("bench", args.clients)
        port = free_port()
        web = start_web(env, port, workers=1)
        try:

            async def run() -> list[Browser]:
                origin = f"http://127.0.0.1:{port}"
                browsers = [Browser(f"ws://127.0.0.1:{port}/ws/live/", origin, key) for key in keys]
                started = time.monotonic()
                limit = asyncio.Semaphore(50)
                await asyncio.gather(*(b.connect(limit) for b in browsers))
                figures["connect_s"] = time.monotonic() - started
                figures["web_rss_mib_connected"] = rss_mib(web.pid)
                listeners = [asyncio.create_task(b.listen(job.pk, sent, latencies)) for b in browsers]
                cpu, busy, wall = cpu_seconds(web.pid), machine_busy_seconds(), time.monotonic()
                own = time.process_time()
                await asyncio.to_thread(publish, job, args.rate, args.seconds, sent)
                await asyncio.sleep(2)  # the last messages in flight
                figures["wall_s"] = time.monotonic() - wall
                figures["web_cpu_s"] = cpu_seconds(web.pid) - cpu
                figures["client_cpu_s"] = time.process_time() - own
                figures["machine_busy_s"] = machine_busy_seconds() - busy
                figures["web_rss_mib_end"] = rss_mib(web.pid)
                for b in browsers:
                    with contextlib.suppress(Exception):
                        await b.ws.close()
                await asyncio.gather(*listeners, return_exceptions=True)
                return browsers

            browsers = asyncio.run(run())
        finally:
            stop(web)
    published = len(sent)
    expected = published * len(browsers)
    received = sum(b.received for b in browsers)
    lost = [b.lost for b in browsers if b.lost is not None]
    wall = figures["wall_s"]
    result: dict[str, Any] = {
        "benchmark": "websockets",
        "clients": args.clients,
        "rate_per_client_per_s": args.rate,
        "seconds": args.seconds,
        "connect_s": round(figures["connect_s"], 1),
        "published": published,
        "messages_expected": expected,
        "messages_received": received,
        "messages_missed": expected - received,
        "delivered_per_s": round(received / wall, 1),
        "latency_p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "latency_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "latency_max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "disconnects": len(lost),
        "disconnect_codes": sorted(set(lost)),
        "web_cpu_share_of_one_core": round(figures["web_cpu_s"] / wall, 3),
        "client_cpu_share_of_one_core": round(figures["client_cpu_s"] / wall, 3),
        "web_rss_mib_connected": round(figures["web_rss_mib_connected"], 1),
        "web_rss_mib_end": round(figures["web_rss_mib_end"], 1),
        "machine_busy_cores": round(figures["machine_busy_s"] / wall, 2),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "goal": {"latency_p99_ms": 250, "disconnects": 0},
    }
    result["goals_met"] = {
        "latency_p99_ms": result["latency_p99_ms"] <= 250,
        "disconnects": not lost and result["messages_missed"] == 0,
    }
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

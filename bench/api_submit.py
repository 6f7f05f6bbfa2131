"""REST job submission under load, against a bare DRF create endpoint of the same shape.

    python -m bench.api_submit [--clients 16] [--seconds 15] [--workers 2] [--json]

The web server runs as deployed (uvicorn, `--workers 2`, DEBUG off) on private PostgreSQL and
Redis with the demo cluster; one user submits over a bearer token. For each endpoint:

- saturation: `--clients` keep-alive connections, each sending the next request as soon as the
  last is answered, for `--seconds`; submissions per second and latency;
- 70 % of that rate offered at a fixed pace for `--seconds`; latency from each request's planned
  time (so queueing behind a slow answer counts).

The baseline (bench/bare: a model with the spec's fields, a ModelSerializer, a CreateAPIView,
with the portal's settings, authentication and middleware) runs the same two phases in the same
run. Then the bulk endpoint: two clients posting arrays of `--array` jobs (a list of specs, and
one spec with `array`), jobs stored per second. Goals (issue #9, performance anchors A1, A2):
ratio >= 0.6, p99 <= 50 ms at 70 % of saturation, bulk >= 1,000 jobs/s. Prints one JSON object
last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from typing import Any

from bench.django_setup import REPO, portal_database
from bench.portal_stack import (
    closed_loop,
    cpu_seconds,
    load_average,
    machine_busy_seconds,
    open_loop,
    post_request,
    process_tree,
    start_web,
    stop,
)
from bench.report import print_result
from portal.devstack import free_port

SPEC = {"name": "bench", "vc": "vision", "flavor": "s-A100", "command": ["python", "train.py"]}
ENDPOINTS = {
    "portal": ("portal.settings", "/api/v1/jobs/"),
    "bare": ("bench.bare.settings", "/bench/bare-jobs/"),
}


def tree_cpu(pid: int) -> float:
    total = 0.0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


def measure_endpoint(
    env: dict[str, str], name: str, token: str, args: argparse.Namespace, bulk: bool
) -> dict[str, Any]:
    settings_module, path = ENDPOINTS[name]
    port = free_port()
    web = start_web({**env, "DJANGO_SETTINGS_MODULE": settings_module}, port, workers=args.workers)
    headers = {"Authorization": f"Bearer {token}"}
    raw = post_request(path, SPEC, headers)
    out: dict[str, Any] = {}
    try:
        asyncio.run(closed_loop("127.0.0.1", port, raw, args.clients, args.warmup))  # warm caches
        cpu, busy = tree_cpu(web.pid), machine_busy_seconds()
        saturation = asyncio.run(closed_loop("127.0.0.1", port, raw, args.clients, args.seconds))
        web_cpu, machine = tree_cpu(web.pid) - cpu, machine_busy_seconds() - busy
        out["saturation"] = saturation.summary(201)
        ok = max(1, saturation.statuses.get(201, 0))
        out["saturation"]["web_cpu_ms_per_request"] = round(web_cpu / ok * 1000, 2)
        out["saturation"]["machine_busy_cores"] = round(machine / saturation.seconds, 2)
        rate = 0.7 * out["saturation"]["per_s"]
        at70 = asyncio.run(open_loop("127.0.0.1", port, raw, rate, args.seconds))
        out["at_70pct"] = {"offered_per_s": round(rate, 1), **at70.summary(201)}
        if bulk:
            out["bulk"] = measure_bulk(port, headers, args)
    finally:
        stop(web)
    return out


def measure_bulk(port: int, headers: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    bodies = {
        "list": {"jobs": [{**SPEC, "name": f"bulk-{i}"} for i in range(args.array)]},
        "array": {"job": SPEC, "array": args.array},
    }
    out: dict[str, Any] = {}
    for form, body in bodies.items():
        raw = post_request("/api/v1/jobs/bulk/", body, headers)
        asyncio.run(closed_loop("127.0.0.1", port, raw, 1, 2))  # warm
        result = asyncio.run(closed_loop("127.0.0.1", port, raw, 2, args.seconds))
        summary = result.summary(201)
        out[form] = {
            "jobs_per_request": args.array,
            "requests": summary["requests"],
            "statuses": summary["statuses"],
            "jobs_per_s": round(summary["ok"] * args.array / result.seconds, 1),
            "request_p50_ms": summary["p50_ms"],
            "request_p99_ms": summary["p99_ms"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_submit")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers (docker-compose runs 2)")
    parser.add_argument("--array", type=int, default=500, help="jobs per bulk request")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load_before = load_average()
    started = time.monotonic()
    with portal_database() as env:
        from bench.portal_stack import api_token
        from portal.demo import seed_demo
        from portal.jobs.models import Job

        seed_demo()
        token = api_token("alice")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--run-syncdb", "--no-input", "-v", "0"],
            cwd=REPO,
            env={**env, "DJANGO_SETTINGS_MODULE": "bench.bare.settings"},
            check=True,
        )
        bare = measure_endpoint(env, "bare", token, args, bulk=False)
        portal = measure_endpoint(env, "portal", token, args, bulk=True)
        stored = Job.objects.count()
    ratio = portal["saturation"]["per_s"] / bare["saturation"]["per_s"] if bare["saturation"]["per_s"] else 0
    result: dict[str, Any] = {
        "benchmark": "api_submit",
        "clients": args.clients,
        "seconds": args.seconds,
        "web_workers": args.workers,
        "submissions_per_s": portal["saturation"]["per_s"],
        "baseline_per_s": bare["saturation"]["per_s"],
        "ratio": round(ratio, 3),
        "p99_ms_at_70pct": portal["at_70pct"]["p99_ms"],
        "baseline_p99_ms_at_70pct": bare["at_70pct"]["p99_ms"],
        "bulk_jobs_per_s": portal["bulk"]["list"]["jobs_per_s"],
        "bulk_array_jobs_per_s": portal["bulk"]["array"]["jobs_per_s"],
        "portal": portal,
        "bare": bare,
        "jobs_stored": stored,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_s": round(time.monotonic() - started, 1),
        "goal": {"ratio": 0.6, "p99_ms_at_70pct": 50, "bulk_jobs_per_s": 1000},
    }
    result["goals_met"] = {
        "ratio": result["ratio"] >= 0.6,
        "p99_ms_at_70pct": result["p99_ms_at_70pct"] <= 50,
        "bulk_jobs_per_s": result["bulk_jobs_per_s"] >= 1000,
    }
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

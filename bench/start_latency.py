"""Submit-to-running latency on an idle demo cluster: the real web server, Celery worker and beat,
and four simulated agents running jobs as processes.

    python -m bench.start_latency [--jobs 40] [--json]

Jobs are submitted one at a time over the REST API; each one's latency is the time from the
submit request until the portal records it running (all replicas reported running by their
agents). Goal (the Kubernetes pod-startup objective): p50 <= 0.5 s, p99 <= 5 s. Prints one JSON
object last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.report import print_result
from portal.devstack import free_port, private_services, start_demo_cluster


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.start_latency")
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="gpuportal-bench-"))
    latencies: list[float] = []
    stages: dict[str, list[float]] = {"to_scheduled": [], "to_starting": [], "to_running": []}
    with private_services() as services:
        env = {**os.environ, **services.env, "DEBUG": "true"}
        supervisor = start_demo_cluster(env, run_dir, "127.0.0.1", port, quiet=True)
        try:
            base = f"http://127.0.0.1:{port}"
            client = httpx.Client(base_url=base, timeout=30)
            csrf = client.get("/api/v1/session/").cookies.get("csrftoken", "")
            signed_in = client.post(
                "/api/v1/session/",
                json={"username": "alice", "password": "alice-pass"},
                headers={"X-CSRFToken": csrf},
            )
            signed_in.raise_for_status()
            token = client.post(
                "/api/v1/tokens/",
                json={"name": "bench"},
                headers={"X-CSRFToken": client.cookies["csrftoken"]},
            ).json()["token"]
            api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            wait_for_ready_nodes(api, 4)
            for i in range(args.jobs):
                spec = {
                    "name": f"latency-{i}",
                    "vc": "vision",
                    "flavor": "s-A100" if i % 2 else "s-V100",
                    "command": ["sleep", "0.2"],
                }
                latency, job_id = measure_one(api, spec)
                latencies.append(latency)
                for stage, seconds in stage_times(api, job_id).items():
                    stages[stage].append(seconds)
        finally:
            supervisor.stop()
    result: dict[str, Any] = {
        "benchmark": "start_latency",
        "jobs": len(latencies),
        "p50_s": round(percentile(latencies, 0.5), 3),
        "p99_s": round(percentile(latencies, 0.99), 3),
        "mean_s": round(statistics.fmean(latencies), 3),
        "max_s": round(max(latencies), 3),
        # Where the time goes, from the job's events: submit -> scheduled (the cycle), scheduled ->
        # starting (desired set to the agent, its first report), starting -> running.
        "median_stage_s": {stage: round(statistics.median(v), 3) for stage, v in stages.items() if v},
        "goal_p50_s": 0.5,
        "goal_p99_s": 5.0,
    }
    print_result(result, args.json)
    return 0


def wait_for_ready_nodes(api: httpx.Client, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = api.get("/api/v1/nodes/").json()["results"]
        if sum(node["state"] == "ready" for node in nodes) >= count:
            return
        time.sleep(0.2)
    raise SystemExit("the demo agents did not connect")


def measure_one(api: httpx.Client, spec: dict[str, Any], timeout: float = 60) -> tuple[float, int]:
    """Seconds from the submit request to the job's 'running' event."""
    started = time.monotonic()
    response = api.post("/api/v1/jobs/", json=spec)
    response.raise_for_status()
    job_id = response.json()["id"]
    while time.monotonic() - started < timeout:
        state = api.get(f"/api/v1/jobs/{job_id}/").json()["state"]
        if state in ("running", "succeeded", "failed"):
            if state != "running":  # it ran and ended between two polls; take the events' times
                return event_times(api, job_id)["running"] - event_times(api, job_id)["pending"], job_id
            return time.monotonic() - started, job_id
        time.sleep(0.02)
    raise SystemExit(f"job {job_id} did not start within {timeout} s")


def event_times(api: httpx.Client, job_id: int) -> dict[str, float]:
    events = api.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]
    return {
        e["to_state"]: datetime.fromisoformat(e["created_at"]).timestamp() for e in events if e["to_state"]
    }


def stage_times(api: httpx.Client, job_id: int) -> dict[str, float]:
    times = event_times(api, job_id)
    order = [
        ("to_scheduled", "pending", "scheduled"),
        ("to_starting", "scheduled", "starting"),
        ("to_running", "starting", "running"),
    ]
    return {name: times[b] - times[a] for name, a, b in order if a in times and b in times}


if __name__ == "__main__":
    sys.exit(main())

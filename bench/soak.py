"""Soak: steady submissions while simulated agents run the jobs; nothing may be lost or leak.

    python -m bench.soak [--minutes 10] [--rate 200] [--agents 100] [--job-seconds 2] [--json]

The portal runs as deployed (uvicorn with two workers, a Celery worker and beat; DEBUG off) on
private PostgreSQL and Redis. `--agents` simulated agents (bench/sim_agents.py: the real
protocol, eight A100s each, no job processes) run every job they are given for
`--job-seconds` and report it succeeded. One user submits `--rate` 1-GPU jobs a second over REST
for `--minutes`; then the bench waits (up to `--drain` seconds) for the jobs to end.

Reports submissions accepted and refused, jobs lost (accepted but not succeeded once drained;
goal 0) with the states they were left in, the throughput reached, submit latency, ERROR lines
in the portal's logs, and the memory (RSS) of each portal process at the start, its peak and
the end. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.django_setup import portal_database
from bench.portal_stack import (
    PRODUCTION,
    VENV_BIN,
    LoadResult,
    add_bench_cluster,
    api_token,
    command_name,
    cpu_seconds,
    load_average,
    open_loop,
    post_request,
    postmaster_pid,
    process_tree,
    rss_mib,
    start,
    start_web,
    stop,
)
from bench.report import print_result
from bench.sim_agents import SimAgent
from portal.devstack import free_port

SPEC = {
    "name": "soak",
    "vc": "bench",
    "resources": {"gpus": 1, "gpu_model": "A100", "cpu": 1, "memory_gb": 1},
    "command": ["python", "step.py"],
}


# As portal.jobs.choices.TERMINAL_STATES; "lost" is not terminal (a lost job is requeued).
TERMINAL_STATES = ("succeeded", "failed", "cancelled", "timed-out")
LOST_STATES = ("failed", "cancelled", "timed-out")


class MemoryWatch:
    """RSS of every process of the portal (web workers, Celery pool children, beat), sampled."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self.samples: dict[int, list[float]] = {}
        self.cpu: dict[int, list[float]] = {}
        self.names: dict[int, str] = {}

    def sample(self) -> None:
        for role, root in self.roots.items():
            for pid in process_tree(root):
                try:
                    rss, cpu = rss_mib(pid), cpu_seconds(pid)
                    self.names.setdefault(pid, f"{role}: {command_name(pid)[:60]}")
                except OSError:
                    continue
                self.samples.setdefault(pid, []).append(rss)
                self.cpu.setdefault(pid, []).append(cpu)

    def report(self) -> list[dict[str, Any]]:
        """Per portal process: RSS at the start, peak, middle and end; CPU used over the run."""
        rows = []
        for pid, values in self.samples.items():
            if self.names[pid].startswith("postgres"):
                continue
            rows.append(
                {
                    "pid": pid,
                    "process": self.names[pid],
                    "rss_mib_start": round(values[0], 1),
                    "rss_mib_mid": round(values[len(values) // 2], 1),
                    "rss_mib_peak": round(max(values), 1),
                    "rss_mib_end": round(values[-1], 1),
                    "growth_mib": round(values[-1] - values[0], 1),
                    "growth_second_half_mib": round(values[-1] - values[len(values) // 2], 1),
                    "cpu_s": round(self.cpu[pid][-1] - self.cpu[pid][0], 1),
                    "samples": len(values),
                }
            )
        return sorted(rows, key=lambda r: r["process"])

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds used over the run by each role (PostgreSQL: all its backends)."""
        totals: dict[str, float] = {}
        for pid, values in self.cpu.items():
            role = self.names[pid].split(":")[0]
            totals[role] = round(totals.get(role, 0.0) + values[-1] - values[0], 1)
        return totals


def job_states() -> dict[str, int]:
    """The soak jobs (every job of the bench VC) by state."""
    from django.db.models import Count

    from portal.jobs.models import Job

    rows = Job.objects.filter(virtual_cluster__name="bench").values("state").annotate(n=Count("id"))
    return {row["state"]: row["n"] for row in rows}


def error_lines(log_dir: Path) -> dict[str, Any]:
    """ERROR lines and tracebacks in each portal process's output, with the first few (a
    traceback by its last line, the exception)."""
    counts: dict[str, Any] = {}
    for log in sorted(log_dir.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        found = []
        for i, line in enumerate(lines):
            if '"level": "ERROR"' in line:
                found.append(line)
            elif line.startswith("Traceback"):
                end = i + 1
                while end < len(lines) and lines[end].startswith((" ", "\t")):
                    end += 1
                found.append(f"Traceback: {lines[end] if end < len(lines) else '?'}")
        counts[log.stem] = {"count": len(found), "first": [line[:300] for line in found[:3]]}
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0, help="submissions per second")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--job-seconds", type=float, default=2.0)
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait for the last jobs")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers (docker-compose runs 2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load_before = load_average()
    log_dir = Path(tempfile.mkdtemp(prefix="gpuportal-soak-"))
    errors: dict[str, Any] | None = None
    accepted: list[int] = []
    figures: dict[str, Any] = {}
    with portal_database() as env:
        from portal.demo import seed_demo

        seed_demo()
        tokens = add_bench_cluster(args.agents)
        token = api_token("bench")
        port = free_port()
        portal_env = {**env, **PRODUCTION}
        web = start_web(env, port, workers=args.workers, log=log_dir / "web.log")
        worker = start(
            [str(VENV_BIN / "celery"), "-A", "portal", "worker", "-l", "warning", "--concurrency", "2"],
            portal_env,
            log_dir / "worker.log",
        )
        beat = start(
            [str(VENV_BIN / "celery"), "-A", "portal", "beat", "-l", "warning", "-s", str(log_dir / "beat")],
            portal_env,
            log_dir / "beat.log",
        )
        roots = {"web": web.pid, "worker": worker.pid, "beat": beat.pid}
        postgres = postmaster_pid(int(env["DATABASE_URL"].rsplit(":", 1)[1].split("/")[0]))
        if postgres is not None:
            roots["postgres"] = postgres
        memory = MemoryWatch(roots)
        try:

            async def run() -> LoadResult:
                url = f"ws://127.0.0.1:{port}/ws/agent/"
                agents = [
                    SimAgent(url, node, tok, job_seconds=args.job_seconds) for node, tok in tokens.items()
                ]
                runs = [asyncio.create_task(a.run()) for a in agents]
                await wait_for_ready_nodes(args.agents)
                raw = post_request("/api/v1/jobs/", SPEC, {"Authorization": f"Bearer {token}"})
                memory.sample()

                async def watch(until: float) -> None:
                    while time.monotonic() < until:
                        await asyncio.sleep(10)
                        await asyncio.to_thread(memory.sample)

                seconds = args.minutes * 60
                began, own = time.monotonic(), time.process_time()
                watcher = asyncio.create_task(watch(began + seconds))

                def keep_id(status: int, body: bytes) -> None:
                    if status == 201:
                        accepted.append(json.loads(body)["id"])

                load = await open_loop(
                    "127.0.0.1", port, raw, args.rate, seconds, on_answer=keep_id, shed=True
                )
                figures["submit_s"] = time.monotonic() - began
                watcher.cancel()
                deadline = time.monotonic() + args.drain
                while time.monotonic() < deadline:
                    states = await asyncio.to_thread(job_states)
                    if sum(n for s, n in states.items() if s in TERMINAL_STATES) >= len(accepted):
                        break
                    await asyncio.sleep(2)
                figures["drain_s"] = time.monotonic() - began - figures["submit_s"]
                figures["all_done_s"] = time.monotonic() - began
                memory.sample()
                figures["bench_cpu_s"] = time.process_time() - own
                figures["agents"] = {
                    key: sum(a.counts[key] for a in agents)
                    for key in ("started", "succeeded", "stopped", "connections", "dropped")
                }
                figures["drops"] = {}
                for a in agents:
                    for reason, n in a.drops.items():
                        figures["drops"][reason] = figures["drops"].get(reason, 0) + n
                for a in agents:
                    await a.stop()
                await asyncio.gather(*runs, return_exceptions=True)
                return load

            load = asyncio.run(run())
            errors = error_lines(log_dir)  # before the processes are stopped (a stop logs its own)
            states = job_states()
            figures["ended_per_s"] = ended_rate()
            figures["stored_of_accepted"] = stored_of(accepted)
            figures["stages"] = stage_seconds()
        finally:
            for proc in (web, worker, beat):
                stop(proc)
            # The logs are kept when they hold errors, so that a rare one can be read afterwards.
            if errors is None or any(e["count"] for e in errors.values()):
                print(f"logs kept in {log_dir}", file=sys.stderr)
            else:
                shutil.rmtree(log_dir, ignore_errors=True)
    summary = load.summary(201)
    succeeded = states.get("succeeded", 0)
    result: dict[str, Any] = {
        "benchmark": "soak",
        "minutes": args.minutes,
        "rate_offered_per_s": args.rate,
        "agents": args.agents,
        "job_seconds": args.job_seconds,
        "due": summary["requests"] + summary["errors"] + load.shed,
        "not_sent_server_busy": load.shed,
        "accepted": len(accepted),
        "refused": {k: v for k, v in summary["statuses"].items() if k != "201"},
        "connection_errors": summary["errors"],
        "accepted_per_s": round(len(accepted) / figures["submit_s"], 1),
        "submit_p50_ms": summary["p50_ms"],
        "submit_p99_ms": summary["p99_ms"],
        "accepted_and_stored": figures["stored_of_accepted"],
        "stored_not_acknowledged": sum(states.values()) - figures["stored_of_accepted"],
        "jobs_succeeded": succeeded,
        # Lost: accepted but not stored, or ended other than succeeded (the agents run every job
        # to success); unfinished: still queued or running when the drain time ran out.
        "jobs_lost": len(accepted)
        - figures["stored_of_accepted"]
        + sum(n for state, n in states.items() if state in LOST_STATES),
        "jobs_unfinished": sum(n for state, n in states.items() if state not in TERMINAL_STATES),
        "states_at_end": states,
        "drain_s": round(figures["drain_s"], 1),
        "jobs_ended_per_s": figures["ended_per_s"],
        "time_to_reach_state": figures["stages"],
        "agents_counts": figures["agents"],
        "agent_connections_lost": figures["drops"],
        "error_log_lines": errors,
        "memory": memory.report(),
        "cpu_s_by_process_kind": {
            **memory.cpu_by_role(),
            "bench (agents, submitter)": round(figures["bench_cpu_s"], 1),
        },
        "wall_s": round(figures["all_done_s"], 1),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "goal": {"jobs_lost": 0, "rate_per_s": args.rate},
    }
    print_result(result, args.json)
    return 0


async def wait_for_ready_nodes(count: int, timeout: float = 120) -> None:
    from portal.cluster.models import Node

    def ready() -> int:
        return Node.objects.filter(state="ready", name__startswith="bench-").count()

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(ready) >= count:
            return
        await asyncio.sleep(0.5)
    raise SystemExit("the simulated agents did not all connect")


def ended_rate() -> float:
    """Soak jobs that ended per second, over the span from the first end to the last."""
    from django.db.models import Count, Max, Min

    from portal.jobs.models import Job

    span = Job.objects.filter(virtual_cluster__name="bench", finished_at__isnull=False).aggregate(
        first=Min("finished_at"), last=Max("finished_at"), n=Count("id")
    )
    if not span["n"] or span["first"] == span["last"]:
        return 0.0
    return round(span["n"] / (span["last"] - span["first"]).total_seconds(), 1)


def stage_seconds() -> dict[str, dict[str, float]]:
    """For each state, how long the soak jobs took to reach it from their previous event (p50,
    p99): where a job's time goes, from submission to success."""
    from django.db import connection

    sql = """
        SELECT to_state, percentile_cont(0.5) WITHIN GROUP (ORDER BY d),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY d), count(*)
        FROM (
            SELECT e.to_state, extract(epoch FROM e.created_at - lag(e.created_at)
                   OVER (PARTITION BY e.job_id ORDER BY e.id)) AS d
            FROM jobs_jobevent e JOIN jobs_job j ON j.id = e.job_id
            JOIN cluster_virtualcluster v ON v.id = j.virtual_cluster_id
            WHERE v.name = 'bench'
        ) AS steps
        WHERE d IS NOT NULL
        GROUP BY to_state
    """
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return {
            state: {"p50_s": round(p50, 3), "p99_s": round(p99, 3), "events": n}
            for state, p50, p99, n in cursor.fetchall()
        }


def stored_of(ids: list[int]) -> int:
    from portal.jobs.models import Job

    stored = 0
    for i in range(0, len(ids), 10_000):
        stored += Job.objects.filter(pk__in=ids[i : i + 10_000]).count()
    return stored


if __name__ == "__main__":
    sys.exit(main())

"""CPU per submission in one process, for the portal's endpoint and the bare DRF create endpoint.

    python -m bench.submit_cpu [--requests 400] [--profile portal|bare] [--top 30] [--json]

bench.api_submit measures throughput with uvicorn and a load generator on the same cores, so
its figures move with whatever else the machine runs. This one sends the same requests one
after another through the real ASGI application (portal.asgi, with the settings the web server
runs with: DEBUG off, the connection pool) inside one process, and reports CPU time, not wall
time: the process's own (every thread, so the background sender of browser hints counts) and
PostgreSQL's (its backends are children of the private server). Statements per request are
counted on one more request. The cyclic garbage collector's passes during the measured requests
are timed too (CPU time of the thread that ran each pass; their total per request and the
longest), since one long pass stalls every request the process holds. With `--profile`, a
cProfile of the same requests through Django's WSGI handler (one thread, so the profiler sees all
of the view) follows, sorted by own time and by cumulative time.

The numbers are CPU, so they hold on a busy machine, within a few per cent; the ratio of the two
endpoints is what bench.api_submit's throughput ratio tends to when the web server is the
bottleneck. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from bench.api_submit import ENDPOINTS, SPEC
from bench.django_setup import REPO, portal_database
from bench.portal_stack import PRODUCTION, WEB_ENV, cpu_seconds, postmaster_pid, process_tree
from bench.report import print_result

TOKEN_ENV = "BENCH_API_TOKEN"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.submit_cpu")
    parser.add_argument("--requests", type=int, default=400, help="measured requests per endpoint")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4, help="turns of the two endpoints")
    parser.add_argument("--profile", choices=sorted(ENDPOINTS), help="also profile this endpoint")
    parser.add_argument("--top", type=int, default=30, help="rows of each profile table")
    parser.add_argument("--profile-out", help="also write the profile to this file (for pstats)")
    parser.add_argument("--statements", action="store_true", help="list the SQL of one request")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args(argv)
    if args.measure:
        return measure(args)
    with portal_database() as env:
        from bench.portal_stack import api_token
        from portal.demo import seed_demo

        seed_demo()
        token = api_token("alice")
        bare_env = {**env, "DJANGO_SETTINGS_MODULE": "bench.bare.settings"}
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--run-syncdb", "--no-input", "-v", "0"],
            cwd=REPO,
            env=bare_env,
            check=True,
        )
        # The measurement runs in a process of its own, with the web server's settings; the
        # bare settings mount both endpoints.
        child = [sys.executable, "-m", "bench.submit_cpu", "--measure", *(argv or sys.argv[1:])]
        done = subprocess.run(child, cwd=REPO, env={**bare_env, **PRODUCTION, **WEB_ENV, TOKEN_ENV: token})
    return done.returncode


# ------------------------------------------------------------------ the child


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def database_cpu() -> float:
    port = urlsplit(os.environ["DATABASE_URL"]).port
    pid = postmaster_pid(port) if port else None
    total = 0.0
    for p in process_tree(pid) if pid else []:
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


def asgi_scope(path: str, body: bytes, token: str) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"authorization", f"Bearer {token}".encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }


async def asgi_post(app: Any, path: str, body: bytes, token: str) -> int:
    """One request through the ASGI application as uvicorn would hand it over; returns the status."""
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never goes away; Django cancels this wait
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(asgi_scope(path, body, token), receive, send)
    return status


def wsgi_post(handler: Any, path: str, body: bytes, token: str) -> str:
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
    }
    status = ""

    def start_response(line: str, headers: Any) -> None:
        nonlocal status
        status = line

    b"".join(handler(environ, start_response))
    return status


def count_statements(path: str, body: bytes, token: str) -> list[str]:
    from django.core.handlers.wsgi import WSGIHandler
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        wsgi_post(WSGIHandler(), path, body, token)
    return [query["sql"] for query in queries]


def measure_endpoints(app: Any, body: bytes, token: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both endpoints in turns (`--rounds`), so that a change in the machine's speed during the
    run weighs on both alike."""

    async def run(path: str, n: int) -> dict[int, int]:
        statuses: dict[int, int] = {}
        for _ in range(n):
            status = await asgi_post(app, path, body, token)
            statuses[status] = statuses.get(status, 0) + 1
        return statuses

    per_round = max(1, args.requests // args.rounds)
    totals = {name: {"cpu": 0.0, "db": 0.0, "wall": 0.0, "statuses": {}} for name in ENDPOINTS}
    pauses: dict[str, list[float]] = {name: [] for name in ENDPOINTS}
    collecting: list[str] = []  # the endpoint being measured, while one is
    started = [0.0]

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        elif collecting:
            pauses[collecting[0]].append(time.thread_time() - started[0])

    gc.callbacks.append(on_collection)
    for _, path in ENDPOINTS.values():
        asyncio.run(run(path, args.warmup))
    for _ in range(args.rounds):
        for name, (_, path) in ENDPOINTS.items():
            time.sleep(0.5)  # the background sender finishes the last requests' hints
            cpu, db, wall = process_cpu(), database_cpu(), time.perf_counter()
            collecting.append(name)
            statuses = asyncio.run(run(path, per_round))
            collecting.clear()
            time.sleep(0.5)
            total = totals[name]
            total["cpu"] += process_cpu() - cpu
            total["db"] += database_cpu() - db
            total["wall"] += time.perf_counter() - wall - 0.5
            for status, count in statuses.items():
                total["statuses"][str(status)] = total["statuses"].get(str(status), 0) + count
    gc.callbacks.remove(on_collection)
    results = {}
    for name, (_, path) in ENDPOINTS.items():
        total, n = totals[name], per_round * args.rounds
        statements = count_statements(path, body, token)
        results[name] = {
            "requests": n,
            "statuses": total["statuses"],
            "web_cpu_ms_per_request": round(total["cpu"] / n * 1000, 2),
            "db_cpu_ms_per_request": round(total["db"] / n * 1000, 2),
            "wall_ms_per_request": round(total["wall"] / n * 1000, 2),
            "gc_ms_per_request": round(sum(pauses[name]) / n * 1000, 3),
            "gc_longest_pause_ms": round(max(pauses[name], default=0.0) * 1000, 2),
            "statements_per_request": len(statements),
            "statements": statements if args.statements else None,
        }
    return results


def profile_endpoint(path: str, body: bytes, token: str, args: argparse.Namespace) -> None:
    from django.core.handlers.wsgi import WSGIHandler

    from portal.lib import channels

    # The profiler sees every thread and mixes up their stacks: the background sender's messages
    # are held back meanwhile (its CPU counts in the figures above, not here).
    held: list[Any] = []
    channels._sender.send = held.extend
    handler = WSGIHandler()
    for _ in range(args.warmup):
        wsgi_post(handler, path, body, token)
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    for _ in range(args.requests):
        wsgi_post(handler, path, body, token)
    profiler.disable()
    if args.profile_out:
        profiler.dump_stats(args.profile_out)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    print(f"\n== {path}: {args.requests} requests, CPU seconds under the profiler", file=out)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue(), file=sys.stderr)


def measure(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from portal.asgi import application

    token = os.environ[TOKEN_ENV]
    body = json.dumps(SPEC).encode()
    load_before = os.getloadavg()
    results = measure_endpoints(application, body, token, args)
    portal, bare = results["portal"], results["bare"]
    result = {
        "benchmark": "submit_cpu",
        **results,
        "web_cpu_ratio": round(bare["web_cpu_ms_per_request"] / portal["web_cpu_ms_per_request"], 3),
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
    }
    if args.profile:
        profile_endpoint(ENDPOINTS[args.profile][1], body, token, args)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

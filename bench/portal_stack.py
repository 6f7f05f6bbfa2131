"""What the load benchmarks (api_submit, websockets, soak) share: the web server started as it is
deployed, per-process CPU and memory readings, a cheap HTTP/1.1 client for load generation, and
bench data (users with API tokens, many nodes with agent tokens)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from portal.devstack import port_open, wait_until

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# The processes run as deployed (DEBUG off: no query log), on plain HTTP on loopback.
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "bench-only-secret-key",
    # The key the bench's own process derives (DEBUG), so each reads what the other encrypted.
    "FIELD_ENCRYPTION_KEYS": "TgPiMYwE8KRLDh79iBOYzsjhksFrRZiqmgwbjPEP3as=",
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "SECURE_SSL_REDIRECT": "false",
    "SESSION_COOKIE_SECURE": "false",
    "CSRF_COOKIE_SECURE": "false",
    "LOG_LEVEL": "WARNING",
    # Load from one user would otherwise meet the per-user submit limit (600/min) at once.
    "THROTTLE_SUBMIT": "100000000/min",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def web_command(port: int, workers: int) -> list[str]:
    """The web server's command from docker-compose.yml (uvicorn, ASGI), on loopback."""
    command = [str(VENV_BIN / "uvicorn"), "portal.asgi:application", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--lifespan", "off", "--proxy-headers"]
    return command + (["--workers", str(workers)] if workers > 1 else [])


def start(command: list[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen[bytes]:
    """A long-lived process in its own process group; its output goes to `log` or nowhere."""
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
    try:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        if log is not None:
            out.close()


# The web server's own settings in docker-compose.yml.
WEB_ENV = {"DATABASE_POOL_SIZE": "16"}


def start_web(
    env: dict[str, str], port: int, workers: int = 1, log: Path | None = None
) -> subprocess.Popen[bytes]:
    web = start(web_command(port, workers), {**env, **PRODUCTION, **WEB_ENV}, log)
    wait_until(lambda: port_open(port), 60, "the web server")
    return web


def stop(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def process_tree(pid: int) -> list[int]:
    """The process and all its descendants (uvicorn's and Celery's worker children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def command_name(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return " ".join(a.decode(errors="replace") for a in args[:6] if a)


def postmaster_pid(port: int) -> int | None:
    """The PostgreSQL server listening on `port` (its backends are its children)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and args[0].endswith("postgres") and str(port) in args and "-p" in args:
            return int(cmdline.parent.name)
    return None


def load_average() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def machine_busy_seconds() -> float:
    """CPU time all processes on the machine used (all cores), for context."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ bench data


def api_token(username: str) -> str:
    from django.contrib.auth.models import User

    from portal.accounts.services import create_api_token

    return create_api_token(User.objects.get(username=username), "bench")[1]


def add_bench_cluster(nodes: int, gpus: int = 8, tenant: str = "bench") -> dict[str, str]:
    """A tenant with one member (user `tenant`), a VC whose quota covers `nodes` x `gpus` A100,
    and the nodes with agent tokens; returns {node name: token}."""
    import random

    from django.contrib.auth.models import User

    from portal.accounts.choices import Role
    from portal.accounts.models import Membership, Tenant, hash_secret
    from portal.cluster.models import Node, Quota, VirtualCluster

    user = User.objects.create(username=tenant)
    team = Tenant.objects.create(name=tenant)
    Membership.objects.create(user=user, tenant=team, role=Role.MEMBER)
    vc = VirtualCluster.objects.create(name=tenant, tenant=team)
    Quota.objects.create(virtual_cluster=vc, gpu_model="A100", guaranteed=nodes * gpus)
    tokens = {f"{tenant}-{i:04d}": f"gpp_bench_{i:04d}_{random.getrandbits(64):x}" for i in range(nodes)}
    created = Node.objects.bulk_create(
        [
            Node(name=name, rack=f"r{i // 16}", token_hash=hash_secret(token), cpu=256, memory_gb=2048)
            for i, (name, token) in enumerate(tokens.items())
        ]
    )
    add_a100_gpus(created, gpus)
    return tokens


def add_a100_gpus(nodes: list[Any], per_node: int) -> None:
    """`per_node` 80 GB A100s on each node, two to a PCIe switch and four to a NUMA node."""
    from portal.cluster.models import Gpu

    Gpu.objects.bulk_create(
        [
            Gpu(
                node=node,
                index=g,
                uuid=f"GPU-{node.name}-{g}",
                model="A100",
                memory_mb=81920,
                pcie_switch=g // 2,
                numa_node=g // 4,
            )
            for node in nodes
            for g in range(per_node)
        ]
    )


# ------------------------------------------------------------------ HTTP load


class HttpConnection:
    """One keep-alive HTTP/1.1 connection that sends prepared requests: a few microseconds of
    client CPU per request, so the load generator leaves the cores to the server."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        reused = self.writer is not None
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None and self.writer is not None
        self.writer.write(raw)
        first = await self.reader.readline()
        if not first and reused:
            # The server closed the idle connection (keep-alive timeout) before reading the
            # request: nothing was done, so send it again on a new connection.
            await self.close()
            return await self.request(raw)
        status = int(first.split()[1])
        length, chunked, close = 0, False, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and "close" in value.lower():
                close = True
        if chunked:
            body = b""
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                body += await self.reader.readexactly(size + 2)
            await self.reader.readline()
        else:
            body = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def post_request(path: str, body: Any, headers: dict[str, str]) -> bytes:
    data = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class LoadResult:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.errors = 0
        self.shed = 0
        self.started = self.ended = 0.0

    def record(self, status: int, latency: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.latencies.append(latency)

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def summary(self, ok: int) -> dict[str, Any]:
        done = self.statuses.get(ok, 0)
        return {
            "requests": sum(self.statuses.values()),
            "ok": done,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "errors": self.errors,
            "per_s": round(done / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 1),
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 1),
            "max_ms": round(max(self.latencies) * 1000, 1) if self.latencies else None,
        }


async def closed_loop(host: str, port: int, raw: bytes, clients: int, seconds: float) -> LoadResult:
    """`clients` connections, each sending the next request as soon as the last is answered."""
    result = LoadResult()
    deadline = time.monotonic() + seconds

    async def client() -> None:
        conn = HttpConnection(host, port)
        while time.monotonic() < deadline:
            sent = time.monotonic()
            try:
                status, _ = await conn.request(raw)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                result.errors += 1
                await conn.close()
                continue
            result.record(status, time.monotonic() - sent)
        await conn.close()

    result.started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    result.ended = time.monotonic()
    return result


async def open_loop(
    host: str,
    port: int,
    raw: bytes,
    rate: float,
    seconds: float,
    pool: int = 64,
    on_answer: Callable[[int, bytes], None] | None = None,
    shed: bool = False,
) -> LoadResult:
    """Requests at a fixed rate whatever the answers; each latency counts from the request's
    planned time, so a slow answer cannot hide the requests queued behind it. `on_answer` sees
    each status and body. With `shed`, a request due while all `pool` connections wait for
    answers is not sent but counted (the server is overloaded; the run keeps its length)."""
    result = LoadResult()
    idle: asyncio.Queue[HttpConnection] = asyncio.Queue()
    for _ in range(pool):
        idle.put_nowait(HttpConnection(host, port))
    tasks: set[asyncio.Task[None]] = set()

    async def one(planned: float) -> None:
        conn = await idle.get()
        try:
            status, body = await conn.request(raw)
            result.record(status, time.monotonic() - planned)
            if on_answer is not None:
                on_answer(status, body)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            result.errors += 1
            await conn.close()
        finally:
            idle.put_nowait(conn)

    result.started = start = time.monotonic()
    n = 0
    while (planned := start + n / rate) < start + seconds:
        await asyncio.sleep(max(0.0, planned - time.monotonic()))
        n += 1
        if shed and idle.empty():
            result.shed += 1
            continue
        task = asyncio.create_task(one(planned))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    result.ended = start + seconds
    while not idle.empty():
        await idle.get_nowait().close()
    return result

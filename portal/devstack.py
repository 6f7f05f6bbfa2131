"""Private PostgreSQL and Redis for `make up`, `make test` and the benchmarks, plus a small supervisor.

Runs before Django is configured, so it imports nothing from Django. Usage:

    python -m portal.devstack up            # demo cluster on var/, until Ctrl-C or `down`
    python -m portal.devstack down          # stop a running `up`, its jobs, PostgreSQL and Redis
    python -m portal.devstack test [ARGS]   # pytest against services on free ports in a temp dir

When DATABASE_URL or REDIS_URL is already set, that service is used as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
PG_USER_CANDIDATES = ("postgres", "gpuportal-pg")
UP_PID_FILE = "devstack.pid"  # in the run directory: which process runs `up`, locked while it runs
UP_STOP_TIMEOUT_S = 30.0  # how long `down` waits for `up` (which gives its processes 10 s)


def log(message: str) -> None:
    print(f"[devstack] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.3):
        return True
    return False


def wait_until(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def postgres_bin() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if candidates:
        return candidates[-1].parent
    found = shutil.which("initdb") or shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    raise RuntimeError("PostgreSQL server binaries not found; install postgresql (run `make up` as root).")


def pg_os_user() -> str | None:
    """PostgreSQL refuses to run as root: use the postgres user, or create a system user for it."""
    if os.geteuid() != 0:
        return None
    for name in PG_USER_CANDIDATES:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER_CANDIDATES[1]],
        check=True,
    )
    return PG_USER_CANDIDATES[1]


def _as_pg(cmd: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


@dataclass
class Services:
    """The running private services and the environment that points at them."""

    run_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    _stops: list = field(default_factory=list)

    def stop(self) -> None:
        for stop in reversed(self._stops):
            with contextlib.suppress(Exception):
                stop()
        self._stops.clear()


def start_postgres(services: Services, port: int, keep: bool) -> None:
    pgbin = postgres_bin()
    data = services.run_dir / "pg"
    user = pg_os_user()
    services.run_dir.mkdir(parents=True, exist_ok=True)
    if user:
        os.chmod(services.run_dir, 0o755)
        shutil.chown(services.run_dir, user)
    if not (data / "PG_VERSION").exists():
        subprocess.run(
            _as_pg(
                [
                    str(pgbin / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ],
                user,
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    if not port_open(port):
        options = f"-k {services.run_dir} -h 127.0.0.1 -p {port}"
        if not keep:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        subprocess.run(
            _as_pg(
                [
                    str(pgbin / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(data / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    options,
                    "start",
                ],
                user,
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    wait_until(lambda: port_open(port), 30, "PostgreSQL")

    def stop() -> None:
        subprocess.run(
            _as_pg([str(pgbin / "pg_ctl"), "-D", str(data), "stop", "-m", "fast"], user),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    services._stops.append(stop)
    services.env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/gpuportal"


def create_database(database_url: str) -> None:
    """Creates the database named in the URL if it does not exist yet."""
    import psycopg

    from portal.lib.env import parse_database_url

    cfg = parse_database_url(database_url)
    conninfo = f"host={cfg['HOST']} port={cfg['PORT']} user={cfg['USER']} dbname=postgres"
    if cfg["PASSWORD"]:
        conninfo += f" password={cfg['PASSWORD']}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [cfg["NAME"]]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{cfg["NAME"]}"')


def redis_server_bin() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("redis-server not found; install redis-server (run `make up` as root).")
    return found


def start_redis(services: Services, port: int) -> None:
    if not port_open(port):
        subprocess.run(
            [
                redis_server_bin(),
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--daemonize",
                "yes",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(services.run_dir),
                "--pidfile",
                str(services.run_dir / "redis.pid"),
                "--logfile",
                str(services.run_dir / "redis.log"),
            ],
            check=True,
        )
    wait_until(lambda: port_open(port), 10, "Redis")

    def stop() -> None:
        subprocess.run(
            ["redis-cli", "-p", str(port), "shutdown", "nosave"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    services._stops.append(stop)
    services.env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"


@contextlib.contextmanager
def private_services(
    run_dir: Path | None = None, pg_port: int | None = None, redis_port: int | None = None, keep: bool = False
) -> Iterator[Services]:
    """Starts PostgreSQL and Redis unless DATABASE_URL / REDIS_URL point elsewhere; stops them after.

    With keep=True (make up) the data directory survives and the servers keep running after exit,
    so a second `make up` finds them; otherwise everything lives in a temporary directory.
    """
    temp = None
    if run_dir is None:
        temp = tempfile.mkdtemp(prefix="gpuportal-")
        run_dir = Path(temp)
    services = Services(run_dir=run_dir.resolve())
    try:
        if os.environ.get("DATABASE_URL"):
            services.env["DATABASE_URL"] = os.environ["DATABASE_URL"]
        else:
            start_postgres(services, pg_port or free_port(), keep)
        if os.environ.get("REDIS_URL"):
            services.env["REDIS_URL"] = os.environ["REDIS_URL"]
        else:
            start_redis(services, redis_port or free_port())
        create_database(services.env["DATABASE_URL"])
        yield services
    finally:
        services.stop()
        if temp:
            shutil.rmtree(temp, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Supervisor:
    """Runs several long-lived processes, prefixes their output, and stops them all together."""

    def __init__(self, env: dict[str, str], quiet: bool = False) -> None:
        self.env = env
        self.quiet = quiet
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        """Starts `cmd` with the supervisor's environment, or with `env` when given."""
        proc = subprocess.Popen(
            cmd,
            env=self.env if env is None else env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        threading.Thread(target=self._pump, args=(name, proc), daemon=True).start()

    def _pump(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not self.quiet:  # a benchmark still drains the pipe, so no process blocks on it
                sys.stdout.write(f"{name:>8} | {line.decode(errors='replace')}")
                sys.stdout.flush()

    def wait(self) -> int:
        """Blocks until Ctrl-C (or SIGTERM) or until one process exits; returns that process's code."""
        # SIGINT too: a shell starts a background job with SIGINT ignored, and Python keeps it
        # so, which left `kill -INT` (what Ctrl-C sends) without effect on `make up &`.
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            while True:
                for name, proc in self.procs:
                    code = proc.poll()
                    if code is not None:
                        log(f"{name} exited with {code}; stopping the rest")
                        return code or 1
                time.sleep(0.5)
        except KeyboardInterrupt:
            log("stopping")
            return 0

    def stop(self) -> None:
        for _, proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([str(VENV_BIN / "python"), "manage.py", *args], env=env, cwd=REPO, check=True)


def claim_run_dir(run_dir: Path) -> int | None:
    """Locks RUN_DIR/devstack.pid and writes this process's pid in it, so that `down` from another
    terminal finds the running `up` and a second `up` on the same directory and ports is refused.
    Returns the file's descriptor, which holds the lock until it is closed, or None when another
    `up` holds it. The kernel drops the lock when its process ends, however it ends, so a pid file that
    a killed `up` left behind is never taken for a running one (nor its pid, maybe reused since)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / UP_PID_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def running_up(run_dir: Path) -> int | None:
    """The pid of the `up` that holds the run directory's lock, or None when no `up` runs there."""
    try:
        fd = os.open(run_dir / UP_PID_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            return None  # nobody holds it; closing the file lets go of it again
        for _ in range(50):  # `up` writes its pid right after it takes the lock
            text = os.pread(fd, 32, 0).strip()
            if text:
                return int(text)
            time.sleep(0.02)
        return None
    finally:
        os.close(fd)


def cmd_up(args: argparse.Namespace) -> int:
    run_dir = REPO / "var"
    lock = claim_run_dir(run_dir)
    if lock is None:
        log(f"`make up` already runs on {run_dir} (pid {running_up(run_dir)}); `make down` stops it")
        return 1
    # SIGTERM (what `make down` sends) stops `up` as Ctrl-C does, also while the cluster starts.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run_demo(args, run_dir)
    except KeyboardInterrupt:
        log("stopped before the demo had started")
        return 0
    finally:
        os.ftruncate(lock, 0)
        os.close(lock)


def run_demo(args: argparse.Namespace, run_dir: Path) -> int:
    with private_services(run_dir, pg_port=args.pg_port, redis_port=args.redis_port, keep=True) as services:
        services._stops.clear()  # make up leaves PostgreSQL and Redis running for the next start
        env = {**os.environ, **services.env, "DEBUG": os.environ.get("DEBUG", "true")}
        manage(env, "collectstatic", "--no-input", "-v", "0")
        supervisor = start_demo_cluster(env, run_dir, args.host, args.port)
        try:
            banner = DEMO_BANNER.format(
                url=f"http://{args.host}:{args.port}/",
                python=os.path.relpath(VENV_BIN / "python", REPO),
                totp_secret=DEMO_ADMIN_TOTP_SECRET,
            )
            print(banner, flush=True)
            return supervisor.wait()
        finally:
            # A second Ctrl-C or `make down` must not cut the stopping short and leave processes.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            supervisor.stop()


def start_demo_cluster(
    env: dict[str, str], run_dir: Path, host: str, port: int, quiet: bool = False
) -> Supervisor:
    """Migrates, loads the demo, and starts web, worker, beat and one simulated agent per demo
    node; returns once the web server answers, and stops what it started if interrupted before.
    `make up` and the benchmarks share it."""
    env = {**env, "CHECKPOINT_ROOT": str(run_dir / "checkpoints")}  # where the agents keep them
    manage(env, "migrate", "--no-input", "-v", "0")
    manage(env, "seed_demo", "--agent-token-dir", str(run_dir / "agents"))
    supervisor = Supervisor(env, quiet=quiet)
    try:
        commands = portal_commands(host, port, f"worker-{port}", run_dir / "celerybeat-schedule")
        for name, cmd in commands.items():
            supervisor.start(name, cmd)
        # The agents start once the web server answers, so that they connect at once instead of
        # logging refused connections while it starts.
        wait_until(lambda: port_open(port), 30, "the web server")
        agent_env = demo_agent_env(env)
        for name, cmd in demo_agent_commands(port, run_dir):
            supervisor.start(name, cmd, env=agent_env)
    except BaseException:
        supervisor.stop()
        raise
    return supervisor


def portal_commands(host: str, port: int, worker_name: str, beat_schedule: Path) -> dict[str, list[str]]:
    """The portal's own processes: the ASGI web server (websockets included), a Celery worker
    named `worker_name` on this host, and Celery beat keeping its schedule in `beat_schedule`.
    `make up`, the live tests and the fault tests start the same three."""
    return {
        "web": [
            str(VENV_BIN / "uvicorn"),
            "portal.asgi:application",
            "--host",
            host,
            "--port",
            str(port),
            "--lifespan",
            "off",
        ],
        "worker": [
            str(VENV_BIN / "celery"),
            "-A",
            "portal",
            "worker",
            "-l",
            "info",
            "--concurrency",
            "2",
            "-n",
            f"{worker_name}@%h",
        ],
        "beat": [str(VENV_BIN / "celery"), "-A", "portal", "beat", "-l", "info", "-s", str(beat_schedule)],
    }


def demo_agent_env(env: dict[str, str]) -> dict[str, str]:
    """The demo agents' environment: `env` with the repository's examples/ and this venv's bin/
    first on PATH. A job on the process runtime gets nothing of its agent's environment but PATH
    (and LANG), and no mounts, so PATH is how the demo gives its jobs what a job image gives them
    on a Docker node: the example scripts as commands (`train_counter.py`) and a `python3` with
    the gpuportal package installed (`gpuportal.checkpoint`). It makes no path visible that was
    not before: the process runtime isolates nothing, so a job could already read both."""
    path = os.pathsep.join([str(REPO / "examples"), str(VENV_BIN), env.get("PATH", os.defpath)])
    return {**env, "PATH": path}


def demo_agent_commands(port: int, run_dir: Path) -> list[tuple[str, list[str]]]:
    """One simulated agent (process runtime) per demo node whose token file seed_demo wrote."""
    token_dir = run_dir / "agents"
    commands = []
    for token_file in sorted(token_dir.glob("*.token")):
        node = token_file.stem
        simulate = "dgx-a100" if "a100" in node else "dgx1-v100"
        commands.append(
            (
                node,
                [
                    str(VENV_BIN / "python"),
                    "-m",
                    "agents",
                    "--portal",
                    f"http://127.0.0.1:{port}",
                    "--token-file",
                    str(token_file),
                    "--runtime",
                    "process",
                    "--simulate",
                    simulate,
                    "--node-name",
                    node,
                    "--state-dir",
                    str(token_dir / node),
                    "--checkpoint-root",
                    str(run_dir / "checkpoints"),
                ],
            )
        )
    return commands


# The demo admin's authenticator key (seed_demo enrolls it), public like the demo passwords: Django
# admin asks for a one-time code after the password. Never use the demo data outside a demo.
DEMO_ADMIN_TOTP_SECRET = "GPUPORTALDEMOADMINTOTPKEY234567A"

DEMO_BANNER = """
============================================================
 GPU Portal is running at {url}
   admin:        {url}admin/      API docs: {url}api/v1/docs/
 Demo sign-ins (password = user name + "-pass"):
   cluster admin:  admin
   tenant vision:  vision-admin, alice, bob
   tenant speech:  speech-admin, carol, dave
 Django admin then asks the cluster admin for a one-time code:
   {python} -m portal.accounts.totp {totp_secret}
   (or add that key to an authenticator app)
 Press Ctrl-C to stop (or run `make down` in another terminal).
============================================================
"""


def cmd_down(args: argparse.Namespace) -> int:
    """Stops the whole demo, in order: a running `make up` (from another terminal), as Ctrl-C in
    its terminal would, so that its web server, worker, beat and agents do not outlive the
    services they need; the demo jobs' processes, which outlive their agents; then the
    PostgreSQL and Redis that `make up` leaves running under var/ so that its next start is
    quick. The data stays; `make clean` removes it."""
    from agents.runtime.process import kill_recorded_attempts

    run_dir = REPO / "var"
    pid = running_up(run_dir)
    if pid is not None:
        log(f"stopping `make up` (pid {pid}) and the processes it runs")
        try:
            with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                os.kill(pid, signal.SIGTERM)
            wait_until(lambda: running_up(run_dir) is None, UP_STOP_TIMEOUT_S, f"`make up` (pid {pid})")
        except (PermissionError, RuntimeError) as error:
            log(f"cannot stop `make up`: {error}; stop it with Ctrl-C in its terminal, then `make down`")
            return 1
    jobs = sum(kill_recorded_attempts(state) for state in sorted((run_dir / "agents").glob("*/")))
    log(f"stopped {jobs} job processes the demo agents had left running" if jobs else "no job process runs")
    data = run_dir / "pg"
    if (data / "postmaster.pid").exists():
        log(f"stopping PostgreSQL ({data})")
        subprocess.run(
            _as_pg([str(postgres_bin() / "pg_ctl"), "-D", str(data), "stop", "-m", "fast"], pg_os_user()),
            check=False,
            stdout=subprocess.DEVNULL,
        )
    else:
        log("PostgreSQL is not running")
    if port_open(args.redis_port):
        log(f"stopping Redis (port {args.redis_port})")
        subprocess.run(
            ["redis-cli", "-p", str(args.redis_port), "shutdown", "nosave"],
            check=False,
            stdout=subprocess.DEVNULL,
        )
    else:
        log("Redis is not running")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    with private_services() as services:
        # Development settings (no TLS redirect, a throw-away key); pytest-django still runs with DEBUG off.
        env = {**os.environ, **services.env, "DEBUG": "true"}
        log(f"PostgreSQL and Redis for this run: {services.env['DATABASE_URL']} {services.env['REDIS_URL']}")
        code = subprocess.run(
            [str(VENV_BIN / "python"), "-m", "pytest", *args.pytest_args], env=env, cwd=REPO
        ).returncode
        return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m portal.devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run the demo cluster")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    up.add_argument("--pg-port", type=int, default=55432)
    up.add_argument("--redis-port", type=int, default=56379)
    down = sub.add_parser("down", help="stop a running `up`, the demo's jobs, PostgreSQL and Redis")
    down.add_argument("--redis-port", type=int, default=56379)
    test = sub.add_parser("test", help="run pytest on private services")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args, extra = parser.parse_known_args(argv)
    if args.command == "test":
        args.pytest_args = [*args.pytest_args, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "up":
        return cmd_up(args)
    if args.command == "down":
        return cmd_down(args)
    return cmd_test(args)


if __name__ == "__main__":
    sys.exit(main())

"""Shared fixtures: the demo cast and, for integration tests, the live stack.

The cast comes from the demo seed: tenant vision (vision-admin, alice, bob) and tenant speech
(speech-admin, carol, dave); victor is a viewer in vision.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    """Polls `check` until it returns something truthy; fails the test with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except Exception as exc:  # the thing polled may not be up yet
            last_error = exc
            result = None
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}" + (f": {last_error}" if last_error else "")
    )


# Password hashes of the cast, by (password, algorithm of the hasher in use), made once a run.
_CAST_HASHES: dict[tuple[str, str], str] = {}


@contextlib.contextmanager
def cast_hashed_once() -> Iterator[None]:
    """The cast's passwords hashed once per run and the hashes reused, while the cast is made.
    Live tests keep the real hasher (fast_password_hashing), at a third of a second per
    password, and every one of them makes the cast anew: without this, nearly half of the
    suite's own CPU time. A reused hash is a real one of that hasher, salt and all, so the live
    server checks it as any other; only the cast's users share their salts across tests."""
    from unittest import mock

    from django.contrib.auth import base_user, hashers

    def make_password(password: str | None, salt: str | None = None, hasher: str = "default") -> str:
        if password is None or salt is not None or hasher != "default":
            return hashers.make_password(password, salt, hasher)
        key = (password, hashers.get_hasher().algorithm)
        if key not in _CAST_HASHES:
            _CAST_HASHES[key] = hashers.make_password(password)
        return _CAST_HASHES[key]

    with mock.patch.object(base_user, "make_password", make_password):
        yield


@pytest.fixture
def demo(db: Any) -> None:
    from portal.demo import seed_demo

    with cast_hashed_once():
        seed_demo()


@pytest.fixture
def users(demo: Any) -> dict[str, Any]:
    from django.contrib.auth.models import User

    from portal.accounts.choices import Role
    from portal.accounts.models import Membership, Tenant

    with cast_hashed_once():
        victor = User.objects.create_user("victor", password="victor-pass")
        Membership.objects.create(user=victor, tenant=Tenant.objects.get(name="vision"), role=Role.VIEWER)
        User.objects.create_user("nobody", password="nobody-pass")
    return {u.username: u for u in User.objects.all()}


@pytest.fixture
def api_for(users: dict[str, Any]) -> Any:
    """api_for("alice") -> a DRF APIClient signed in as alice; api_for(None) is anonymous."""
    from rest_framework.test import APIClient

    def make(username: str | None) -> APIClient:
        client = APIClient()
        if username is not None:
            client.force_authenticate(users[username])
        return client

    return make


def pass_admin_second_factor(client: Any, user: Any) -> None:
    """Completes Django admin's second factor on its real forms, for a client signed in as a
    staff user: enrolls an authenticator if the user has none, then posts a code from it (the
    next unused step, so a test may sign in more than once)."""
    from portal.accounts import totp
    from portal.accounts.models import TotpDevice

    device = TotpDevice.objects.filter(user=user, confirmed_at__isnull=False).first()
    url = "/admin/mfa/"
    if device is None:
        url = "/admin/mfa/enroll/"
        assert client.get(url).status_code == 200
        device = TotpDevice.objects.get(user=user)
    step = max(totp.step_at(), device.last_used_step + 1)
    assert step <= totp.step_at() + totp.WINDOW, "every code of the window is used"
    response = client.post(url, {"code": totp.code_at_step(device.secret, step)})
    assert response.status_code == 302, response.content.decode()[-500:]


@pytest.fixture
def cluster_admin_client(users: dict[str, Any]) -> Any:
    """A Django test client signed in as the demo's cluster admin, past the second factor."""
    from django.test import Client

    client = Client()
    client.force_login(users["admin"])
    pass_admin_second_factor(client, users["admin"])
    return client


SMALL_JOB = {"name": "train-resnet", "vc": "vision", "flavor": "s-A100", "command": "python train.py"}


@pytest.fixture
def small_job() -> dict[str, Any]:
    return dict(SMALL_JOB)


def database_url_of_tests() -> str:
    """The test database as a DATABASE_URL, for the portal processes a test starts beside it."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any) -> Iterator[None]:
    """pytest-django's test database; at the end of the run, the persistent connections of the
    two threads that in-process async tests leave behind are closed before it is dropped
    (PostgreSQL refuses to drop a database in use): asgiref's thread for `sync_to_async`, and
    the telemetry writer of the agent gateway (portal.agentgw.ingest). No request ends in them,
    so nothing else closes them."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    from portal.agentgw.ingest import buffer

    SyncToAsync.single_thread_executor.submit(connections.close_all).result()
    buffer.close_connections()


class MailBox:
    """What a real SMTP server on loopback (aiosmtpd) received: the portal's mail in tests."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.port = free_port()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        from email import message_from_bytes, policy

        message = message_from_bytes(envelope.content, policy=policy.default)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        self.messages.append(message)
        return "250 OK"

    def about(self, words: str) -> list[Any]:
        return [m for m in self.messages if words in str(m["Subject"])]

    def mailers(self) -> dict[str, Any]:
        """The MAILERS setting that sends to this server (tests otherwise keep mail in memory)."""
        options = {"host": "127.0.0.1", "port": self.port, "use_tls": False, "timeout": 10}
        return {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": options}}


@pytest.fixture(scope="session")
def mailbox() -> Iterator[MailBox]:
    from aiosmtpd.controller import Controller

    box = MailBox()
    controller = Controller(box, hostname="127.0.0.1", port=box.port)
    controller.start()
    yield box
    controller.stop()


@pytest.fixture(scope="session")
def live_stack(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: Any, mailbox: MailBox
) -> Iterator[dict[str, Any]]:
    """A real ASGI server, Celery worker and beat on the test database and this run's Redis,
    mailing through the session's SMTP server."""

    database_url = database_url_of_tests()
    logs = tmp_path_factory.mktemp("live-logs")
    port = free_port()
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DEBUG": "true",
        "PYTHONUNBUFFERED": "1",
        "CHECKPOINT_ROOT": str(checkpoints),
        "AGENT_HEARTBEAT_INTERVAL_S": "1",
        "AGENT_TELEMETRY_INTERVAL_S": "1",
        # Agents heartbeat every second in tests, so a node is suspect after 4 s and lost after 8 s.
        "NODE_SILENT_AFTER_S": "4",
        "NODE_LOST_AFTER_S": "8",
        # The whole suite signs in from one address far more often than a person would.
        "THROTTLE_SIGN_IN": "10000/min",
        "THROTTLE_TOKENS": "10000/min",
        "THROTTLE_SUBMIT": "10000/min",
        "THROTTLE_DRY_RUN": "10000/min",
        # The default profile plus time-slicing (6 s turns, so tests see them) and migration.
        "SCHEDULER_PROFILE": str(REPO / "tests" / "testdata" / "live-profile.json"),
        "SMTP_HOST": "127.0.0.1",
        "SMTP_PORT": str(mailbox.port),
        "SMTP_STARTTLS": "false",
        "PORTAL_URL": f"http://127.0.0.1:{port}",
        # Webhook tests post to receivers on loopback (tests/webhook_receiver.py).
        "WEBHOOK_ALLOW_PRIVATE_HOSTS": "true",
    }
    from portal.devstack import portal_commands

    commands = portal_commands("127.0.0.1", port, f"test-{port}", logs / "beat-schedule")
    from scheduler.tasks import set_loop_paused

    set_loop_paused(True)  # until a live test runs (background_only_in_live_tests)
    procs = {}
    for name, cmd in commands.items():
        with open(logs / f"{name}.log", "wb") as out:
            procs[name] = subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
    from portal.celery import app

    try:
        wait_for(
            lambda: socket.create_connection(("127.0.0.1", port), 0.5).close() or True, 30, "the ASGI server"
        )
        wait_for(lambda: app.control.inspect(timeout=0.5).ping(), 60, "the Celery worker")
        yield {
            "http": f"http://127.0.0.1:{port}",
            "ws": f"ws://127.0.0.1:{port}",
            "logs": logs,
            "env": env,
            "checkpoints": checkpoints,
            "worker": f"test-{port}@{socket.gethostname()}",  # the Celery node name (-n)
        }
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def web_server(log_dir: Path, port: int | None = None, **extra_env: str) -> Iterator[str]:
    """A real ASGI server (uvicorn, its own process) on the test database, without Celery, with
    `extra_env` added to its settings. Yields its host:port."""
    from portal.devstack import port_open, portal_commands, wait_until

    port = port or free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url_of_tests(),
        "DEBUG": "true",
        "PYTHONUNBUFFERED": "1",
        **extra_env,
    }
    command = portal_commands("127.0.0.1", port, "unused", log_dir / "unused")["web"]
    with open(log_dir / "web.log", "wb") as out:
        web = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: port_open(port), 30, "the web server")
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        try:
            web.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def shell_server(django_db_setup: Any, tmp_path_factory: Any) -> Iterator[str]:
    """A real ASGI server for real websockets to the shell socket and the agent socket
    (tests/portal/test_shell.py, and the `gpuportal shell` command in tests/client)."""
    with web_server(tmp_path_factory.mktemp("shell-server")) as address:
        yield address


@pytest.fixture(autouse=True)
def fast_password_hashing(request: Any, settings: Any) -> None:
    """PBKDF2 costs a third of a second per user and the demo cast has nine. Live tests keep the
    real hasher, since the live server checks the passwords with its own settings."""
    if request.node.get_closest_marker("live") is None:
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class AgentProcess:
    """A real node agent (`python -m agents`) with simulated GPUs and the process runtime."""

    def __init__(self, live: dict[str, Any], node: str, token: str, state_dir: Path) -> None:
        self.live, self.node, self.state_dir = live, node, state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.token_file = state_dir.parent / f"{node}.token"
        self.token_file.write_text(token)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        simulate = "dgx-a100" if "a100" in self.node else "dgx1-v100"
        with open(self.state_dir.parent / f"{self.node}-{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agents",
                    "--portal",
                    self.live["http"],
                    "--token-file",
                    str(self.token_file),
                    "--runtime",
                    "process",
                    "--simulate",
                    simulate,
                    "--node-name",
                    self.node,
                    "--state-dir",
                    str(self.state_dir),
                    "--checkpoint-root",
                    str(self.live["checkpoints"]),
                    "--telemetry-interval",
                    "1",
                    "--heartbeat-interval",
                    "1",
                ],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL of the agent alone: the jobs it started live on in their own process groups."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def kill_jobs(self) -> None:
        """Job processes outlive their agent by design; a test must not leave them behind."""
        marker = str(self.state_dir).encode()
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit():
                continue
            try:
                if marker in (proc_dir / "cmdline").read_bytes():
                    os.killpg(int(proc_dir.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.state_dir.parent.glob(f"{self.node}-*.log"))
        )


# The agents a test started, for its failure report (pytest_runtest_makereport).
STARTED_AGENTS = pytest.StashKey[list[AgentProcess]]()


@pytest.fixture
def start_agent(request: Any, live_stack: dict[str, Any], tmp_path: Path) -> Iterator[Any]:
    """start_agent("a100-node-1") -> a running AgentProcess holding a fresh token for that node."""
    from portal.cluster.models import Node
    from portal.cluster.services import issue_node_token

    agents: list[AgentProcess] = []
    request.node.stash[STARTED_AGENTS] = agents

    def start(node_name: str) -> AgentProcess:
        token = issue_node_token(Node.objects.get(name=node_name), None)
        agent = AgentProcess(live_stack, node_name, token, tmp_path / "agents" / node_name)
        agent.start()
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()
        agent.kill_jobs()


@pytest.fixture
def paused_loop() -> Iterator[None]:
    """For tests that drive scheduling cycles by hand: the live stack's worker and beat (started
    by another test of the session, on the same database) must not run cycles of their own."""
    from scheduler.tasks import set_loop_paused

    set_loop_paused(True)
    yield  # and it stays paused: see background_only_in_live_tests


@pytest.fixture(autouse=True)
def fresh_throttle_counts() -> None:
    """Throttle counts live in the in-process cache; each test starts with none."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def webhooks_stay_on_loopback(monkeypatch: Any) -> None:
    """No test sends a webhook off this machine or looks a host name up in DNS (Schemathesis
    makes URLs up; tests register public address literals): in this process, names other than
    localhost do not resolve, and a delivery to an address off loopback fails before it connects.
    The live stack's processes have no such net: their tests post only to loopback receivers."""
    import ipaddress
    from urllib.parse import urlsplit

    from portal.accounts import webhooks

    real_resolve, real_post = webhooks._resolve, webhooks.post

    def resolve_offline(host: str, port: int) -> Any:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if host != "localhost":
                raise webhooks.UnresolvedHost(f"The host {host} cannot be resolved.") from None
        return real_resolve(host, port)

    def post_on_loopback(url: str, *args: Any, **kwargs: Any) -> Any:
        host = urlsplit(url).hostname or ""
        try:
            off_loopback = not ipaddress.ip_address(host).is_loopback
        except ValueError:
            off_loopback = False  # a name: resolve_offline refuses all but localhost
        if off_loopback:
            return webhooks.Outcome(None, "tests post only to loopback")
        return real_post(url, *args, **kwargs)

    monkeypatch.setattr(webhooks, "_resolve", resolve_offline)
    monkeypatch.setattr(webhooks, "post", post_on_loopback)


@pytest.fixture(autouse=True)
def background_only_in_live_tests(request: Any) -> Iterator[None]:
    """The live stack's worker and beat serve the whole session but act only during live tests:
    otherwise their periodic tasks would race other tests, and the database flush after each
    transactional test (a TRUNCATE) could deadlock with a task's reads."""
    if request.node.get_closest_marker("live") is None or "live_stack" not in request.fixturenames:
        yield
        return
    from portal.celery import app
    from scheduler.tasks import set_loop_paused

    # Asked of the stack's one worker by name, the question ends with its answer instead of
    # waiting out the timeout for answers from any others (a second per test).
    worker = request.getfixturevalue("live_stack")["worker"]
    set_loop_paused(False)
    yield
    set_loop_paused(True)
    wait_for(
        lambda: not any((app.control.inspect([worker], timeout=1, limit=1).active() or {}).values()),
        30,
        "the worker to go idle",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
    """A live test that fails says what the portal did: the last lines of the agent, web and
    worker logs and every job's events, read before the database is flushed. A flaky failure
    in CI is otherwise a timeout and nothing more."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.failed or "live_stack" not in item.fixturenames:
        return
    live = item.funcargs.get("live_stack")
    logs = [(f"agent {agent.node}", agent.log()) for agent in item.stash.get(STARTED_AGENTS, [])]
    if live is not None:
        for name in ("web", "worker"):
            with contextlib.suppress(OSError):
                logs.append((name, (live["logs"] / f"{name}.log").read_text(errors="replace")))
    for name, text in logs:
        lines = [
            line[:300]
            for line in text.splitlines()
            if " received" not in line and "connection open" not in line
        ]
        report.sections.append((f"{name} log, last lines", "\n".join(lines[-20:])))
    # The job events last: a report cut short from the top still shows them.
    with contextlib.suppress(Exception):
        report.sections.append(("jobs and their events", job_stories()))


def job_stories() -> str:
    from portal.jobs.models import Job

    text = []
    for job in Job.objects.order_by("pk").prefetch_related("events"):
        reason = f"[{job.pending_reason}] {job.pending_message[:200]}"
        text.append(f"job {job.pk} {job.name}: {job.state} {reason}")
        for event in job.events.all():
            moment = event.created_at.strftime("%H:%M:%S.%f")[:-3]
            text.append(f"  {moment} -> {event.to_state or '-'} ({event.actor_label}): {event.reason[:200]}")
    return "\n".join(text)


@pytest.fixture
def receiver(settings: Any) -> Iterator[Any]:
    """A real HTTP server on loopback that webhooks may post to (private hosts allowed for it),
    with the portal's links under https://portal.example.org."""
    from tests.webhook_receiver import running_receiver

    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True
    settings.PORTAL_URL = "https://portal.example.org"
    with running_receiver() as running:
        yield running


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """Tasks queued after commit run at once in the test's process, retries included."""
    from portal.celery import app

    before = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = before

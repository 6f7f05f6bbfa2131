"""Agent enrollment and revocation (reliability-security.md S8) over the real Channels stack
(Redis channel layer, PostgreSQL), the real enrollment endpoint and the real Django admin.

Replays are covered elsewhere: a captured status report sent again (the same generation) or
late (an older one), and reports of an older attempt after the job was placed again, change
nothing (tests/portal/agentgw/test_agent_consumer.py, tests/reliability/test_agent_messages.py).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from agents.protocol import AttemptState, AttemptStatus, decode_from_portal, encode, utc_now
from portal.accounts.models import AuditEntry
from portal.cluster.models import EnrollmentToken, Node
from portal.cluster.services import create_enrollment_token, issue_node_token, set_node_state
from portal.jobs.models import Allocation, Job, JobAttempt
from tests.conftest import wait_for
from tests.portal.agentgw.test_agent_consumer import hello

pytestmark = pytest.mark.django_db(transaction=True)


def application() -> Any:
    from portal.asgi import application

    return application


def enroll(token: str | None, node_name: str = "") -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return Client().post(
        "/agent/enroll/", {"node_name": node_name}, content_type="application/json", **headers
    )


def refusals(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=f"{action}.denied").order_by("id"))


async def agent_socket(token: str) -> tuple[WebsocketCommunicator, bool, Any]:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    communicator = WebsocketCommunicator(application(), "/ws/agent/", headers=headers)
    connected, code = await communicator.connect()
    return communicator, connected, code


async def greet(token: str, node: str) -> WebsocketCommunicator:
    communicator, connected, _ = await agent_socket(token)
    assert connected
    await communicator.send_to(text_data=encode(hello(node)))
    assert decode_from_portal(await communicator.receive_from(timeout=10)).type == "welcome"
    assert decode_from_portal(await communicator.receive_from(timeout=10)).type == "desired_set"
    return communicator


def test_an_enrollment_token_enrolls_once_and_is_stored_hashed(users, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The management command writes a 256-bit token (mode 600) and stores only its hash; the
    token gives a new node its own token once, and a second use creates and changes nothing."""
    token_file = tmp_path / "enroll.token"
    call_command("create_enrollment_token", "--token-file", str(token_file), stdout=io.StringIO())
    raw = token_file.read_text().strip()
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert raw.startswith("gpe_") and len(raw) >= 4 + 43  # 32 random bytes, base64
    stored = EnrollmentToken.objects.get()
    assert stored.token_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in str(EnrollmentToken.objects.values().get())
    assert timedelta(minutes=59) < stored.expires_at - timezone.now() <= timedelta(minutes=60)

    response = enroll(raw, "gpu-new-1")
    assert response.status_code == 201, response.content
    node_token = response.json()["token"]
    node = Node.objects.get(name="gpu-new-1")
    assert node.token_hash == hashlib.sha256(node_token.encode()).hexdigest()
    stored.refresh_from_db()
    assert stored.used_at is not None and stored.node == node
    assert AuditEntry.objects.filter(action="node.enroll", object_id=str(node.pk)).exists()

    nodes_before = list(Node.objects.order_by("pk").values_list("pk", "token_hash"))
    for name in ("gpu-new-1", "gpu-new-2"):  # reused: for the same node or for another
        again = enroll(raw, name)
        assert again.status_code == 401 and "token" not in again.json()
    assert list(Node.objects.order_by("pk").values_list("pk", "token_hash")) == nodes_before
    denied = refusals("node.enroll")
    assert len(denied) == 2 and all("already used" in entry.detail for entry in denied)
    assert raw not in "".join(entry.detail for entry in AuditEntry.objects.all())


def test_expired_unknown_and_misdirected_tokens_enroll_nothing(users) -> None:  # type: ignore[no-untyped-def]
    admin = users["admin"]
    expired, expired_raw = create_enrollment_token(admin, ttl_minutes=1)
    EnrollmentToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    _, bound_raw = create_enrollment_token(admin, "gpu-bound")
    _, unbound_raw = create_enrollment_token(admin)
    node = Node.objects.get(name="a100-node-1")
    issue_node_token(node, None)
    node.refresh_from_db()
    nodes_before = list(Node.objects.order_by("pk").values_list("pk", "name", "token_hash"))

    assert enroll(expired_raw, "gpu-late").status_code == 401
    assert enroll("gpe_" + "x" * 43, "gpu-guess").status_code == 401
    assert enroll(None, "gpu-anonymous").status_code == 401
    # A token bound to one name enrolls no other; an unbound one takes over no existing node.
    assert enroll(bound_raw, "gpu-other").status_code == 403
    assert enroll(unbound_raw, "a100-node-1").status_code == 403

    assert list(Node.objects.order_by("pk").values_list("pk", "name", "token_hash")) == nodes_before
    assert EnrollmentToken.objects.filter(used_at__isnull=False).count() == 0
    details = [entry.detail for entry in refusals("node.enroll")]
    assert len(details) == 5
    assert "expired" in details[0] and "unknown" in details[1] and "unknown" in details[2]
    assert "is for node gpu-bound" in details[3] and "must name it" in details[4]
    # The bound token still enrolls its own node, and the unbound one a new node.
    assert enroll(bound_raw, "").json()["node_name"] == "gpu-bound"
    assert enroll(unbound_raw, "gpu-fresh").status_code == 201


def revoke_in_admin(client: Client, node: Node) -> Any:
    return client.post(
        "/admin/cluster/node/",
        {"action": "revoke_agent_credentials", "_selected_action": [str(node.pk)]},
        follow=True,
    )


def place_a_job(alice: Any) -> Job:
    from rest_framework.test import APIClient

    from scheduler.tasks import run_cycle

    client = APIClient()
    client.force_authenticate(alice)
    spec = {
        "name": "j",
        "vc": "vision",
        "resources": {"gpus": 8, "gpu_model": "A100", "cpu": 8, "memory_gb": 8},
        "command": "true",
    }
    job_id = client.post("/api/v1/jobs/", spec, format="json").json()["id"]
    assert run_cycle()["started"] == 1
    return Job.objects.get(pk=job_id)


@pytest.mark.asyncio
async def test_revocation_drops_the_agent_requeues_its_job_and_refuses_its_token(
    users, paused_loop, cluster_admin_client
) -> None:  # type: ignore[no-untyped-def]
    """The admin action marks the node untrusted (cordoned), requeues its job through the
    node-lost path, tells the agent to stop it and closes its socket; the token opens nothing
    from then on. A token bound to the node enrolls it again, still cordoned."""
    node = await Node.objects.aget(name="a100-node-1")
    token = await sync_to_async(issue_node_token)(node, None)
    agent = await greet(token, "a100-node-1")
    job = await sync_to_async(place_a_job)(users["alice"])
    (replica,) = decode_from_portal(await agent.receive_from(timeout=10)).attempts
    running = AttemptStatus(
        attempt_id=replica.attempt_id,
        job_id=str(job.pk),
        state=AttemptState.RUNNING,
        generation=1,
        time=utc_now(),
    )
    await agent.send_to(text_data=encode(running))
    await agent.receive_nothing(timeout=0.5)
    assert (await Job.objects.aget(pk=job.pk)).state == "running"

    response = await sync_to_async(revoke_in_admin)(cluster_admin_client, node)
    assert response.status_code == 200 and b"credentials revoked, 1 job(s) requeued" in response.content

    # The agent hears that nothing should run any more, then its socket is closed.
    assert decode_from_portal(await agent.receive_from(timeout=10)).attempts == []
    assert await agent.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}
    node = await Node.objects.aget(pk=node.pk)
    assert node.revoked_at is not None and node.state == "cordoned" and "untrusted" in node.state_reason
    job = await Job.objects.aget(pk=job.pk)
    assert job.state == "pending" and job.pending_reason == "requeued"
    assert await JobAttempt.objects.filter(job=job, state="lost").acount() == 1
    assert not await Allocation.objects.filter(node=node, released_at__isnull=True).aexists()
    assert await AuditEntry.objects.filter(action="node.revoke", object_id=str(node.pk)).aexists()

    # The old token is refused (403 at the handshake, close code 4403), and the refusal audited.
    _, connected, code = await agent_socket(token)
    assert not connected and code == 4403
    denied = await sync_to_async(refusals)("agent.connect")
    assert [(entry.object_id, "revoked" in entry.detail) for entry in denied] == [(str(node.pk), True)]
    # Uncordoning a revoked node does not make it ready, and a new token does not lift it.
    await sync_to_async(set_node_state)(node, "uncordon", users["admin"])
    assert (await Node.objects.aget(pk=node.pk)).state == "not-ready"
    _, connected, code = await agent_socket(await sync_to_async(issue_node_token)(node, None))
    assert not connected and code == 4403

    # Enrolled again with a token bound to its name: a new token works, the old one still not.
    _, raw = await sync_to_async(create_enrollment_token)(users["admin"], "a100-node-1")
    enrolled = await sync_to_async(enroll)(raw, "a100-node-1")
    assert enrolled.status_code == 201
    assert (await Node.objects.aget(pk=node.pk)).revoked_at is None
    _, connected, _ = await agent_socket(token)
    assert not connected
    agent = await greet(enrolled.json()["token"], "a100-node-1")
    await agent.disconnect()


def test_cluster_admins_create_enrollment_tokens_in_django_admin(cluster_admin_client) -> None:  # type: ignore[no-untyped-def]
    """The secret is shown once, in the message after adding; the stored row holds its hash."""
    response = cluster_admin_client.post(
        "/admin/cluster/enrollmenttoken/add/", {"node_name": "gpu-017", "valid_minutes": 30}, follow=True
    )
    assert response.status_code == 200
    (message,) = [str(m) for m in response.context["messages"] if "shown once" in str(m)]
    raw = message.rsplit(" ", 1)[-1]
    token = EnrollmentToken.objects.get()
    assert token.node_name == "gpu-017" and token.created_by.username == "admin"
    assert token.token_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert timedelta(minutes=29) < token.expires_at - timezone.now() <= timedelta(minutes=30)
    assert AuditEntry.objects.filter(action="node.enrollment_token.create", object_id=str(token.pk)).exists()
    # Longer than the maximum lifetime is refused by the form.
    cluster_admin_client.post(
        "/admin/cluster/enrollmenttoken/add/", {"node_name": "", "valid_minutes": 10**6}
    )
    assert EnrollmentToken.objects.count() == 1
    assert enroll(raw).json()["node_name"] == "gpu-017"


def test_a_cluster_admin_voids_an_unused_enrollment_token(cluster_admin_client, users) -> None:  # type: ignore[no-untyped-def]
    """A token that leaked is voided at once instead of staying usable until it expires; a used
    one is left as it is, and every void is audited."""
    leaked, raw = create_enrollment_token(users["admin"], "", 60)
    used, used_raw = create_enrollment_token(users["admin"], "gpu-018", 60)
    assert enroll(used_raw, "gpu-018").status_code == 201
    used.refresh_from_db()
    response = cluster_admin_client.post(
        "/admin/cluster/enrollmenttoken/",
        {"action": "void", "_selected_action": [str(leaked.pk), str(used.pk)]},
        follow=True,
    )
    assert "1 enrollment token(s) voided." in [str(m) for m in response.context["messages"]]
    assert enroll(raw, "gpu-new").status_code == 401  # as an expired token
    assert not Node.objects.filter(name="gpu-new").exists()
    assert EnrollmentToken.objects.get(pk=used.pk).expires_at == used.expires_at
    voids = AuditEntry.objects.filter(action="node.enrollment_token.void")
    assert list(voids.values_list("object_id", flat=True)) == [str(leaked.pk)]


def run_agent(portal_url: str, enroll_file: Path, state_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                *("-m", "agents", "--portal", portal_url, "--enroll-token-file", str(enroll_file)),
                *("--runtime", "process", "--simulate", "dgx-a100", "--node-name", "gpu-cli"),
                *("--state-dir", str(state_dir), "--heartbeat-interval", "1"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(agent: subprocess.Popen[bytes]) -> None:
    agent.terminate()
    try:
        agent.wait(timeout=10)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


@pytest.mark.asyncio
async def test_the_agent_cli_enrolls_once_and_its_stored_token_opens_the_gateway(
    users, live_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """`python -m agents --enroll-token-file` against the portal's real enrollment endpoint:
    the node token lands in the state directory with mode 600 and opens the agent socket; a
    restart uses it and does not spend the enrollment token again."""
    _, raw = await sync_to_async(create_enrollment_token)(users["admin"], "gpu-cli")
    enroll_file, state_dir, log = tmp_path / "enroll.token", tmp_path / "state", tmp_path / "agent.log"
    enroll_file.write_text(raw + "\n")
    stored = state_dir / "node.token"
    agent = run_agent(live_server.url, enroll_file, state_dir, log)
    try:
        await sync_to_async(wait_for)(stored.exists, 30, "the agent to enroll")
    finally:
        stop(agent)
    token = stored.read_text().strip()
    assert stored.stat().st_mode & 0o777 == 0o600
    node = await Node.objects.aget(name="gpu-cli")
    assert node.token_hash == hashlib.sha256(token.encode()).hexdigest()
    communicator = await greet(token, "gpu-cli")
    await communicator.disconnect()

    # The restart goes straight to the agent socket (which this WSGI test server does not serve).
    log = tmp_path / "agent-2.log"
    agent = run_agent(live_server.url, enroll_file, state_dir, log)
    try:
        await sync_to_async(wait_for)(
            lambda: "reconnecting in" in log.read_text(), 30, "a connection attempt"
        )
        assert agent.poll() is None, log.read_text()
    finally:
        stop(agent)
    assert stored.read_text().strip() == token
    assert not await AuditEntry.objects.filter(action="node.enroll.denied").aexists()
    assert await AuditEntry.objects.filter(action="node.enroll").acount() == 1


async def closed(agent: WebsocketCommunicator) -> bool:
    """Whether the portal closes the agent's socket (it may first send a desired set)."""
    for _ in range(3):
        output = await agent.receive_output(timeout=10)
        if output["type"] == "websocket.close":
            return True
    return False


@pytest.mark.asyncio
async def test_new_credentials_close_the_socket_opened_with_the_old_ones(
    users, paused_loop, cluster_admin_client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The token is checked at the handshake only: an agent connected with the old one would go
    on receiving desired sets, with jobs' secret variables. A new token from Django admin, from
    a re-enrollment or from register_node closes the node's sockets."""
    node = await Node.objects.aget(name="a100-node-1")
    agent = await greet(await sync_to_async(issue_node_token)(node, None), "a100-node-1")
    response = await sync_to_async(cluster_admin_client.post)(
        "/admin/cluster/node/", {"action": "issue_agent_token", "_selected_action": [str(node.pk)]}
    )
    assert response.status_code == 302
    assert await closed(agent)

    agent = await greet(await sync_to_async(issue_node_token)(node, None), "a100-node-1")
    _, raw = await sync_to_async(create_enrollment_token)(users["admin"], "a100-node-1")
    assert (await sync_to_async(enroll)(raw, "a100-node-1")).status_code == 201
    assert await closed(agent)

    agent = await greet(await sync_to_async(issue_node_token)(node, None), "a100-node-1")
    await sync_to_async(call_command)(
        "register_node", "a100-node-1", token_file=tmp_path / "t", stdout=io.StringIO()
    )
    assert await closed(agent)


def test_token_files_are_created_private_not_made_private_afterwards(
    users, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """register_node --token-file and the demo's token files wrote the token, then chmod-ed the
    file: readable by every local user in between (here: a chmod that never comes)."""
    import os

    from portal.demo import write_agent_token

    monkeypatch.setattr(Path, "chmod", lambda self, mode: None)
    old_umask = os.umask(0)
    try:
        call_command("register_node", "gpu-017", token_file=tmp_path / "agent.token", stdout=io.StringIO())
        write_agent_token(Node.objects.get(name="gpu-017"), tmp_path / "demo")
    finally:
        os.umask(old_umask)
    for path in (tmp_path / "agent.token", tmp_path / "demo" / "gpu-017.token"):
        assert path.stat().st_mode & 0o777 == 0o600, path

"""Refused requests are audited, and repeated ones raise an alert (reliability-security.md S2, S7),
in both realms: API writes refused with 403 or 404, and agents refused by the gateway. Over the
real Channels stack (Redis channel layer, PostgreSQL) and the real /metrics view."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from agents.protocol import AttemptState, decode_from_portal, encode
from portal.accounts.models import AuditEntry
from portal.cluster.models import Node
from portal.jobs.models import Job
from portal.lib.redis import get_redis
from tests.portal.agentgw.test_agent_consumer import application, greet, place_a_job, status

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_windows(settings: Any) -> None:
    """Every test starts with empty refusal windows (the counts live in this run's Redis)."""
    redis = get_redis()
    for key in redis.scan_iter("security:*"):
        redis.delete(key)
    settings.SECURITY_ALERT_THRESHOLD = 5
    settings.SECURITY_ALERT_WINDOW_S = 600


def api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def metric(name: str, realm: str) -> float:
    text = Client().get("/metrics").content.decode()
    match = re.search(rf'^{name}_total\{{realm="{realm}"\}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def alerts() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action="security.alert").order_by("id"))


def test_a_refused_cancel_is_audited_and_answers_like_a_missing_job(users, small_job) -> None:  # type: ignore[no-untyped-def]
    """S2: Carol cancelling Alice's job gets the 404 of a job that does not exist, Bob (same
    tenant, not the owner) a 403; each refusal is an audit entry naming who, what and which."""
    job_id = api(users["alice"]).post("/api/v1/jobs/", small_job, format="json").json()["id"]
    foreign = api(users["carol"]).post(f"/api/v1/jobs/{job_id}/cancel/")
    missing = api(users["carol"]).post("/api/v1/jobs/999999/cancel/")
    assert (foreign.status_code, foreign.json()) == (404, {"detail": f"No job {job_id}."})
    assert (missing.status_code, missing.json()) == (404, {"detail": "No job 999999."})
    assert api(users["bob"]).post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 403
    assert Job.objects.get(pk=job_id).state == "pending"
    # Another user's API token is refused too (404), and reading is not recorded.
    token_id = api(users["alice"]).post("/api/v1/tokens/", {"name": "x"}, format="json").json()["id"]
    assert api(users["carol"]).delete(f"/api/v1/tokens/{token_id}/").status_code == 404
    assert api(users["carol"]).get(f"/api/v1/jobs/{job_id}/").status_code == 404

    denied = list(
        AuditEntry.objects.filter(action__endswith=".denied")
        .order_by("id")
        .values_list("actor__username", "action", "object_type", "object_id", "tenant__name")
    )
    assert denied == [
        ("carol", "job.cancel.denied", "jobs.Job", str(job_id), "vision"),
        ("carol", "job.cancel.denied", "jobs.Job", "999999", None),
        ("bob", "job.cancel.denied", "jobs.Job", str(job_id), "vision"),
        ("carol", "apitoken.destroy.denied", "accounts.ApiToken", str(token_id), None),
    ]
    details = (
        AuditEntry.objects.filter(action__endswith=".denied").order_by("id").values_list("detail", flat=True)
    )
    assert [detail.rsplit(" ", 1)[-1] for detail in details] == ["404", "404", "403", "404"]
    assert alerts() == []


def test_repeated_refusals_of_one_user_raise_one_alert(users, small_job, caplog) -> None:  # type: ignore[no-untyped-def]
    """Five refused writes within the window raise an alert: an audit entry, an ERROR log line
    and the counter on /metrics; the sixth raises none, and another user's refusals count apart."""
    job_id = api(users["alice"]).post("/api/v1/jobs/", small_job, format="json").json()["id"]
    refusals_before = metric("gpuportal_security_refusals", "user")
    alerts_before = metric("gpuportal_security_alerts", "user")
    carol, dave = api(users["carol"]), api(users["dave"])
    with caplog.at_level(logging.ERROR, logger="portal.accounts.security"):
        for i in range(4):
            assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
            assert dave.post(f"/api/v1/jobs/{job_id + 1000 + i}/cancel/").status_code == 404
        assert alerts() == []
        assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
        assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    (alert,) = alerts()
    assert alert.actor == users["carol"]
    assert f"user:{users['carol'].pk}" in alert.detail and "5 refused requests" in alert.detail
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "security alert" in r.getMessage()]
    assert len(errors) == 1 and f"user:{users['carol'].pk}" in errors[0].getMessage()
    assert metric("gpuportal_security_alerts", "user") == alerts_before + 1
    assert metric("gpuportal_security_refusals", "user") == refusals_before + 10
    assert Job.objects.get(pk=job_id).state == "pending"


def test_refusals_older_than_the_window_do_not_count(users, small_job, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SECURITY_ALERT_THRESHOLD = 3
    settings.SECURITY_ALERT_WINDOW_S = 1
    job_id = api(users["alice"]).post("/api/v1/jobs/", small_job, format="json").json()["id"]
    carol = api(users["carol"])
    for _ in range(2):
        assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    time.sleep(1.2)
    assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    assert alerts() == []
    for _ in range(2):
        assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    assert len(alerts()) == 1


@pytest.mark.asyncio
async def test_reports_on_another_nodes_replica_are_audited_and_raise_an_alert(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    """S7: node one reporting on node two's replica changes nothing; each report is an audit
    entry on node one, and the fifth within the window raises an alert on node one."""
    one, _ = await greet("a100-node-1")
    two, _ = await greet("a100-node-2")
    job = await sync_to_async(place_a_job)(users["alice"])
    (replica_one,) = decode_from_portal(await one.receive_from(timeout=10)).attempts
    (replica_two,) = decode_from_portal(await two.receive_from(timeout=10)).attempts
    node_one = await Node.objects.aget(name="a100-node-1")
    alerts_before = await sync_to_async(metric)("gpuportal_security_alerts", "agent")

    for generation in range(1, 6):
        await one.send_to(text_data=status(replica_two.attempt_id, job, AttemptState.RUNNING, generation))
    await one.receive_nothing(timeout=1)
    assert (await Job.objects.aget(pk=job.pk)).state == "scheduled"
    denied = [entry async for entry in AuditEntry.objects.filter(action="agent.report.denied").order_by("id")]
    assert len(denied) == 5
    assert {(e.object_type, e.object_id) for e in denied} == {("cluster.Node", str(node_one.pk))}
    assert all(replica_two.attempt_id in e.detail for e in denied)
    (alert,) = await sync_to_async(alerts)()
    assert alert.object_id == str(node_one.pk) and f"node:{node_one.pk}" in alert.detail
    assert await sync_to_async(metric)("gpuportal_security_alerts", "agent") == alerts_before + 1
    # Node one stays connected, and its reports on its own replica still count.
    await one.send_to(text_data=status(replica_one.attempt_id, job, AttemptState.RUNNING, 1))
    await one.receive_nothing(timeout=1)
    assert (await Job.objects.aget(pk=job.pk)).state == "starting"
    await one.disconnect()
    await two.disconnect()


@pytest.mark.asyncio
async def test_unknown_tokens_and_another_nodes_name_are_audited_per_principal(users) -> None:  # type: ignore[no-untyped-def]
    """Unknown tokens count against the caller's address, a hello with another node's name
    against the token's node; five unknown tokens from one address raise an alert."""
    for i in range(5):
        communicator = WebsocketCommunicator(
            application(), "/ws/agent/", headers=[(b"authorization", f"Bearer gpp_wrong{i}".encode())]
        )
        communicator.scope["client"] = ("10.9.8.7", 40000 + i)
        connected, code = await communicator.connect()
        assert not connected and code == 4401
    denied = [e async for e in AuditEntry.objects.filter(action="agent.connect.denied").order_by("id")]
    assert len(denied) == 5 and all("10.9.8.7" in e.detail and "gpp_wrong" not in e.detail for e in denied)
    (alert,) = await sync_to_async(alerts)()
    assert "address:10.9.8.7" in alert.detail

    from portal.cluster.services import issue_node_token
    from tests.portal.agentgw.test_agent_consumer import connect, hello

    node = await Node.objects.aget(name="a100-node-1")
    token = await sync_to_async(issue_node_token)(node, None)
    communicator, connected, _ = await connect(token)
    assert connected
    await communicator.send_to(text_data=encode(hello("a100-node-2")))
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"
    (entry,) = [e async for e in AuditEntry.objects.filter(action="agent.hello.denied")]
    assert entry.object_id == str(node.pk) and "a100-node-2" in entry.detail

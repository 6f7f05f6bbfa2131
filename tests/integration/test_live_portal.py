"""The portal as a new user meets it: a real ASGI server, Celery worker and beat, PostgreSQL, Redis."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from portal.accounts.services import create_api_token
from portal.cluster.models import Node
from portal.jobs.models import JobEvent
from tests.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

JOB_YAML = """
name: resnet50
vc: vision
flavor: s-A100
command: python train.py --epochs 90
"""


def test_submit_list_cancel_over_http_and_the_other_tenant_sees_nothing(live_stack, users) -> None:  # type: ignore[no-untyped-def]
    _, alice_token = create_api_token(users["alice"], "laptop")
    _, carol_token = create_api_token(users["carol"], "laptop")
    alice = httpx.Client(base_url=live_stack["http"], headers={"Authorization": f"Bearer {alice_token}"})
    carol = httpx.Client(base_url=live_stack["http"], headers={"Authorization": f"Bearer {carol_token}"})

    created = alice.post("/api/v1/jobs/", content=JOB_YAML, headers={"Content-Type": "application/yaml"})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    listed = alice.get("/api/v1/jobs/", params={"owner": "me"}).json()["results"]
    assert [(j["id"], j["state"]) for j in listed] == [(job_id, "pending")]
    # No agent runs in this test, so no node is ready: the scheduler says so in the job's reason.
    job = wait_for(
        lambda: (j := alice.get(f"/api/v1/jobs/{job_id}/").json())["pending_reason"] not in ("", "new") and j,
        30,
        "the scheduler's reason",
    )
    assert job["state"] == "pending" and job["pending_reason"] == "no-matching-gpu"
    assert job["pending_message"] and job["queue_position"] == 1

    assert carol.get("/api/v1/jobs/").json()["count"] == 0
    assert carol.get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404

    assert alice.post(f"/api/v1/jobs/{job_id}/cancel/").json()["state"] == "cancelled"
    events = alice.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]
    assert [e["to_state"] for e in events] == ["pending", "cancelled"]
    assert httpx.get(f"{live_stack['http']}/api/v1/jobs/").status_code == 401


def test_browser_sign_in_with_session_and_csrf(live_stack, users) -> None:  # type: ignore[no-untyped-def]
    browser = httpx.Client(base_url=live_stack["http"], follow_redirects=False)
    login_page = browser.get("/api-auth/login/")
    csrf = login_page.cookies["csrftoken"]
    signed_in = browser.post(
        "/api-auth/login/",
        data={"username": "bob", "password": "bob-pass", "csrfmiddlewaretoken": csrf, "next": "/api/v1/me/"},
        headers={"Referer": f"{live_stack['http']}/api-auth/login/"},
    )
    assert signed_in.status_code == 302, signed_in.text[:500]
    assert browser.get("/api/v1/me/").json()["username"] == "bob"
    spec = {"name": "x", "vc": "vision", "flavor": "s-V100", "command": "true"}
    assert browser.post("/api/v1/jobs/", json=spec).status_code == 403  # no CSRF header
    token = browser.cookies["csrftoken"]
    assert browser.post("/api/v1/jobs/", json=spec, headers={"X-CSRFToken": token}).status_code == 201


def test_the_celery_worker_and_beat_run_the_heartbeat_check(live_stack, users) -> None:  # type: ignore[no-untyped-def]
    from portal.cluster.tasks import check_node_heartbeats

    stale = timezone.now() - timedelta(minutes=5)
    Node.objects.filter(name="a100-node-1").update(state="ready", last_heartbeat_at=stale)
    Node.objects.filter(name="a100-node-2").update(state="ready", last_heartbeat_at=timezone.now())
    assert check_node_heartbeats.delay().get(timeout=30) == {"not_ready": ["a100-node-1"], "requeued": []}
    node = Node.objects.get(name="a100-node-1")
    assert node.state == "not-ready" and "no heartbeat" in node.state_reason
    assert Node.objects.get(name="a100-node-2").state == "ready"
    # Beat triggers the same task on its own, with nobody calling it.
    Node.objects.filter(name="v100-node-1").update(state="ready", last_heartbeat_at=stale)
    wait_for(lambda: Node.objects.get(name="v100-node-1").state == "not-ready", 40, "beat to run the check")


def connections_to_the_database() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_the_web_server_shares_a_bounded_pool_of_database_connections(live_stack, users) -> None:  # type: ignore[no-untyped-def]
    # Under ASGI each request runs in a thread of its own. With a connection per thread, each
    # request left one open behind it until the garbage collector found it: a client following
    # a chatty job's output filled PostgreSQL's hundred connections in seconds.
    _, token = create_api_token(users["alice"], "laptop")
    alice = httpx.Client(base_url=live_stack["http"], headers={"Authorization": f"Bearer {token}"})
    job_id = alice.post(
        "/api/v1/jobs/", content=JOB_YAML, headers={"Content-Type": "application/yaml"}
    ).json()["id"]
    JobEvent.objects.bulk_create(
        JobEvent(job_id=job_id, actor_label="portal", reason=f"note {i}") for i in range(1000)
    )
    before = connections_to_the_database()
    most = before
    for page in range(200):
        response = alice.get(f"/api/v1/jobs/{job_id}/events/", params={"limit": 100, "offset": page * 5})
        assert response.status_code == 200
        if page % 10 == 9:
            most = max(most, connections_to_the_database())
    assert most - before <= 16, (before, most)

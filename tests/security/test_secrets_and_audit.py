"""Security posture (issue 9, point 3): secure cookies with the deploy settings, secrets kept out
of API answers, logs, task arguments and browser sockets, and an audit entry for every write.

Covered elsewhere: `check --deploy` clean with production settings in tests/portal/test_deployment.py
(S15, first half); the content security policy and throttled sign-in, token and submit endpoints
in tests/portal/test_security_headers.py; tokens shown once and stored hashed in
tests/portal/test_api_tokens.py; an audit entry for every Django admin change and node action in
tests/portal/test_admin.py; the websocket origin check in test_websockets_and_realms.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from portal.accounts.models import AuditEntry, Webhook
from tests.conftest import database_url_of_tests

REPO = Path(__file__).resolve().parents[2]

COOKIES_UNDER_DEPLOY_SETTINGS = """
import json, django
django.setup()
from django.contrib.auth.models import User
from django.test import Client

User.objects.filter(username="alice").update(password="")
alice = User.objects.get(username="alice")
alice.set_password("a long sign-in secret")
alice.save()
client = Client(HTTP_HOST="portal.example.org")
plain = client.get("/api/v1/session/")
read = client.get("/api/v1/session/", secure=True)
signed_in = client.post(
    "/api/v1/session/", {"username": "alice", "password": "a long sign-in secret"},
    content_type="application/json", secure=True,
)
def cookie(response, name):
    morsel = response.cookies[name]
    return {
        "secure": bool(morsel["secure"]), "httponly": bool(morsel["httponly"]), "samesite": morsel["samesite"]
    }
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location", "")],
    "read": read.status_code,
    "signed_in": signed_in.status_code,
    "hsts": signed_in.get("Strict-Transport-Security", ""),
    "csrftoken": cookie(read, "csrftoken"),
    "sessionid": cookie(signed_in, "sessionid"),
}))
"""


@pytest.mark.django_db(transaction=True)
def test_cookies_are_secure_under_the_deploy_settings(users) -> None:  # type: ignore[no-untyped-def]
    from django.conf import settings

    env = {
        **os.environ,
        "DEBUG": "false",
        "SECRET_KEY": "x" * 60,
        "FIELD_ENCRYPTION_KEYS": settings.FIELD_ENCRYPTION_KEYS[0],
        "ALLOWED_HOSTS": "portal.example.org",
        "CSRF_TRUSTED_ORIGINS": "https://portal.example.org",
        "DATABASE_URL": database_url_of_tests(),
    }
    result = subprocess.run(
        [sys.executable, "-c", COOKIES_UNDER_DEPLOY_SETTINGS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["plain"] == [301, "https://portal.example.org/api/v1/session/"]
    assert (seen["read"], seen["signed_in"]) == (204, 200)
    assert "max-age=31536000" in seen["hsts"] and "includeSubDomains" in seen["hsts"]
    assert seen["sessionid"] == {"secure": True, "httponly": True, "samesite": "Lax"}
    assert seen["csrftoken"]["secure"] and seen["csrftoken"]["samesite"] == "Lax"


@pytest.mark.django_db
def test_token_secrets_never_come_back_from_the_api(api_for, users) -> None:  # type: ignore[no-untyped-def]
    from portal.accounts.models import ApiToken
    from portal.cluster.models import Node
    from portal.cluster.services import issue_node_token

    alice = api_for("alice")
    created = alice.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    secret, stored_hash = created["token"], ApiToken.objects.get(pk=created["id"]).token_hash
    node_secret = issue_node_token(Node.objects.get(name="a100-node-1"), users["admin"])
    node_hash = Node.objects.get(name="a100-node-1").token_hash
    answers = [
        alice.get("/api/v1/tokens/").content,
        alice.get(f"/api/v1/tokens/{created['id']}/").content,
        api_for("admin").get("/api/v1/nodes/").content,
        api_for("admin").get("/api/v1/nodes/a100-node-1/").content,
        alice.get("/api/v1/me/").content,
    ]
    for body in answers:
        for value in (secret, stored_hash, node_secret, node_hash):
            assert value.encode() not in body
    audit = " ".join(f"{e.object_repr} {e.detail}" for e in AuditEntry.objects.all())
    assert secret not in audit and node_secret not in audit


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.django_db
def test_secrets_stay_out_of_logs_task_arguments_and_browser_messages(
    api_for, users, small_job, monkeypatch, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    """A job's environment (where users put keys), passwords and tokens appear in no log line,
    in no Celery message (tasks carry ids, if anything) and in no message to browsers."""
    from celery.signals import before_task_publish
    from rest_framework.test import APIClient

    from portal.lib.logging import JsonFormatter
    from portal.lib.redis import get_redis
    from scheduler.tasks import QUEUED_KEY

    env_secret, password = "hf_envsecret0123456789", "a sign-in secret 0123"
    marked_secret = "wandb_marked_secret_0123456789"
    published: list[Any] = []
    sent_to_browsers: list[Any] = []

    def on_publish(sender: Any = None, body: Any = None, headers: Any = None, **kwargs: Any) -> None:
        published.append((sender, body, headers))

    monkeypatch.setattr("portal.live.publish.publish", lambda channel, text: sent_to_browsers.append(text))
    before_task_publish.connect(on_publish)
    records = Recorder()
    root = logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    try:
        alice = api_for("alice")
        with django_capture_on_commit_callbacks(execute=True):
            job = alice.post(
                "/api/v1/jobs/",
                {**small_job, "env": {"HF_TOKEN": env_secret}, "secret_env": {"WANDB_KEY": marked_secret}},
                format="json",
            )
        assert job.status_code == 201
        with django_capture_on_commit_callbacks(execute=True):
            token = alice.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()["token"]
            bearer = APIClient()
            bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            assert bearer.post(f"/api/v1/jobs/{job.json()['id']}/cancel/").status_code == 200
        users["bob"].set_password(password)
        users["bob"].save()
        browser = APIClient()
        signed_in = browser.post("/api/v1/session/", {"username": "bob", "password": password}, format="json")
        assert signed_in.status_code == 200
        browser.post("/api/v1/session/", {"username": "bob", "password": password + "x"}, format="json")
    finally:
        root.removeHandler(records)
        root.setLevel(level)
        before_task_publish.disconnect(on_publish)
        get_redis().delete(QUEUED_KEY)  # this test's cycle request is nobody's business

    assert published, "a cycle request was expected to go through the broker"
    assert sent_to_browsers, "job changes were expected to go to browsers"
    assert records.records, "the requests were expected to log something"
    logged = "\n".join(JsonFormatter().format(record) for record in records.records)
    for secret in (env_secret, marked_secret, password, token):
        assert secret not in logged
        assert secret not in json.dumps(published, default=str)
        assert secret not in json.dumps(sent_to_browsers, default=str)
    for _, body, _ in published:
        args, kwargs, _ = body
        assert all(isinstance(a, int) for a in [*args, *kwargs.values()]), body


WRITE_METHODS = ("post", "put", "patch", "delete")


def write_routes() -> set[tuple[str, str]]:
    """(method, route) for every API route that accepts POST, PUT, PATCH or DELETE."""
    found: set[tuple[str, str]] = set()

    def walk(patterns: Any, prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                route = re.sub(r"(^|/)\^", r"\1", prefix + str(pattern.pattern)).removesuffix("$")
                callback = pattern.callback
                view = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
                methods = list(getattr(callback, "actions", None) or {}) or dir(view)
                found.update((m, route) for m in methods if m in WRITE_METHODS)

    walk(get_resolver().url_patterns, "")
    return {(m, r) for m, r in found if r.startswith("api/v1/") and "format" not in r}


# (method, route as the resolver spells it, who, body, the audit action expected)
AUDITED = [
    ("post", "api/v1/jobs/", "alice", "spec", "job.submit"),
    ("post", "api/v1/jobs/bulk/", "alice", "bulk", "job."),
    ("post", "api/v1/jobs/(?P<pk>[^/.]+)/cancel/", "alice", None, "job.cancel"),
    ("post", "api/v1/jobs/(?P<pk>[^/.]+)/top/", "alice", None, "job.top"),
    ("post", "api/v1/jobs/(?P<pk>[^/.]+)/hold/", "alice", None, "job.hold"),
    ("post", "api/v1/jobs/(?P<pk>[^/.]+)/release/", "alice", "held", "job.release"),
    ("post", "api/v1/jobs/(?P<pk>[^/.]+)/time-limit/", "alice", {"time_limit": "1h"}, "job.time_limit"),
    ("post", "api/v1/templates/", "alice", "template", "job_template.create"),
    ("put", "api/v1/templates/(?P<pk>[^/.]+)/", "alice", "template", "job_template.update"),
    ("patch", "api/v1/templates/(?P<pk>[^/.]+)/", "alice", {"shared": True}, "job_template.update"),
    ("delete", "api/v1/templates/(?P<pk>[^/.]+)/", "alice", None, "job_template.delete"),
    ("post", "api/v1/tokens/", "alice", {"name": "ci"}, "api_token.create"),
    ("delete", "api/v1/tokens/(?P<pk>[^/.]+)/", "alice", None, "api_token.revoke"),
    ("post", "api/v1/webhooks/", "alice", {"url": "https://93.184.215.14/hook"}, "webhook.create"),
    ("patch", "api/v1/webhooks/(?P<pk>[^/.]+)/", "alice", {"enabled": False}, "webhook.update"),
    ("delete", "api/v1/webhooks/(?P<pk>[^/.]+)/", "alice", None, "webhook.delete"),
    ("post", "api/v1/webhooks/(?P<pk>[^/.]+)/test/", "alice", None, "webhook.test"),
    (
        "post",
        "api/v1/tenants/<str:tenant>/members/",
        "vision-admin",
        {"username": "carol", "role": "viewer"},
        "member.add",
    ),
    (
        "patch",
        "api/v1/tenants/<str:tenant>/members/<str:username>/",
        "vision-admin",
        {"role": "viewer"},
        "member.role",
    ),
    ("delete", "api/v1/tenants/<str:tenant>/members/<str:username>/", "vision-admin", None, "member.remove"),
    (
        "post",
        "api/v1/nodes/(?P<name>[^/.]+)/state/",
        "admin",
        {"action": "cordon", "reason": "disk"},
        "node.cordon",
    ),
]
# Signing in and out changes no job, node or setting, nor does a dry run of a submission (a read
# that needs a body: tests/portal/test_dry_run.py checks that it writes nothing).
NOT_AUDITED = {("post", "api/v1/session/"), ("delete", "api/v1/session/"), ("post", "api/v1/jobs/dry-run/")}


def test_the_audit_table_covers_every_write_route() -> None:
    listed = {(m, r) for m, r, *_ in AUDITED} | NOT_AUDITED
    assert write_routes() - listed == set(), "a write route without an audit case"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "route", "who", "body", "action"), AUDITED, ids=[f"{a[0]} {a[1]}" for a in AUDITED]
)
def test_every_write_through_the_api_is_audited(
    api_for, users, small_job, method, route, who, body, action
) -> None:  # type: ignore[no-untyped-def]
    owner = api_for("alice")
    job = owner.post("/api/v1/jobs/", small_job, format="json").json()["id"]
    token = owner.post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()["id"]
    # On loopback: a test delivery is refused before it connects (WEBHOOK_ALLOW_PRIVATE_HOSTS).
    webhook = Webhook.objects.create(user=users["alice"], url="http://127.0.0.1:9/hook").pk
    template = owner.post("/api/v1/templates/", {"name": "saved", "spec": small_job}, format="json").json()[
        "id"
    ]
    pk = {"tokens": token, "webhooks": webhook, "templates": template}.get(route.split("/")[2], job)
    url = "/" + route.replace("(?P<pk>[^/.]+)", str(pk)).replace("(?P<name>[^/.]+)", "a100-node-1")
    url = url.replace("<str:tenant>", "vision").replace("<str:username>", "bob")
    if body == "spec":
        body = small_job
    elif body == "template":
        body = {"name": "train", "spec": small_job}
    elif body == "bulk":
        body = {"jobs": [small_job, {**small_job, "name": "second"}]}
    elif body == "held":  # only a held job can be released
        assert owner.post(f"/api/v1/jobs/{job}/hold/").status_code == 200
        body = None
    before = AuditEntry.objects.count()
    response = getattr(api_for(who), method)(url, body, format="json")
    assert response.status_code < 300, (url, response.content[:300])
    entries = list(AuditEntry.objects.order_by("id")[before:])
    assert entries and all(e.action.startswith(action) for e in entries), [e.action for e in entries]
    assert all(e.actor_id == users[who].pk for e in entries)


@pytest.mark.django_db
def test_a_secret_env_value_is_shown_to_nobody_and_given_only_to_the_job_s_agents(
    api_for, users, small_job, cluster_admin_client
) -> None:  # type: ignore[no-untyped-def]
    """S14: marked secret, a variable's value never comes back through the API, to the owner,
    a peer, another tenant or a cluster admin; only the desired set of the job's node has it.
    A clone that sends the mask back is told to give the value again."""
    from portal.agentgw.desired import desired_set_for
    from portal.cluster.models import Node
    from portal.jobs.models import Job
    from scheduler.tasks import run_cycle

    secret = "sk-live-0123456789abcdef"
    spec = {**small_job, "env": {"PLAIN": "1"}, "secret_env": {"API_KEY": secret}}
    created = api_for("alice").post("/api/v1/jobs/", spec, format="json")
    assert created.status_code == 201, created.json()
    job_id = created.json()["id"]
    for viewer in ("alice", "bob", "admin"):
        answer = api_for(viewer).get(f"/api/v1/jobs/{job_id}/")
        assert secret.encode() not in answer.content
        assert answer.json()["spec"]["secret_env"] == {"API_KEY": "********"}
    assert api_for("carol").get(f"/api/v1/jobs/{job_id}/").status_code == 404
    page = cluster_admin_client.get(f"/admin/jobs/job/{job_id}/change/")
    assert page.status_code == 200 and b"PLAIN" in page.content and secret.encode() not in page.content

    Node.objects.update(state="ready")
    run_cycle()
    job = Job.objects.get(pk=job_id)
    node = job.attempts.get().allocations.first().node
    desired = [a for a in desired_set_for(node).attempts if a.job_id == str(job_id)]
    assert desired[0].env == {"PLAIN": "1", "API_KEY": secret}

    clone = {**spec, "secret_env": {"API_KEY": "********"}}
    refused = api_for("alice").post("/api/v1/jobs/", clone, format="json")
    assert refused.status_code == 400
    assert "API_KEY again" in refused.json()["secret_env"][0]
    twice = api_for("alice").post("/api/v1/jobs/", {**spec, "env": {"API_KEY": "x"}}, format="json")
    assert twice.status_code == 400 and "also in env" in twice.json()["secret_env"][0]

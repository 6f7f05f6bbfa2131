"""Webhooks: registration refuses what the portal must not post to, each user sees only their own,
the secret is never shown, and a job's notices reach each enabled webhook once, signed, through
the real tasks (run eagerly) against a real HTTP receiver on loopback; failures are retried only
when another try may help, and the latest outcome is kept for the user."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest
from django.db import transaction

from portal.accounts.models import Webhook
from portal.jobs.models import Job
from portal.jobs.services import mail_about_idle_job
from portal.jobs.tasks import deliver_webhook, post_idle_job, post_job_state
from tests.conftest import free_port
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = {"name": "hooked", "vc": "vision", "flavor": "s-A100", "command": "sleep 60"}
PUBLIC = "https://93.184.215.14/hooks/abc"  # an address literal: registration looks nothing up


def add(client: Any, url: str, **fields: Any) -> Any:
    return client.post("/api/v1/webhooks/", {"url": url, **fields}, format="json")


def verify(secret: str, delivery: Any) -> bool:
    """What docs/api.md tells a receiver to do."""
    timestamp = delivery.headers["X-GPU-Portal-Timestamp"]
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + delivery.body, hashlib.sha256)
    return hmac.compare_digest("sha256=" + mac.hexdigest(), delivery.headers["X-GPU-Portal-Signature"])


@pytest.mark.parametrize(
    "url",
    [
        "ftp://93.184.215.14/hook",
        "file:///etc/passwd",
        "http://127.0.0.1:8000/api/v1/jobs/",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://10.0.0.7/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://224.0.0.1/hook",
        "http://0.0.0.0/hook",
        "http://user:password@93.184.215.14/hook",
        "https://bücher.example/hook",
        "not a url",
        # IPv6 forms outside global unicast that can carry an internal IPv4 address or route inside.
        "http://[::127.0.0.1]/hook",
        "http://[::10.0.0.1]/hook",
        "http://[::ffff:0:7f00:1]/hook",
        "http://[fec0::1]/hook",
        "http://93.184.215.14/ho\x7fok",  # a character the delivery's client refuses
    ],
)
def test_registration_refuses_other_schemes_and_internal_hosts(api_for: Any, url: str) -> None:
    refused = add(api_for("alice"), url)
    assert refused.status_code == 400
    assert list(refused.json()) == ["url"], refused.json()
    assert not Webhook.objects.exists()


def test_internal_hosts_are_allowed_only_when_the_operator_says_so(api_for: Any, settings: Any) -> None:
    alice = api_for("alice")
    refusal = add(alice, "http://127.0.0.1:9/hook").json()["url"][0]
    assert "loopback" in refusal
    # What a name resolves to is not said: it would map internal names for any user.
    assert "127.0.0.1" not in add(alice, "http://localhost:9/hook").json()["url"][0]
    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True
    assert add(alice, "http://127.0.0.1:9/hook").status_code == 201


def test_field_errors_and_what_a_webhook_shows(api_for: Any) -> None:
    alice = api_for("alice")
    bad = add(alice, PUBLIC, format="xml", enabled="maybe")
    assert bad.status_code == 400 and set(bad.json()) == {"format", "enabled"}
    assert add(alice, "").json()["url"] == ["This field may not be blank."]
    created = add(alice, PUBLIC, format="json", secret="s3cret")
    assert created.status_code == 201, created.json()
    shown = created.json()
    assert shown["url"] == PUBLIC and shown["format"] == "json" and shown["enabled"] is True
    assert shown["has_secret"] is True and "secret" not in shown
    assert shown["last_delivery_at"] is None and shown["last_delivery_ok"] is None
    assert add(alice, PUBLIC).json()["format"] == "slack"  # the default


def test_a_browser_session_registers_one_too(users: Any, settings: Any) -> None:
    from django.test import Client

    settings.WEBHOOK_MAX_PER_USER = 1
    client = Client()
    client.force_login(users["alice"])
    body, json = {"url": PUBLIC}, "application/json"
    answers = [client.post("/api/v1/webhooks/", body, content_type=json) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 400]  # the limit, counted under a lock


def test_the_secret_is_never_returned(api_for: Any, receiver: WebhookReceiver) -> None:
    alice = api_for("alice")
    hook = add(alice, receiver.url, secret="do-not-show-me").json()
    answers = [
        alice.get("/api/v1/webhooks/"),
        alice.get(f"/api/v1/webhooks/{hook['id']}/"),
        alice.patch(f"/api/v1/webhooks/{hook['id']}/", {"enabled": False}, format="json"),
        alice.post(f"/api/v1/webhooks/{hook['id']}/test/"),
    ]
    for answer in answers:
        assert answer.status_code == 200, answer.json()
        assert b"do-not-show-me" not in answer.content and b'"secret"' not in answer.content
    assert Webhook.objects.get().secret == "do-not-show-me"
    cleared = alice.patch(f"/api/v1/webhooks/{hook['id']}/", {"secret": ""}, format="json").json()
    assert cleared["has_secret"] is False


def test_a_user_has_at_most_the_limit(api_for: Any, settings: Any) -> None:
    settings.WEBHOOK_MAX_PER_USER = 2
    alice = api_for("alice")
    assert [add(alice, PUBLIC).status_code for _ in range(2)] == [201, 201]
    third = add(alice, PUBLIC)
    assert third.status_code == 400
    assert third.json() == {"non_field_errors": ["You have 2 webhooks, the most allowed: delete one first."]}
    assert add(api_for("bob"), PUBLIC).status_code == 201  # a limit per user


def test_users_see_and_change_only_their_own(api_for: Any) -> None:
    alice, bob = api_for("alice"), api_for("bob")
    hook = add(alice, PUBLIC).json()["id"]
    url = f"/api/v1/webhooks/{hook}/"
    assert bob.get("/api/v1/webhooks/").json()["count"] == 0
    assert bob.get(url).status_code == 404
    assert bob.patch(url, {"enabled": False}, format="json").status_code == 404
    assert bob.post(f"{url}test/").status_code == 404
    assert bob.delete(url).status_code == 404
    assert Webhook.objects.get(pk=hook).enabled
    assert alice.get("/api/v1/webhooks/").json()["count"] == 1
    assert alice.delete(url).status_code == 204
    assert not Webhook.objects.exists()


def test_notify_is_accepted_with_a_webhook_and_no_email(api_for: Any, users: Any, settings: Any) -> None:
    settings.MAIL_ENABLED = False
    alice = api_for("alice")
    assert not users["alice"].email
    refused = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["failed"]}, format="json")
    assert "no enabled webhook" in refused.json()["notify"][0]
    hook = add(alice, PUBLIC, enabled=False).json()["id"]
    refused = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["failed"]}, format="json")
    assert refused.status_code == 400, "a disabled webhook notifies nobody"
    alice.patch(f"/api/v1/webhooks/{hook}/", {"enabled": True}, format="json")
    created = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["failed"]}, format="json")
    assert created.status_code == 201, created.json()
    assert Job.objects.get(pk=created.json()["id"]).notify_on == ["failed"]


def test_a_notified_state_reaches_each_enabled_webhook_once_signed(
    api_for: Any, receiver: WebhookReceiver, eager_tasks: None
) -> None:
    alice = api_for("alice")
    assert add(alice, receiver.url + "/json", format="json", secret="s3cret").status_code == 201
    assert add(alice, receiver.url + "/chat?channel=ml").status_code == 201
    assert add(alice, receiver.url + "/off", enabled=False).status_code == 201
    assert add(api_for("bob"), receiver.url + "/bob").status_code == 201
    job = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["cancelled"]}, format="json").json()["id"]
    assert receiver.deliveries == []
    assert alice.post(f"/api/v1/jobs/{job}/cancel/").status_code == 200

    [as_json] = receiver.to("/json")
    [as_chat] = receiver.to("/chat?channel=ml")
    assert receiver.to("/off") == [] and receiver.to("/bob") == []
    body = as_json.json()
    assert set(body) == {"event", "job_id", "job_name", "vc", "state", "reason", "url", "time", "text"}
    assert body["event"] == "job.state" and body["job_id"] == job and body["job_name"] == "hooked"
    assert (body["vc"], body["state"], body["reason"]) == ("vision", "cancelled", "cancelled by user")
    assert body["url"] == f"https://portal.example.org/jobs/{job}"
    assert body["text"] == f"Job {job} (hooked) in VC vision was cancelled: cancelled by user"
    assert as_json.headers["X-GPU-Portal-Event"] == "job.state"
    assert as_json.headers["User-Agent"].startswith("GPU-Portal-Webhooks/")
    assert verify("s3cret", as_json)
    assert not verify("another", as_json)
    assert as_chat.json() == {
        "text": f"Job {job} (hooked) in VC vision was cancelled: cancelled by user\n"
        f"https://portal.example.org/jobs/{job}"
    }
    assert "X-GPU-Portal-Signature" not in as_chat.headers  # no secret, no signature
    shown = {h["url"]: h for h in alice.get("/api/v1/webhooks/").json()["results"]}
    assert shown[receiver.url + "/json"]["last_delivery_status"] == 200
    assert shown[receiver.url + "/json"]["last_delivery_ok"] is True
    assert shown[receiver.url + "/json"]["last_delivery_event"] == "job.state"
    assert shown[receiver.url + "/off"]["last_delivery_at"] is None


def test_an_idle_job_notice_reaches_the_owners_webhooks(
    api_for: Any, receiver: WebhookReceiver, eager_tasks: None
) -> None:
    alice = api_for("alice")
    add(alice, receiver.url + "/idle", format="json")
    job = alice.post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    with transaction.atomic():
        mail_about_idle_job(job, "idle: every GPU under 5 % utilization for 30 min")
        assert receiver.deliveries == []  # never inside the transaction
    [delivery] = receiver.to("/idle")
    assert delivery.json()["event"] == "job.idle" and delivery.json()["job_id"] == job
    assert delivery.json()["reason"] == "idle: every GPU under 5 % utilization for 30 min"


def test_a_posting_task_run_again_sends_the_same_delivery_ids(
    api_for: Any, receiver: WebhookReceiver, eager_tasks: None
) -> None:
    """A worker lost while posting (acks late): the task runs again under its own id, and the
    receivers must be able to drop the repeat."""
    alice = api_for("alice")
    add(alice, receiver.url + "/a", format="json")
    add(alice, receiver.url + "/b")
    job = alice.post("/api/v1/jobs/", SPEC, format="json").json()["id"]

    def delivery_ids(task: Any, args: tuple[Any, ...], task_id: str) -> dict[str, str]:
        receiver.deliveries.clear()
        assert task.apply(args=args, task_id=task_id).get() == 2
        return {d.path: d.headers["X-GPU-Portal-Delivery"] for d in receiver.deliveries}

    for task, args in [(post_job_state, (job, "failed", "exit code 1")), (post_idle_job, (job, "idle"))]:
        first = delivery_ids(task, args, "posting-1")
        assert set(first) == {"/a", "/b"} and first["/a"] != first["/b"]
        assert delivery_ids(task, args, "posting-1") == first
        again = delivery_ids(task, args, "posting-2")
        assert set(again.values()).isdisjoint(first.values())


def test_a_chat_message_cannot_mention_or_link_through_a_jobs_name() -> None:
    from portal.accounts.webhooks import event, render

    payload = event("job.state", "Job 7 (<!channel>) in VC vision failed: a & b", url="https://p/jobs/7")
    assert render("slack", payload) == (
        b'{"text":"Job 7 (&lt;!channel&gt;) in VC vision failed: a &amp; b\\nhttps://p/jobs/7"}'
    )


def webhook_to(user: Any, url: str, secret: str = "") -> Webhook:
    return Webhook.objects.create(user=user, url=url, format="json", secret=secret)


def deliver(webhook: Webhook) -> dict[str, Any]:
    payload = {"event": "job.state", "url": "", "text": "Job 1 (x) in VC vision failed."}
    return deliver_webhook.apply(args=(webhook.pk, payload, "delivery-1")).get()


def test_a_5xx_or_429_is_tried_again_until_it_succeeds(users: Any, receiver: WebhookReceiver) -> None:
    webhook = webhook_to(users["alice"], receiver.url + "/flaky")
    receiver.answer(500, 429, 503)
    assert deliver(webhook) == {"ok": True, "status": 200, "error": "", "retry": False}
    attempts = receiver.to("/flaky")
    assert len(attempts) == 4
    assert {a.headers["X-GPU-Portal-Delivery"] for a in attempts} == {"delivery-1"}  # for dropping repeats
    webhook.refresh_from_db()
    assert (webhook.last_delivery_status, webhook.last_delivery_ok) == (200, True)


def test_retries_end_and_the_last_failure_is_kept(users: Any, receiver: WebhookReceiver) -> None:
    webhook = webhook_to(users["alice"], receiver.url + "/down")
    receiver.answer(502, 502, 502, 502, 502)
    assert deliver(webhook)["status"] == 502
    assert len(receiver.to("/down")) == 4  # the first try and three more
    webhook.refresh_from_db()
    assert (webhook.last_delivery_status, webhook.last_delivery_ok) == (502, False)


def test_another_4xx_is_not_tried_again(users: Any, receiver: WebhookReceiver) -> None:
    webhook = webhook_to(users["alice"], receiver.url + "/gone")
    receiver.answer(404)
    assert deliver(webhook) == {"ok": False, "status": 404, "error": "", "retry": False}
    assert len(receiver.to("/gone")) == 1
    webhook.refresh_from_db()
    assert webhook.last_delivery_status == 404 and webhook.last_delivery_at is not None


def test_a_redirect_is_not_followed(users: Any, receiver: WebhookReceiver) -> None:
    webhook = webhook_to(users["alice"], receiver.url + "/moved")
    receiver.answer(302)
    outcome = deliver(webhook)
    assert (outcome["status"], outcome["retry"]) == (302, False)
    assert "redirect" in outcome["error"]
    assert len(receiver.deliveries) == 1


def test_a_network_error_is_tried_again_and_recorded(
    users: Any, receiver: WebhookReceiver, monkeypatch: Any
) -> None:
    from portal.accounts import webhooks

    tries = []
    post = webhooks.post
    monkeypatch.setattr(webhooks, "post", lambda *args: tries.append(args) or post(*args))
    webhook = webhook_to(users["alice"], f"http://127.0.0.1:{free_port()}/nobody-listens")
    outcome = deliver(webhook)
    assert outcome["status"] is None and "ConnectError" in outcome["error"]
    assert len(tries) == 4
    webhook.refresh_from_db()
    assert webhook.last_delivery_status is None and "ConnectError" in webhook.last_delivery_error


def test_the_address_is_checked_again_at_delivery(
    users: Any, receiver: WebhookReceiver, settings: Any
) -> None:
    """A webhook registered while internal hosts were allowed (or whose name now resolves to an
    internal address) gets no request once they are not."""
    webhook = webhook_to(users["alice"], receiver.url + "/internal")
    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = False
    outcome = deliver(webhook)
    assert outcome["retry"] is False and "loopback" in outcome["error"]
    assert receiver.deliveries == []
    webhook.refresh_from_db()
    assert "loopback" in webhook.last_delivery_error


def test_the_test_action_delivers_at_once_and_reports(
    api_for: Any, users: Any, receiver: WebhookReceiver
) -> None:
    alice = api_for("alice")
    hook = add(alice, receiver.url + "/test", format="json", secret="s3cret", enabled=False).json()["id"]
    tested = alice.post(f"/api/v1/webhooks/{hook}/test/")
    assert tested.status_code == 200
    assert tested.json()["last_delivery_status"] == 200 and tested.json()["last_delivery_ok"] is True
    assert tested.json()["last_delivery_event"] == "webhook.test"
    [delivery] = receiver.to("/test")
    assert delivery.json()["event"] == "webhook.test" and verify("s3cret", delivery)
    receiver.answer(404)
    failed = alice.post(f"/api/v1/webhooks/{hook}/test/").json()
    assert (failed["last_delivery_status"], failed["last_delivery_ok"]) == (404, False)
    assert len(receiver.to("/test")) == 2  # a test is never retried


def test_cluster_admins_see_webhooks_by_host_and_never_the_secret(
    cluster_admin_client: Any, users: Any
) -> None:
    webhook = webhook_to(users["alice"], "https://93.184.215.14/services/T0/B0/credential", "s3cret")
    for url in ["/admin/accounts/webhook/", f"/admin/accounts/webhook/{webhook.pk}/change/"]:
        page = cluster_admin_client.get(url)
        assert page.status_code == 200
        assert b"93.184.215.14" in page.content
        assert b"credential" not in page.content and b"s3cret" not in page.content
    disabled = cluster_admin_client.post(
        f"/admin/accounts/webhook/{webhook.pk}/change/", {"enabled": ""}, follow=False
    )
    assert disabled.status_code == 302
    webhook.refresh_from_db()
    assert webhook.enabled is False and webhook.secret == "s3cret"


def test_the_url_and_the_secret_are_stored_encrypted(users: Any) -> None:
    from django.db import connection

    webhook = webhook_to(users["alice"], "https://93.184.215.14/services/T0/B0/credential", "s3cret")
    with connection.cursor() as cursor:
        cursor.execute("SELECT url, secret FROM accounts_webhook WHERE id = %s", [webhook.pk])
        url, secret = cursor.fetchone()
    assert "credential" not in url and "s3cret" not in secret
    assert Webhook.objects.get().url.endswith("/credential")

"""Mail about jobs (the spec's `notify`, and idle GPUs): refused at submission when it could not
be sent, and sent over real SMTP (the session's aiosmtpd server) to the right people. The path
through a transition and the worker is tests/integration/test_scheduling_loop.py's."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import Membership
from portal.jobs import notifications
from portal.jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = {"name": "mail-me", "vc": "vision", "flavor": "s-A100", "command": "sleep 60"}


@pytest.fixture
def smtp(settings: Any, mailbox: Any) -> Any:
    settings.MAIL_ENABLED, settings.MAILERS = True, mailbox.mailers()
    settings.PORTAL_URL = "https://portal.example.org/"
    return mailbox


def test_notify_is_refused_when_no_mail_could_be_sent(api_for: Any, users: Any, settings: Any) -> None:
    alice = api_for("alice")
    settings.MAIL_ENABLED = False
    refused = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["failed"]}, format="json")
    assert refused.json() == {
        "notify": [
            "This portal sends no mail (its SMTP_HOST is not set) and you have no enabled webhook "
            "to notify: add one on the Tokens & webhooks page."
        ]
    }
    settings.MAIL_ENABLED = True
    refused = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["failed"]}, format="json")
    assert refused.json() == {
        "notify": [
            "Your account has no email address and no enabled webhook to notify: add a webhook on the "
            "Tokens & webhooks page, or ask a cluster admin to set your address."
        ]
    }
    unknown = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["exploded"]}, format="json")
    assert unknown.status_code == 400 and "notify" in unknown.json()
    assert not Job.objects.exists()
    users["alice"].email = "alice@example.org"
    users["alice"].save(update_fields=["email"])
    created = alice.post("/api/v1/jobs/", {**SPEC, "notify": ["failed", "running", "failed"]}, format="json")
    assert created.status_code == 201, created.json()
    assert Job.objects.get(pk=created.json()["id"]).notify_on == ["failed", "running"]


def test_a_state_mail_goes_to_the_owner_with_a_link(api_for: Any, users: Any, smtp: Any) -> None:
    users["alice"].email = "alice@example.org"
    users["alice"].save(update_fields=["email"])
    job_id = api_for("alice").post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    assert notifications.mail_job_state(job_id, "failed", "exit code 3") == 1
    [mail] = smtp.about(f"Job {job_id} ")
    assert str(mail["Subject"]) == f"Job {job_id} (mail-me) failed"
    assert mail["X-Envelope-To"] == "alice@example.org"
    body = mail.get_content()
    assert f"Job {job_id} (mail-me) in VC vision failed: exit code 3" in body
    assert f"https://portal.example.org/jobs/{job_id}" in body


def test_an_idle_job_mail_goes_to_the_owner_and_the_tenants_admins(
    api_for: Any, users: Any, smtp: Any
) -> None:
    for name in ("bob", "vision-admin", "carol"):  # carol administers nothing of vision's
        users[name].email = f"{name}@example.org"
        users[name].save(update_fields=["email"])
    Membership.objects.filter(user=users["carol"]).update(role="admin")
    job_id = api_for("bob").post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    assert notifications.mail_idle_job(job_id, "idle: every GPU under 5 % utilization for 30 min") == 1
    [mail] = smtp.about(f"Job {job_id} (mail-me) is idle")
    assert mail["X-Envelope-To"] == "bob@example.org, vision-admin@example.org"
    assert "of bob in VC vision is idle: every GPU under 5 % utilization for 30 min." in mail.get_content()


def test_a_member_removed_from_the_tenant_hears_nothing_more_of_their_jobs(
    api_for: Any, users: Any, smtp: Any
) -> None:
    """Their jobs stay with the tenant, whose admins still hear of them; they no longer see the
    tenant's jobs, so no mail or webhook body tells them of one either."""
    from portal.jobs.notifications import idle_job_event, job_state_event

    for name in ("bob", "vision-admin"):
        users[name].email = f"{name}@example.org"
        users[name].save(update_fields=["email"])
    job_id = api_for("bob").post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    assert job_state_event(job_id, "failed", "exit code 1") is not None
    Membership.objects.filter(user=users["bob"], tenant__name="vision").delete()

    assert notifications.mail_job_state(job_id, "failed", "exit code 1") == 0
    assert job_state_event(job_id, "failed", "exit code 1") is None
    assert idle_job_event(job_id, "idle") is None
    assert notifications.mail_idle_job(job_id, "idle: every GPU under 5 % utilization for 30 min") == 1
    [mail] = smtp.about(f"Job {job_id} (mail-me) is idle")
    assert mail["X-Envelope-To"] == "vision-admin@example.org"
    assert smtp.about(f"Job {job_id} (mail-me) failed") == []

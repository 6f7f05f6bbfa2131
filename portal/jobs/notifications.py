"""Notices about jobs: to the owner when a job reaches a state its spec's `notify` names, by mail
and to each of their enabled webhooks; when a job's GPUs sit idle, by mail to the owner and the
tenant's admins and to the owner's webhooks. Sent by the worker (portal.jobs.tasks), never inside
the transaction that changed the job; no mail while SMTP_HOST is empty."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from portal.accounts import webhooks
from portal.accounts.choices import Role
from portal.accounts.models import Membership
from portal.jobs.models import Job

STATE_WORDS = {
    "running": "is running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "was cancelled",
    "timed-out": "timed out",
    "preempted": "was preempted",
}


def portal_url(path: str) -> str:
    """A page of the web app, as a link in a mail or webhook body."""
    return f"{settings.PORTAL_URL.rstrip('/')}{path}"


def job_url(job_id: int) -> str:
    return portal_url(f"/jobs/{job_id}")


def tenant_admins(tenant_id: int) -> Any:
    """The active admins of a tenant: who hears about its jobs and VCs beside their owners."""
    from django.contrib.auth import get_user_model

    admins = get_user_model().objects.filter(
        memberships__tenant_id=tenant_id, memberships__role=Role.ADMIN, is_active=True
    )
    return admins.order_by("username")


def still_member(job: Job) -> bool:
    """Whether the job's owner may still hear about it: a member removed from the tenant keeps
    no view of its jobs (theirs stay with the tenant), so no mail or webhook tells them either."""
    return Membership.objects.filter(
        tenant_id=job.tenant_id, user_id=job.owner_id, user__is_active=True
    ).exists()


def mail_job_state(job_id: int, state: str, reason: str) -> int:
    """Mails the owner that the job reached `state`; returns the number of mails sent (0 or 1)."""
    job = Job.objects.select_related("owner", "virtual_cluster").filter(pk=job_id).first()
    if job is None or not settings.MAIL_ENABLED or not job.owner.email or not still_member(job):
        return 0
    words = STATE_WORDS.get(state, state)
    body = (
        f"Job {job.pk} ({job.name}) in VC {job.virtual_cluster.name} {words}"
        + (f": {reason}" if reason else ".")
        + f"\n\n{job_url(job.pk)}\n\nYou get this mail because the job's spec asks for it (notify).\n"
    )
    return send_mail(f"Job {job.pk} ({job.name}) {words}", body, None, [job.owner.email])


def mail_idle_job(job_id: int, message: str) -> int:
    """Mails the owner and the admins of the job's tenant that its GPUs are idle."""
    job = Job.objects.select_related("owner", "virtual_cluster", "tenant").filter(pk=job_id).first()
    if job is None:  # deleted since
        return 0
    owner = [job.owner.email] if still_member(job) else []
    admins = tenant_admins(job.tenant_id).values_list("email", flat=True)
    to = sorted({address for address in [*owner, *admins] if address})
    if not settings.MAIL_ENABLED or not to:
        return 0
    body = (
        f"Job {job.pk} ({job.name}) of {job.owner.username} in VC {job.virtual_cluster.name} is {message}."
        f"\nIts GPUs are held but unused; cancel it if it is stuck.\n\n{job_url(job.pk)}\n"
    )
    return send_mail(f"Job {job.pk} ({job.name}) is idle", body, None, to)


def notify_problem(user: Any) -> str | None:
    """Why a spec's `notify` would reach nobody, or None: the owner needs an address the portal
    can mail to, or an enabled webhook."""
    if settings.MAIL_ENABLED and user.email:
        return None
    if webhooks.has_enabled_webhook(user):
        return None
    if not settings.MAIL_ENABLED:
        return (
            "This portal sends no mail (its SMTP_HOST is not set) and you have no enabled webhook "
            "to notify: add one on the Tokens & webhooks page."
        )
    return (
        "Your account has no email address and no enabled webhook to notify: add a webhook on the "
        "Tokens & webhooks page, or ask a cluster admin to set your address."
    )


def job_state_event(job_id: int, state: str, reason: str) -> tuple[int, dict[str, Any]] | None:
    """The owner and the webhook body telling that the job reached `state`; None when the job
    was deleted since."""
    words = STATE_WORDS.get(state, state) + (f": {reason}" if reason else ".")
    return _job_event(job_id, webhooks.JOB_STATE, words, state, reason)


def idle_job_event(job_id: int, message: str) -> tuple[int, dict[str, Any]] | None:
    """The owner and the webhook body telling that the job's GPUs sit idle."""
    words = f"is {message}: its GPUs are held but unused."
    return _job_event(job_id, webhooks.JOB_IDLE, words, None, message)


def _job_event(
    job_id: int, kind: str, words: str, state: str | None, reason: str
) -> tuple[int, dict[str, Any]] | None:
    """The job is read when the notice is sent: one deleted since, or whose owner has left the
    tenant since, gets none, and an idle notice (`state` None) tells the state the job is in by
    then."""
    job = Job.objects.select_related("virtual_cluster").filter(pk=job_id).first()
    if job is None or not still_member(job):
        return None
    vc = job.virtual_cluster.name
    payload = webhooks.event(
        kind,
        f"Job {job.pk} ({job.name}) in VC {vc} {words}",
        job_id=job.pk,
        job_name=job.name,
        vc=vc,
        state=job.state if state is None else state,
        reason=reason,
        url=job_url(job.pk),
    )
    return job.owner_id, payload

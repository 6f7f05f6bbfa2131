"""Mail about jobs: to the owner when a job reaches a state its spec's `notify` names, and to the
owner and the tenant's admins when a job's GPUs sit idle. Sent by the worker (portal.jobs.tasks),
never inside the transaction that changed the job; no mail while SMTP_HOST is empty."""

from __future__ import annotations

from django.conf import settings
from django.core.mail import send_mail

from portal.accounts.choices import Role
from portal.jobs.models import Job

STATE_WORDS = {
    "running": "is running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "was cancelled",
    "timed-out": "timed out",
    "preempted": "was preempted",
}


def job_url(job_id: int) -> str:
    return f"{settings.PORTAL_URL.rstrip('/')}/jobs/{job_id}"


def mail_job_state(job_id: int, state: str, reason: str) -> int:
    """Mails the owner that the job reached `state`; returns the number of mails sent (0 or 1)."""
    job = (
        Job.objects.select_related("owner", "virtual_cluster")
        .only("name", "owner__email", "virtual_cluster__name")
        .filter(pk=job_id)
        .first()
    )
    if job is None or not settings.MAIL_ENABLED or not job.owner.email:
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
    admins = job.tenant.memberships.filter(role=Role.ADMIN).values_list("user__email", flat=True)
    to = sorted({address for address in [job.owner.email, *admins] if address})
    if not settings.MAIL_ENABLED or not to:
        return 0
    body = (
        f"Job {job.pk} ({job.name}) of {job.owner.username} in VC {job.virtual_cluster.name} is {message}."
        f"\nIts GPUs are held but unused; cancel it if it is stuck.\n\n{job_url(job.pk)}\n"
    )
    return send_mail(f"Job {job.pk} ({job.name}) is idle", body, None, to)

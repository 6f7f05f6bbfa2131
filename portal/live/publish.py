"""Pushing changes to browsers: after commit, to the topics of the job and of its tenant, over
Redis pub/sub to every web process (portal.live.hub).

A message is only a hint that something changed, with enough data to redraw; a browser that
missed one resyncs over the REST API on reconnect.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from portal.lib.channels import publish
from portal.live.hub import channel_for


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


ALL_JOBS_GROUP = "jobs.all"  # cluster admins


def user_group(user_id: int) -> str:
    """Every live socket of one user: told when what the user may see changes."""
    return f"user.{user_id}"


def publish_job_change(job: Any) -> None:
    """Call inside the transaction that changed the job."""
    payload = job_payload(job)
    groups = [job_group(job.pk), tenant_group(job.tenant_id), ALL_JOBS_GROUP]
    transaction.on_commit(lambda: _send(groups, payload))


def publish_replica_change(job: Any) -> None:
    """A replica's reported state or message changed and the job did not move (an image pull's
    progress, about once a second while it lasts): only the job's page shows replicas, so only
    its topic hears, and no job list refetches for it. Call inside the transaction."""
    payload = job_payload(job)
    transaction.on_commit(lambda: _send([job_group(job.pk)], payload))


def job_payload(job: Any) -> dict[str, Any]:
    return {
        "kind": "job",
        "job": job.pk,
        "state": job.state,
        "pending_reason": job.pending_reason,
        "pending_message": job.pending_message,
        "version": job.version,
    }


def publish_log_lines(job_id: int, attempt_number: int, lines: list[dict[str, Any]]) -> None:
    if lines:
        payload = {"kind": "log", "job": job_id, "attempt": attempt_number, "lines": lines}
        transaction.on_commit(lambda: _send([job_group(job_id)], payload))


def publish_telemetry(job_id: int, samples: list[dict[str, Any]]) -> None:
    _send([job_group(job_id)], {"kind": "telemetry", "job": job_id, "samples": samples})


def token_key(token_id: int) -> str:
    """The key, in place of a session key, of the sockets an API token opened (they have no
    session), published when the token is revoked or deleted. No session key looks like it, so
    a sign-out never closes a socket opened with a token, nor a revocation a browser's."""
    return f"token:{token_id}"


def publish_access_change(user_id: int, session_key: str | None = None, tenant_id: int | None = None) -> None:
    """The user's open sockets close (or only those of `session_key`: a session's at a sign-out,
    a token's, token_key, when it is revoked), so that none goes on hearing of jobs the user may
    no longer see, nor typing into a shell with credentials that no longer hold; a browser still
    signed in reconnects and subscribes to what it may see now. A change of one membership names
    its tenant: shells in other tenants' jobs stay open (one tenant's admins must not be able to
    close what a user does in another tenant). Sent after commit, as the change it follows."""
    payload = {"kind": "access", "session": session_key, "tenant": tenant_id}
    transaction.on_commit(lambda: _send([user_group(user_id)], payload))


def _send(groups: list[str], payload: dict[str, Any]) -> None:
    # Encoded once here, not once per browser: each web process writes it to its browsers as is.
    text = json.dumps(payload)
    publish([channel_for(group) for group in groups], text)

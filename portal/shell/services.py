"""Shell sessions in running jobs: who may open one, where it runs, and how many are open.

A shell runs inside the job's container (or, for the process runtime, in its environment), so
it sees the job's secret variables and its files: only the job's owner may open one, and only
while the owner may still submit in the job's tenant (a viewer may not). Another tenant's job is
refused exactly like one that does not exist. Refusals are audited and counted towards security
alerts like refused API writes (portal.accounts.security).

The portal relays between the browser and the agent of the node that runs the replica; the
agent knows the replica by its attempt id (portal.agentgw.desired.agent_attempt_id).

Open sessions are counted per user in Redis, shared by every web process: a sorted set of
session ids, each with a lease that its consumer renews while the socket is open, so that a
session whose web process died stops counting once its lease runs out.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.utils import timezone

from portal.accounts.choices import SUBMIT_ROLES
from portal.accounts.models import ApiToken, Membership
from portal.accounts.security import record_refusal
from portal.accounts.services import record_audit
from portal.agentgw.desired import agent_attempt_id
from portal.cluster.models import Node
from portal.jobs.choices import JobState
from portal.jobs.models import Allocation, Job
from portal.lib.redis import get_redis

CLOSE_NOT_FOUND = 4404
CLOSE_FORBIDDEN = 4403

DEFAULT_COLS, DEFAULT_ROWS = 80, 24
MAX_TERMINAL_SIZE = 1000  # columns or rows, as the agent protocol allows

# A session counts towards its user's limit for this long after its consumer last renewed it
# (every third of it): a web process that dies stops holding its users' slots within this time.
SLOT_LEASE_S = 90


class ShellRefused(Exception):
    """The user may not open a shell in this job; `code` is the websocket close code."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True)
class ShellOptions:
    """What the browser asked for in the query string."""

    replica: int | None  # None: not a whole number from 0
    cols: int
    rows: int


@dataclass(frozen=True)
class ShellTarget:
    """Where a session runs: the replica, the agent's attempt id for it, and its node."""

    replica: int
    attempt_id: str
    node_id: int
    node_name: str


def shell_group(session: str) -> str:
    """The channel-layer group of one session: its browser socket, and nothing else."""
    return f"shell.{session}"


def shell_node_group(node_id: int) -> str:
    """The channel-layer group of every shell socket on one node: told when a connection of the
    node's agent closes, which ends the shells it opened."""
    return f"shell-node.{node_id}"


def new_session_id() -> str:
    """Unguessable, and valid as an agent protocol identifier."""
    return uuid.uuid4().hex


def parse_options(query_string: bytes) -> ShellOptions:
    """`replica` (0 by default), `cols` and `rows` (80 x 24 by default, held to 1..1000). A
    terminal size that is not a whole number gets the default; a replica that is not one is
    answered like a replica the job does not have."""
    query = parse_qs(query_string.decode("latin-1"))

    def number(name: str) -> int | None:
        values = query.get(name)
        try:
            return int(values[-1]) if values else None
        except ValueError:
            return None

    replica = number("replica") if "replica" in query else 0
    cols, rows = number("cols"), number("rows")
    return ShellOptions(
        replica=replica if replica is not None and replica >= 0 else None,
        cols=DEFAULT_COLS if cols is None else max(1, min(MAX_TERMINAL_SIZE, cols)),
        rows=DEFAULT_ROWS if rows is None else max(1, min(MAX_TERMINAL_SIZE, rows)),
    )


def authorize(user: Any, job_id: int) -> Job:
    """The job, if `user` may open a shell in it; else ShellRefused with 4404 (not visible, or
    no such job: the same answer) or 4403 (visible, but not the user's own job, or the user is
    only a viewer of its tenant now). The job's secret variables are not loaded."""
    job = (
        Job.objects.for_user(user)
        .filter(pk=job_id)
        .select_related("tenant")
        .defer("spec", "secret_env", "whatif_hints")
        .first()
    )
    if job is None:
        _refused(user, job_id, None, "no such job, or another tenant's")
        raise ShellRefused(CLOSE_NOT_FOUND, "not found")
    if job.owner_id != user.pk:
        _refused(user, job_id, job, "not the job's owner")
        raise ShellRefused(CLOSE_FORBIDDEN, "only the job's owner may open a shell in it")
    # The owner, a member or admin of the job's tenant now: not a viewer, and not a cluster admin
    # by that right alone (a shell is inside the tenant's work, as the API docs say).
    if not Membership.objects.filter(user=user, tenant_id=job.tenant_id, role__in=SUBMIT_ROLES).exists():
        _refused(user, job_id, job, "not a member of the job's tenant, or only a viewer")
        raise ShellRefused(CLOSE_FORBIDDEN, "a viewer may not open a shell")
    return job


def _refused(user: Any, job_id: int, job: Job | None, why: str) -> None:
    if job is None:  # as the API does: name the job when it exists at all, in any tenant
        job = (
            Job.objects.select_related("tenant")
            .defer("spec", "secret_env", "whatif_hints")
            .filter(pk=job_id)
            .first()
        )
    record_refusal(
        "user",
        f"user:{user.pk}",
        "job.shell.open",
        actor=user,
        obj=job,
        object_type="jobs.Job",
        object_id=str(job_id),
        detail=f"shell in job {job_id}: {why}",
    )


def find_target(job: Job, replica: int | None) -> ShellTarget | str:
    """Where the replica runs now, or why a shell cannot open there (in words, for the user)."""
    if job.state != JobState.RUNNING:
        return f"job {job.pk} is {job.state}, not running"
    attempt = job.current_attempt()
    if attempt is None or replica is None or replica >= attempt.replicas:
        count = attempt.replicas if attempt is not None else 0
        return f"job {job.pk} has no such replica (it runs {count}, numbered from 0)"
    reported = (attempt.replica_states.get(str(replica)) or {}).get("state")
    if reported != "running":
        return f"replica {replica} of job {job.pk} is not running ({reported or 'not started'})"
    allocation = (
        Allocation.objects.filter(attempt=attempt, replica=replica, released_at__isnull=True)
        .select_related("node")
        .first()
    )
    if allocation is None:
        return f"replica {replica} of job {job.pk} is not placed on any node"
    node = allocation.node
    if not agent_connected(node):
        return f"the agent of node {node.name} is not connected"
    return ShellTarget(
        replica=replica, attempt_id=agent_attempt_id(attempt, replica), node_id=node.pk, node_name=node.name
    )


def agent_connected(node: Node) -> bool:
    """Heard from within NODE_SILENT_AFTER_S, and not revoked: the portal's own notion of a
    connected agent (a session opened on an agent that left meanwhile ends on the open timeout)."""
    cutoff = timezone.now() - timedelta(seconds=settings.NODE_SILENT_AFTER_S)
    heard = node.last_heartbeat_at
    return node.revoked_at is None and heard is not None and heard >= cutoff


def prepare(user: Any, job_id: int, replica: int | None) -> tuple[Job, ShellTarget | str]:
    """authorize, then find_target: one call, so one hop to the database thread."""
    job = authorize(user, job_id)
    return job, find_target(job, replica)


def record_open(
    user: Any, job: Job, target: ShellTarget, session: str, token: ApiToken | None = None
) -> None:
    """Audited with where the shell runs and, when an API token opened it, which (its name and
    prefix: tokens may share a name)."""
    record_audit(user, "job.shell.open", job, tenant=job.tenant, detail=_where(target, session, token))


def record_close(
    user: Any,
    job: Job,
    target: ShellTarget,
    session: str,
    seconds: float,
    how: str,
    token: ApiToken | None = None,
) -> None:
    detail = f"{_where(target, session, token)}; open {round(seconds)} s; {how}"
    record_audit(user, "job.shell.close", job, tenant=job.tenant, detail=detail)


def _where(target: ShellTarget, session: str, token: ApiToken | None) -> str:
    where = f"replica {target.replica} on node {target.node_name}, session {session}"
    return f"{where}, token {token}" if token is not None else where


# Open sessions per user (see the module's docstring). The scripts read Redis's clock, so that
# web processes whose clocks differ agree on when a lease ends.
_CLAIM = """
local now = tonumber(redis.call('TIME')[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""
_RENEW = """
local now = tonumber(redis.call('TIME')[1])
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


def _slots_key(user_id: int) -> str:
    return f"shell:sessions:{user_id}"


def claim_slot(user_id: int, session: str) -> bool:
    """Counts the session towards the user's SHELL_MAX_SESSIONS_PER_USER; False when the user
    has that many open already. Checked and counted in one step, so two opens at once by the
    same user in two processes cannot both take the last slot."""
    limit = settings.SHELL_MAX_SESSIONS_PER_USER
    return bool(get_redis().eval(_CLAIM, 1, _slots_key(user_id), limit, SLOT_LEASE_S, session))


def renew_slot(user_id: int, session: str) -> None:
    get_redis().eval(_RENEW, 1, _slots_key(user_id), SLOT_LEASE_S, session)


def release_slot(user_id: int, session: str) -> None:
    get_redis().zrem(_slots_key(user_id), session)


def record_foreign_message(node_id: int, target: ShellTarget, session: str) -> None:
    """An agent sent output or an exit for a session that runs on another node: audited as a
    refusal of that node, and counted towards an alert on it."""
    record_refusal(
        "agent",
        f"node:{node_id}",
        "agent.shell",
        obj=Node.objects.filter(pk=node_id).first(),
        object_type="cluster.Node",
        object_id=str(node_id),
        detail=f"a message for shell session {session}, which runs on node {target.node_name}",
    )

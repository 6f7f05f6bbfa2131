"""A random walk through the portal's own scheduling path on PostgreSQL.

The core's property tests check random steps against a model of the store; this walks the
store itself. Jobs are submitted through the REST API (production jobs by tenant admins, some
with a time limit that runs out), and agents report through the service their gateway calls.
Nodes are lost and come back, admins cordon, drain and uncordon them and cut and raise quotas,
GPUs fail, and jobs finish, fail or are cancelled; a squeeze keeps a suspended job from coming
back while the other tenant asks for its GPU model. After every step a scheduling cycle runs, under the
introspective profile with a time-slice turn every cycle. The invariants of every scheduling
test (I1-I6) hold after each step, and a VC whose quota was cut below what it held never
gains GPUs above its limit. Each seed is one fixed walk, so a failure replays exactly.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.protocol import ExitReason, GpuSample
from portal.cluster.choices import NodeState
from portal.cluster.models import Gpu, Node, Quota
from portal.cluster.services import record_gpu_health, set_node_state
from portal.jobs.choices import TERMINAL_STATES, JobState
from portal.jobs.models import Allocation, Job
from portal.jobs.services import enforce_time_limits, requeue_jobs_of_lost_node
from scheduler.tasks import run_cycle
from tests.integration.invariants import assert_all_invariants
from tests.integration.scripted_agents import ScriptedAgents
from tests.portal.test_time_slicing_store import every_cycle_a_new_turn

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 100
USERS = {
    "alice": "vision",
    "bob": "vision",
    "vision-admin": "vision",
    "carol": "speech",
    "dave": "speech",
    "speech-admin": "speech",
}
PRIORITIES = ["opportunistic", "dev", "training"]
STEP_KINDS = ["submit"] * 4 + ["agents"] * 3 + ["end"] * 2 + ["admin"] * 2
STEP_KINDS += ["cancel", "node_lost", "node_back", "quota", "gpu_fail", "time_limits", "squeeze"]


def held_gpus(vc_id: int, model: str) -> int:
    """GPUs the VC holds as the invariants count them (parked time-slice allocations do not)."""
    return Allocation.objects.filter(
        released_at__isnull=True,
        suspended=False,
        attempt__job__virtual_cluster_id=vc_id,
        gpu__model=model,
    ).count()


def submit(
    rng: random.Random,
    clients: dict[str, Any],
    acknowledged: set[int],
    step: int,
    users: list[str] | None = None,
    model: str | None = None,
) -> None:
    user = rng.choice(users or sorted(USERS))
    spec = {
        "name": f"walk-{step}",
        "vc": USERS[user],
        "flavor": f"{rng.choice('ssml')}-{model or rng.choice(['A100', 'V100'])}",
        "command": "sleep 600",
        "replicas": rng.choice([1, 1, 2]),
        # Production is for tenant admins.
        "priority": rng.choice(PRIORITIES + (["production"] if user.endswith("-admin") else [])),
        "time_limit": rng.choice(["1h", "1h", "2m"]),
        "time_sliceable": rng.random() < 0.5,
        "checkpoint": {"enabled": rng.random() < 0.5},
    }
    response = clients[user].post("/api/v1/jobs/", spec, format="json")
    # A job that cannot fit its VC's quota (cut by an admin) is refused with a field error.
    assert response.status_code in (201, 400), response.content
    if response.status_code == 400:
        assert isinstance(response.json(), dict) and response.json(), response.content
        return
    acknowledged.add(int(response.json()["id"]))


def squeeze_a_suspended_job(
    rng: random.Random, clients: dict[str, Any], acknowledged: set[int], step: int
) -> None:
    """Cut the quota of a suspended job's VC to what the VC holds, so the job cannot come back
    to its GPUs, and submit work of the other tenant on their model: the cycle may place it on
    the GPUs the job is parked on."""
    suspended = list(
        Job.objects.filter(state=JobState.SUSPENDED).select_related("virtual_cluster").order_by("pk")
    )
    if not suspended:
        submit(rng, clients, acknowledged, step)
        return
    job = rng.choice(suspended)
    parked = Allocation.objects.filter(attempt__job=job, released_at__isnull=True, suspended=True)
    model = parked.values_list("gpu__model", flat=True).first() or "A100"
    quota = Quota.objects.get(virtual_cluster=job.virtual_cluster, gpu_model=model)
    quota.guaranteed, quota.borrow_limit = held_gpus(quota.virtual_cluster_id, model), 0
    quota.save()
    others = [user for user, vc in sorted(USERS.items()) if vc != job.virtual_cluster.name]
    submit(rng, clients, acknowledged, step, users=others, model=model)


def cut_or_raise_quota(rng: random.Random, ceilings: dict[tuple[int, str], int]) -> None:
    quota = rng.choice(list(Quota.objects.order_by("pk")))
    key = (quota.virtual_cluster_id, quota.gpu_model)
    held = held_gpus(*key)
    quota.guaranteed, quota.borrow_limit = rng.randint(0, 12), rng.randint(0, 8)
    quota.save()
    if held > quota.guaranteed + quota.borrow_limit:
        ceilings[key] = max(ceilings.get(key, 0), held)


def tighten(ceilings: dict[tuple[int, str], int]) -> None:
    """A VC above its cut quota may keep what it holds, never regain what it gave up."""
    for key in list(ceilings):
        quota = Quota.objects.get(virtual_cluster_id=key[0], gpu_model=key[1])
        ceiling = min(ceilings[key], held_gpus(*key))
        if ceiling <= quota.guaranteed + quota.borrow_limit:
            del ceilings[key]
        else:
            ceilings[key] = ceiling


@pytest.mark.parametrize("seed", [3, 5, 20])
def test_invariants_hold_after_every_step_of_a_random_walk(
    seed: int, api_for: Any, users: dict[str, Any], paused_loop: Any
) -> None:
    rng = random.Random(seed)
    Node.objects.update(state=NodeState.READY, last_heartbeat_at=timezone.now())  # agents said hello
    clients = {user: api_for(user) for user in USERS}
    agents = ScriptedAgents()
    profile = every_cycle_a_new_turn()
    acknowledged: set[int] = set()
    ceilings: dict[tuple[int, str], int] = {}
    seen: set[str] = set()
    for step in range(STEPS):
        kind = rng.choice(STEP_KINDS)
        if kind == "submit":
            submit(rng, clients, acknowledged, step)
        elif kind == "squeeze":
            squeeze_a_suspended_job(rng, clients, acknowledged, step)
        elif kind == "agents":
            agents.converge()
        elif kind == "end":
            running = list(Job.objects.filter(state=JobState.RUNNING).order_by("pk"))
            if running:
                outcome = (ExitReason.SUCCEEDED, 0) if rng.random() < 0.7 else (ExitReason.FAILED, 1)
                agents.end(rng.choice(running), *outcome)
        elif kind == "cancel":
            open_jobs = list(Job.objects.exclude(state__in=TERMINAL_STATES).order_by("pk"))
            if open_jobs:
                job = rng.choice(open_jobs)
                response = clients[job.owner.username].post(f"/api/v1/jobs/{job.pk}/cancel/")
                assert response.status_code == 200, response.content
        elif kind == "node_lost":
            node = rng.choice(list(Node.objects.order_by("pk")))
            Node.objects.filter(pk=node.pk).update(state=NodeState.NOT_READY)
            requeue_jobs_of_lost_node(node)
        elif kind == "admin":
            node = rng.choice(list(Node.objects.order_by("pk")))
            set_node_state(node, rng.choice(["cordon", "drain", "uncordon", "uncordon"]), users["admin"])
        elif kind == "gpu_fail":
            if rng.random() < 0.3:  # a failed GPU stays failed: the walk would run out of them
                gpu = rng.choice(list(Gpu.objects.order_by("pk")))
                xid = GpuSample(gpu_uuid=gpu.uuid, time=timezone.now(), healthy=False, health_reason="Xid 79")
                record_gpu_health(gpu.node, [xid])
        elif kind == "time_limits":  # the periodic check, as if 1, 5 or 90 minutes had passed
            enforce_time_limits(timezone.now() + timedelta(minutes=rng.choice([1, 5, 90])), 60, 120)
        elif kind == "node_back":
            Node.objects.filter(pk=rng.choice(list(Node.objects.order_by("pk"))).pk).update(
                state=NodeState.READY
            )
        else:
            cut_or_raise_quota(rng, ceilings)
        tighten(ceilings)
        run_cycle(profile)
        assert_all_invariants(acknowledged, ceilings)
        seen.update(Job.objects.values_list("state", flat=True))
    # The walk reached the states it is meant to exercise (a walk that never got a job running
    # would check nothing).
    assert {JobState.PENDING, JobState.RUNNING} <= seen, seen
    assert seen & {JobState.SUSPENDED, JobState.CHECKPOINTING}, seen
    assert seen & {JobState.SUCCEEDED, JobState.FAILED}, seen

"""The invariants every scheduling test ends with (reliability-security.md, I1-I6).

assert_invariants covers the allocation invariants (I1, I2 per VC, I3, I5) and that a
suspension is recorded exactly while a job is suspended;
assert_all_invariants adds node capacity (I2), acknowledged jobs (I4), the event trail (I6) and
F17's safety rule: no live attempt resumes from a checkpoint garbage collection took.
The fixture invariants_checked runs all of them after each test of a module that uses it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from itertools import pairwise
from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.cluster.models import Node, Quota
from portal.jobs.choices import ACTIVE_STATES, ATTEMPT_ENDED_STATES, JobState, can_transition
from portal.jobs.models import Allocation, Checkpoint, Job, JobAttempt, JobEvent, Suspension


def assert_invariants(ceilings: Mapping[tuple[int, str], int] | None = None) -> None:
    """`ceilings`: for a VC whose quota an admin cut below what it held, per (VC id, model), the
    GPUs it may still hold (what it held then, less what it gave up since); the cut preempts
    nothing, but the VC must not gain GPUs above its limit."""
    live = list(
        Allocation.objects.filter(released_at__isnull=True).select_related(
            "gpu", "attempt__job__virtual_cluster"
        )
    )
    # No GPU in two live allocations. A suspended (time-sliced) job's allocations are parked:
    # they mark where it resumes and do not hold the GPU, which only a job of the same tenant
    # may hold meanwhile.
    parked = [a for a in live if a.suspended]
    live = [a for a in live if not a.suspended]
    twice = [gpu for gpu, n in Counter(a.gpu_id for a in live).items() if n > 1]
    assert not twice, f"GPUs in two live allocations: {twice}"
    holders = {a.gpu_id: a.attempt.job for a in live}
    for allocation in parked:
        job = allocation.attempt.job
        assert job.state in (JobState.SUSPENDED, JobState.CHECKPOINTING), f"{job} parked while {job.state}"
        holder = holders.get(allocation.gpu_id)
        assert holder is None or holder.tenant_id == job.tenant_id, (
            f"{holder} of another tenant holds a GPU {job} is suspended on"
        )
    # At most one unfinished attempt per job, and only active jobs hold GPUs.
    unfinished = Counter(
        JobAttempt.objects.exclude(state__in=ATTEMPT_ENDED_STATES).values_list("job_id", flat=True)
    )
    for job in Job.objects.exclude(state__in=ACTIVE_STATES):
        unfinished.pop(job.pk, None)
    assert all(n == 1 for n in unfinished.values()), f"jobs with several live attempts: {unfinished}"
    for allocation in live:
        assert allocation.attempt.job.state in ACTIVE_STATES, (
            f"{allocation.attempt.job} holds GPUs while not active"
        )
    # A suspension is open exactly while its job is suspended, on the job's current attempt:
    # usage, budgets and attained service leave an open one out up to now.
    open_suspensions = Counter(
        Suspension.objects.filter(ended_at__isnull=True).values_list("attempt__job_id", flat=True)
    )
    suspended_jobs = set(Job.objects.filter(state=JobState.SUSPENDED).values_list("pk", flat=True))
    assert set(open_suspensions) == suspended_jobs, (
        f"open suspensions of jobs {sorted(open_suspensions)}, suspended jobs {sorted(suspended_jobs)}"
    )
    assert all(n == 1 for n in open_suspensions.values()), (
        f"jobs with several open suspensions: {open_suspensions}"
    )
    for job in Job.objects.filter(pk__in=suspended_jobs):
        assert job.current_attempt().suspensions.filter(ended_at__isnull=True).exists(), (
            f"{job} is suspended but its current attempt is not"
        )
    # No VC above guarantee plus borrow limit.
    held: dict[tuple[int, str], int] = defaultdict(int)
    for allocation in live:
        held[(allocation.attempt.job.virtual_cluster_id, allocation.gpu.model)] += 1
    for (vc, model), n in held.items():
        quota = Quota.objects.get(virtual_cluster_id=vc, gpu_model=model)
        limit = max(quota.guaranteed + quota.borrow_limit, (ceilings or {}).get((vc, model), 0))
        assert n <= limit, f"VC {vc} holds {n} {model}, more than its quota"
    # Gangs whole or absent: an active job holds all its GPUs on its current attempt, or none.
    by_attempt: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in live:
        by_attempt[allocation.attempt_id].append(allocation)
    for allocation in parked:
        by_attempt[allocation.attempt_id].append(allocation)
    for allocations in by_attempt.values():
        job = allocations[0].attempt.job
        assert len({a.suspended for a in allocations}) == 1, f"{job} is partly suspended"
        assert len(allocations) == job.total_gpus, f"{job} holds {len(allocations)} of {job.total_gpus} GPUs"
        assert len({a.replica for a in allocations}) == job.replicas


def assert_all_invariants(
    acknowledged: Iterable[int] = (), ceilings: Mapping[tuple[int, str], int] | None = None
) -> None:
    """I1-I6: assert_invariants, then node capacity, one running attempt per job, every
    acknowledged job stored, and every job's transitions recorded as an unbroken chain of events
    with the audit entries of its submission and cancellation."""
    assert_invariants(ceilings)
    assert_nodes_within_capacity()
    assert_one_running_attempt_per_job()
    assert_acknowledged_jobs_exist(acknowledged)
    assert_every_state_change_is_recorded()
    assert_no_live_attempt_lost_its_checkpoint()


def assert_no_live_attempt_lost_its_checkpoint() -> None:
    """F17: a checkpoint that an attempt not yet ended started from is still committed."""
    taken = (
        JobAttempt.objects.exclude(state__in=ATTEMPT_ENDED_STATES)
        .filter(resume_from__isnull=False)
        .exclude(resume_from__state=Checkpoint.State.COMMITTED)
        .values_list("job_id", "number", "resume_from__step", "resume_from__state")
    )
    assert not taken, (
        f"live attempts whose checkpoint was collected (job, attempt, step, state): {list(taken)}"
    )


def assert_nodes_within_capacity() -> None:
    """I2 per node: the replicas placed on a node fit its CPUs and memory (GPUs are I1)."""
    placed = (
        Allocation.objects.holding()
        .values_list(
            "node_id",
            "attempt_id",
            "replica",
            "attempt__job__cpu_per_replica",
            "attempt__job__memory_gb_per_replica",
        )
        .distinct()
    )
    cpu: dict[int, int] = defaultdict(int)
    memory: dict[int, int] = defaultdict(int)
    for node_id, _, _, replica_cpu, replica_memory in placed:
        cpu[node_id] += replica_cpu
        memory[node_id] += replica_memory
    for node in Node.objects.filter(pk__in=cpu):
        if node.cpu:
            assert cpu[node.pk] <= node.cpu, f"{node.name}: {cpu[node.pk]} CPUs placed, {node.cpu} exist"
        if node.memory_gb:
            assert memory[node.pk] <= node.memory_gb, f"{node.name}: {memory[node.pk]} GB placed"


def assert_one_running_attempt_per_job() -> None:
    """I3 as the portal shows it: whatever the job's state, at most one attempt is not ended."""
    live = Counter(
        JobAttempt.objects.exclude(state__in=ATTEMPT_ENDED_STATES).values_list("job_id", flat=True)
    )
    twice = {job: n for job, n in live.items() if n > 1}
    assert not twice, f"jobs with several attempts not ended: {twice}"


def assert_acknowledged_jobs_exist(acknowledged: Iterable[int]) -> None:
    """I4: every job the API answered 2xx for is in PostgreSQL."""
    wanted = set(acknowledged)
    missing = wanted - set(Job.objects.filter(pk__in=wanted).values_list("pk", flat=True))
    assert not missing, f"acknowledged jobs missing from the database: {sorted(missing)}"


def assert_every_state_change_is_recorded() -> None:
    """I6: each job's events (who, when, why) run from submission ('' -> pending) through allowed
    transitions to its current state, and a cancellation left an audit entry. (Submissions are
    audited per request, a job array in one entry: tests/security/test_secrets_and_audit.py.)"""
    chains: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for job_id, from_state, to_state in (
        JobEvent.objects.exclude(to_state="")
        .order_by("job_id", "created_at", "id")
        .values_list("job_id", "from_state", "to_state")
    ):
        chains[job_id].append((from_state, to_state))
    audited = set(AuditEntry.objects.filter(object_type="jobs.Job").values_list("action", "object_id"))
    for job_id, state in Job.objects.values_list("pk", "state"):
        chain = chains.get(job_id, [])
        assert chain and chain[0] == ("", JobState.PENDING), f"job {job_id} has no submission event"
        for (_, before), (after_from, after_to) in pairwise(chain):
            assert before == after_from, f"job {job_id}: events jump from {before} to {after_from}"
            assert can_transition(after_from, after_to), f"job {job_id}: {after_from} -> {after_to}"
        assert chain[-1][1] == state, f"job {job_id} is {state} but its last event says {chain[-1][1]}"
        if state == JobState.CANCELLED:
            assert ("job.cancel", str(job_id)) in audited, f"job {job_id}: cancelled, not audited"


@pytest.fixture
def invariants_checked(request: Any) -> Iterator[set[int]]:
    """Checks I1-I6 after the test (on its database, before the database is reset).

    Yields a set: a test adds the ids of jobs the API acknowledged, for I4."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None:
        yield set()
        return
    transactional = marker.kwargs.get("transaction", marker.args[0] if marker.args else False)
    request.getfixturevalue("transactional_db" if transactional else "db")
    acknowledged: set[int] = set()
    yield acknowledged
    if transactional:
        from django.db import connection

        connection.close()  # a restarted server may have broken it; the next query reopens it
    assert_all_invariants(acknowledged)

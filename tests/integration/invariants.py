"""The invariants every scheduling test ends with (reliability-security.md, I1-I4)."""

from __future__ import annotations

from collections import Counter, defaultdict

from portal.cluster.models import Quota
from portal.jobs.choices import ACTIVE_STATES, ATTEMPT_ENDED_STATES
from portal.jobs.models import Allocation, Job, JobAttempt


def assert_invariants() -> None:
    live = list(
        Allocation.objects.filter(released_at__isnull=True).select_related(
            "gpu", "attempt__job__virtual_cluster"
        )
    )
    # No GPU in two live allocations.
    twice = [gpu for gpu, n in Counter(a.gpu_id for a in live).items() if n > 1]
    assert not twice, f"GPUs in two live allocations: {twice}"
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
    # No VC above guarantee plus borrow limit.
    held: dict[tuple[int, str], int] = defaultdict(int)
    for allocation in live:
        held[(allocation.attempt.job.virtual_cluster_id, allocation.gpu.model)] += 1
    for (vc, model), n in held.items():
        quota = Quota.objects.get(virtual_cluster_id=vc, gpu_model=model)
        assert n <= quota.guaranteed + quota.borrow_limit, f"VC {vc} holds {n} {model}, more than its quota"
    # Gangs whole or absent: an active job holds all its GPUs on its current attempt, or none.
    by_attempt: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in live:
        by_attempt[allocation.attempt_id].append(allocation)
    for allocations in by_attempt.values():
        job = allocations[0].attempt.job
        assert len(allocations) == job.total_gpus, f"{job} holds {len(allocations)} of {job.total_gpus} GPUs"
        assert len({a.replica for a in allocations}) == job.replicas

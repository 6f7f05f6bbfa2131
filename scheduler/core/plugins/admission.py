"""Admission plugins: quota checks that do not depend on where the GPUs are."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from scheduler.core.framework import SUCCESS, Code, CycleContext, Status
from scheduler.core.state import ClusterState
from scheduler.core.types import ALL_MODELS, ANY_MODEL, PendingJob, Quota, ReasonCode, VirtualCluster


def model_label(model: str) -> str:
    return "GPUs" if model in ("", "*") else model


def quota_fits(
    state: ClusterState, vc: str, model: str, gpus: int, borrowing: bool, cluster_gpus: int | None = None
) -> Status:
    """The pure VC-quota predicate: guaranteed first, then borrowing up to the borrow limit.

    A limit of at least `cluster_gpus` (every GPU of the cluster, healthy or not) cannot bind
    by itself: a job it would turn away does not fit in the cluster either, so placement
    explains the wait by the cluster's free GPUs, which is what the job waits for (and a
    reservation or a preemption from any VC can help it, as they can only for capacity)."""
    quota = state.quota_for(vc, model)
    if quota is None:
        return Status(
            Code.UNRESOLVABLE, ReasonCode.UNKNOWN_VC, f"VC {vc} has no quota for {model_label(model)}"
        )
    guaranteed, borrow_limit, used, row = quota
    if used + gpus <= guaranteed:
        return SUCCESS
    limit = guaranteed + (borrow_limit if borrowing else 0)
    if used + gpus <= limit or (cluster_gpus is not None and limit >= cluster_gpus):
        return SUCCESS
    # The row's model, not the job's: under a row of all models, usage of all models binds.
    label = model_label(row)
    if used <= guaranteed:
        in_use = f"{used} of {guaranteed} guaranteed {label} in use"
    else:  # "16 of 8 guaranteed" read as a contradiction: say what is borrowed
        in_use = f"{used} {label} in use, {guaranteed} guaranteed and {used - guaranteed} borrowed"
    return Status(
        Code.UNSCHEDULABLE,
        ReasonCode.VC_QUOTA,
        f"VC {vc}: {in_use}, borrow limit {borrow_limit if borrowing else 0}; job needs {gpus}",
    )


def borrowed_gpus(state: ClusterState, vc: str, model: str, gpus: int) -> int:
    """How many of `gpus` more GPUs would lie above the VC's guarantee."""
    quota = state.quota_for(vc, model)
    if quota is None:
        return gpus
    guaranteed, _, used, _ = quota
    return max(0, used + gpus - guaranteed) - max(0, used - guaranteed)


class VcQuota:
    """A VC may use its guaranteed GPUs of each model, then borrow idle ones up to its borrow
    limit. Borrowed GPUs are reclaimable (see the `reclaim` preemption plugin)."""

    name = "vc_quota"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.borrowing = bool(args.get("borrowing", True))
        self.cluster_gpus: int | None = None
        self.lenders = False  # whether any VC keeps some of its guarantee from borrowers

    def prepare(self, ctx: CycleContext) -> None:
        self.cluster_gpus = sum(len(node.gpus) for node in ctx.snapshot.nodes)
        self.lenders = any(q.lending_limit is not None for vc in ctx.snapshot.vcs for q in vc.quotas)

    def admit(self, job: PendingJob, model: str, ctx: CycleContext) -> Status:
        quota_model = job.gpu_model if job.gpu_model != ANY_MODEL else model
        gpus = quota_gpus(ctx.state, job, quota_model)[0]
        status = quota_fits(ctx.state, job.vc, quota_model, gpus, self.borrowing, self.cluster_gpus)
        if status.ok and self.lenders:
            borrowed = borrowed_gpus(ctx.state, job.vc, quota_model, gpus)
            if borrowed > 0:
                return lending_fits(ctx.state, job.vc, model, gpus, borrowed)
        return status


def kept_free(quota: Quota, used: int) -> int:
    """GPUs of its guarantee a VC keeps free from borrowers while it uses `used`: the guarantee
    minus the lending limit minus what it uses (none without a lending limit: it lends all)."""
    if quota.lending_limit is None:
        return 0
    return max(0, quota.guaranteed - quota.lending_limit - used)


def kept_gpus(state: ClusterState, borrower: str) -> tuple[dict[str, int], int]:
    """GPUs other VCs keep free for themselves: (per model, of any model). A VC with a lending
    limit keeps its guarantee minus that limit minus what it uses; a quota row of one model
    keeps GPUs of that model, a row for all models GPUs of any. Every model's rows are
    counted, not only the borrowed model's: they take GPUs the all-model rows cannot use."""
    of_model: dict[str, int] = {}
    of_any = 0
    for vc, rows in state.quotas.items():
        if vc == borrower:
            continue
        for row_model, quota in rows.items():
            if quota.lending_limit is None:
                continue
            kept = kept_free(quota, state.vc_used(vc, row_model))
            if row_model == ALL_MODELS:
                of_any += kept
            elif kept:
                of_model[row_model] = of_model.get(row_model, 0) + kept
    return of_model, of_any


def kept_of(model: str, of_model: Mapping[str, int], of_any: int, free: Mapping[str, int]) -> int:
    """GPUs of `model` a borrower must leave free: what rows of `model` keep, plus what the
    all-model rows keep beyond the free GPUs of other models that their own rows leave over.
    A borrower may take `gpus` of `model` iff `free[model] - gpus` covers this: then each
    model's free GPUs cover its rows and what is left covers the all-model rows."""
    spare = 0
    for other, count in free.items():
        if other != model:
            spare += max(0, count - of_model.get(other, 0))
    return of_model.get(model, 0) + max(0, of_any - spare)


def lending_fits(state: ClusterState, vc: str, model: str, gpus: int, borrowed: int) -> Status:
    """Whether a job of `vc` that borrows may take `gpus` free GPUs of `model`: after it,
    the free GPUs must still cover what the other VCs keep. GPUs that a preemption frees
    count, as the cycle asks again once victims are released; a job within its VC's
    guarantee is never asked (a guarantee is not borrowed)."""
    of_model, of_any = kept_gpus(state, vc)
    if not of_model and not of_any:
        return SUCCESS
    kept = kept_of(model, of_model, of_any, state.free_total)
    free = state.free_total.get(model, 0)
    if not kept or free - gpus >= kept:
        # Nothing of `model` kept: if too few are free, placement says so (insufficient GPUs).
        return SUCCESS
    label = model_label(model)
    return Status(
        Code.UNSCHEDULABLE,
        ReasonCode.NOT_LENT,
        f"VC {vc} would borrow {borrowed} {label}: {free} free, {min(kept, free)} of them kept "
        f"free by VCs that do not lend them; job needs {gpus}",
    )


def quota_gpus(state: ClusterState, job: PendingJob, model: str) -> tuple[int, int]:
    """Whole GPUs the job adds to its VC's and its user's usage: its GPUs, or for a fractional
    job 0 or 1, as its share does or does not start another GPU's worth."""
    if not job.gpu_share_milli:
        return job.gpus, job.gpus
    return state.share_increment(job.vc, job.user, model, job.gpu_share_milli)


def cpu_text(milli: int) -> str:
    """Milli-cores as CPUs, the unit users ask in: 48000 -> '48', 1500 -> '1.5'."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli / 1000:g}"


def memory_texts(*mib: int) -> tuple[str, ...]:
    """Amounts of memory in one unit, GB (as users ask, 1024 MiB each) when all are whole GB,
    else MiB, so that the numbers of one message compare at a glance."""
    if all(m % 1024 == 0 for m in mib):
        return tuple(f"{m // 1024} GB" for m in mib)
    return tuple(f"{m} MiB" for m in mib)


class UserLimit:
    """Caps on what one user holds inside a VC at once: GPUs (`max_gpus_per_user`), so one
    user cannot take the whole guarantee of a shared VC, and the CPU and memory of all their
    jobs' replicas (`max_cpu_milli_per_user`, `max_memory_mib_per_user`), so one cannot starve
    the others of the nodes' CPU or memory while within the GPU cap. A job waits while it
    would take its user past any of them; the message names the first that binds."""

    name = "user_limit"

    def __init__(self, args: Mapping[str, Any]) -> None:
        pass

    def admit(self, job: PendingJob, model: str, ctx: CycleContext) -> Status:
        vc = ctx.state.vcs.get(job.vc)
        if vc is None or not vc.caps_users:
            return SUCCESS
        for over, texts, what in self._caps(vc, job, model, ctx.state):
            if over:
                held, cap, need = texts
                return Status(
                    Code.UNSCHEDULABLE,
                    ReasonCode.USER_LIMIT,
                    f"user {job.user} holds {held} of {cap}{what} allowed per user in VC {job.vc}; "
                    f"job needs {need}",
                )
        return SUCCESS

    @staticmethod
    def _caps(
        vc: VirtualCluster, job: PendingJob, model: str, state: ClusterState
    ) -> Iterator[tuple[bool, tuple[str, ...], str]]:
        """Each cap the VC sets, in the order the message names the first that binds: whether the
        job would take its user over it, and the held, cap and needed amounts as text. Lazily, so
        that the amounts of a cap are counted only when the caps before it hold."""
        if vc.max_gpus_per_user is not None:
            cap = vc.max_gpus_per_user
            held = state.user_gpus(job.vc, job.user)
            need = quota_gpus(state, job, job.gpu_model if job.gpu_model != ANY_MODEL else model)[1]
            # The message says what the job asks for; `need` also counts shares by whole GPUs.
            yield held + need > cap, (str(held), str(cap), str(job.gpus)), " GPUs"
        if vc.max_cpu_milli_per_user is not None:
            cap = vc.max_cpu_milli_per_user
            held = state.user_cpu_milli(job.vc, job.user)
            need = job.replicas * job.cpu_milli_per_replica
            yield held + need > cap, (cpu_text(held), cpu_text(cap), cpu_text(need)), " CPUs"
        if vc.max_memory_mib_per_user is not None:
            cap = vc.max_memory_mib_per_user
            held = state.user_memory_mib(job.vc, job.user)
            need = job.replicas * job.memory_mib_per_replica
            yield held + need > cap, memory_texts(held, cap, need), " of memory"

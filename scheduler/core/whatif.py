"""What-if hints: which cheap change to a blocked job's request would start it now or sooner.

A reason says why a job waits; a hint says what the user could do about it, as Slurm users
learn to shorten `--time` to get backfilled. For each blocked job at the head of the queue the
cycle tries a few changed requests against the state it leaves behind, cheapest change first:

- a time limit short enough to finish before the backfill reservation (when that holds it);
- fewer GPUs: the largest smaller request that fits now, else half the request;
- spread: the same GPUs as more, smaller replicas, so no single node has to hold them;
- another GPU model the cluster has.

A changed shape takes the CPU and memory of the snapshot's flavor of that shape, and the hint
names the flavor, so "resubmit with flavor l-V100" is what the user reads. A change is
reported only if it starts the job now, or its estimated start is clearly earlier
than the job's own. "Now" means the trial placement succeeded in what this cycle left free,
through the same admission, backfill and placement code as a real start; later starts come
from the same forward simulation as the job's own estimate. The changed request is returned
in full so a client can offer "resubmit like this".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduler.core.plugins.admission import model_label
from scheduler.core.types import ANY_MODEL, Flavor, HintKind, JobId, PendingJob, ReasonCode, WhatIfHint

# Reasons that name a resource shape; a change of shape cannot help the others (a job already
# waiting for its victims, or a VC the portal does not know).
HINT_REASONS = frozenset(
    {
        ReasonCode.INSUFFICIENT_GPUS,
        ReasonCode.FRAGMENTATION,
        ReasonCode.GANG_NODES,
        ReasonCode.NODE_RESOURCES,
        ReasonCode.NO_MATCHING_GPU,
        ReasonCode.VC_QUOTA,
        ReasonCode.USER_LIMIT,
        ReasonCode.NOT_LENT,
        ReasonCode.HELD_FOR_RESERVATION,
        ReasonCode.QUEUED_BEHIND,
    }
)
MAX_HINTS_PER_JOB = 4
# An estimate must beat the job's own by this share of its wait (and at least a minute) to be
# worth a hint: the estimate is coarse, and a hint that saves seconds is noise.
MIN_GAIN_SHARE = 0.1
MIN_GAIN_S = 60.0


@dataclass(frozen=True, slots=True)
class Trial:
    """A blocked job the cycle wants hints for."""

    job: PendingJob
    reason: ReasonCode
    reservation_start: float | None  # start of the reservation that holds this job back


@dataclass(frozen=True, slots=True)
class Proposal:
    """One kind of change for one job: an option that starts now, or one to estimate."""

    kind: HintKind
    option: PendingJob
    flavor: str
    starts_now: bool


@dataclass(slots=True)
class Proposals:
    """The first half of the hints, made before the forward simulation: trial placements done,
    and the changed requests (`probes`, keyed by the job whose place they take) that the
    simulation must estimate. `choose` finishes them with its estimates."""

    by_job: dict[str, tuple[PendingJob, list[Proposal]]] = field(default_factory=dict)
    probes: dict[str, list[PendingJob]] = field(default_factory=dict)


FitsNow = Callable[[PendingJob], bool]


def propose(
    trials: Sequence[Trial], models: Sequence[str], flavors: Sequence[Flavor], now: float, fits_now: FitsNow
) -> Proposals:
    """For every trial and kind of change: the first option that starts now; failing that the
    first (smallest) one, to be estimated. A spread or a time limit changes only where and how
    long, which the estimate does not model, so they count only when they start now."""
    by_shape: dict[tuple[str, int], Flavor] = {}
    for flavor in sorted(flavors, key=lambda f: f.name):
        by_shape.setdefault((flavor.gpu_model, flavor.gpus), flavor)
    proposals = Proposals()
    for trial in trials:
        found: list[Proposal] = []
        for kind, options in _changes(trial, models, by_shape, now):
            hit = next(((o, f) for o, f in options if fits_now(o)), None)
            if hit is not None:
                found.append(Proposal(kind, hit[0], hit[1], True))
            elif kind not in (HintKind.SPREAD, HintKind.TIME_LIMIT):
                option, flavor = options[0]
                probe = replace(option, id=JobId(f"{trial.job.id}?{len(found)}"))
                found.append(Proposal(kind, probe, flavor, False))
                proposals.probes.setdefault(trial.job.id, []).append(probe)
        if found:
            proposals.by_job[trial.job.id] = (trial.job, found)
    return proposals


def choose(
    proposals: Proposals, estimates: Mapping[str, float | None], now: float
) -> dict[str, tuple[WhatIfHint, ...]]:
    """Hints per job id, cheapest change first: those that start now, and those whose
    estimated start is clearly earlier than the job's own."""
    hints: dict[str, tuple[WhatIfHint, ...]] = {}
    for job_id, (job, found) in proposals.by_job.items():
        useful: list[WhatIfHint] = []
        own = estimates.get(job_id)
        for proposal in found:
            if proposal.starts_now:
                useful.append(_hint(job, proposal, now))
                continue
            at = estimates.get(proposal.option.id)
            if at is None or at <= now:
                # "Now" by the estimate but not by the trial placement: what blocks it
                # (topology, CPU, memory) is beyond the estimate, so it cannot say when either.
                continue
            if own is not None and at > own - max(MIN_GAIN_S, MIN_GAIN_SHARE * (own - now)):
                continue
            useful.append(_hint(job, proposal, now, at))
        if useful:
            hints[job_id] = tuple(useful[:MAX_HINTS_PER_JOB])
    return hints


Option = tuple[PendingJob, str]  # a changed request and the flavor of its shape ("" = none)


def _changes(
    trial: Trial, models: Sequence[str], flavors: Mapping[tuple[str, int], Flavor], now: float
) -> list[tuple[HintKind, list[Option]]]:
    """Changed requests by kind, cheapest kind first; inside a kind the smallest change first."""
    job = trial.job
    per, replicas = job.gpus_per_replica, job.replicas
    changes: list[tuple[HintKind, list[Option]]] = []
    if trial.reason is ReasonCode.HELD_FOR_RESERVATION and trial.reservation_start is not None:
        minutes = int((trial.reservation_start - now) // 60)
        if minutes >= 1 and (job.time_limit_s is None or job.time_limit_s > minutes * 60):
            changes.append((HintKind.TIME_LIMIT, [(replace(job, time_limit_s=minutes * 60.0), "")]))
    fewer: list[Option] = []
    size = per // 2
    while size >= 1:
        fewer.append(_shaped(job, replicas, size, job.gpu_model, flavors))
        size //= 2
    size = replicas // 2
    while size >= 1:
        fewer.append(_shaped(job, size, per, job.gpu_model, flavors))
        size //= 2
    if fewer:
        changes.append((HintKind.FEWER_GPUS, fewer))
    spread: list[Option] = []
    factor = 2
    while per % factor == 0:
        spread.append(_shaped(job, replicas * factor, per // factor, job.gpu_model, flavors))
        factor *= 2
    if spread:
        changes.append((HintKind.SPREAD, spread))
    if job.gpu_model != ANY_MODEL:
        for model in models:
            if model != job.gpu_model:
                changes.append((HintKind.GPU_MODEL, [_shaped(job, replicas, per, model, flavors)]))
    return changes


def _shaped(
    job: PendingJob, replicas: int, per_replica: int, model: str, flavors: Mapping[tuple[str, int], Flavor]
) -> Option:
    """The job with another shape. CPU and memory per replica are the flavor's of that shape
    when there is one, else they follow the GPUs in proportion."""
    flavor = flavors.get((model, per_replica))
    if flavor is not None:
        cpu, memory = flavor.cpu_milli, flavor.memory_mib
    else:
        share = per_replica / job.gpus_per_replica
        cpu, memory = int(job.cpu_milli_per_replica * share), int(job.memory_mib_per_replica * share)
    changed = replace(
        job,
        replicas=replicas,
        gpus_per_replica=per_replica,
        gpu_model=model,
        cpu_milli_per_replica=cpu,
        memory_mib_per_replica=memory,
    )
    return changed, flavor.name if flavor is not None else ""


def _hint(job: PendingJob, proposal: Proposal, now: float, at: float | None = None) -> WhatIfHint:
    kind, option, flavor, starts_now = proposal.kind, proposal.option, proposal.flavor, proposal.starts_now
    when = "starts now" if starts_now else f"is expected to start in {_duration(max((at or now) - now, 0.0))}"
    label = model_label(option.gpu_model)
    if kind is HintKind.TIME_LIMIT:
        change = f"with a time limit of {_duration(option.time_limit_s or 0.0)}"
    elif kind is HintKind.GPU_MODEL:
        change = f"on {label} instead of {model_label(job.gpu_model)}"
    else:
        shape = f"{option.replicas}x{option.gpus_per_replica} {label}"
        change = f"as {shape} instead of {job.replicas}x{job.gpus_per_replica}"
        if kind is HintKind.SPREAD:
            change += " (spread over nodes)"
    if flavor:
        change += f" (flavor {flavor})"
    return WhatIfHint(
        kind=kind,
        message=f"{change} it {when}",
        replicas=option.replicas,
        gpus_per_replica=option.gpus_per_replica,
        gpu_model=option.gpu_model,
        time_limit_s=option.time_limit_s if kind is HintKind.TIME_LIMIT else None,
        starts_now=starts_now,
        estimated_start=now if starts_now else at,
        flavor=flavor,
    )


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{max(minutes, 1)} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"

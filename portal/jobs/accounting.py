"""Who used what: allocated GPU-hours, GPU-hours weighted by utilization, and energy.

Allocated time comes from allocations (held from placement to release). Utilization and energy
come from the attempt's telemetry: each sample's utilization and power stand for the time since
the GPU's previous sample, and energy is the increase of the GPU's energy counter where NVML has
one, else the integral of power.

A report for a period [since, until) counts only what happened in it: each allocation's overlap
with the period, and each sample's interval clipped to the period; the counter's increase over
an interval is shared out in proportion to the part inside (the counter read at `since` and
`until` by linear interpolation). So a long job is charged to each month for that month's part,
and consecutive periods add up to the whole, with nothing counted twice or lost at a boundary.
Without a period, the whole life counts.

A time-sliced attempt's suspensions (Suspension rows) are left out of its allocated time: while
it is suspended, the job that took its turn holds and is charged for the same GPUs. The
scheduler's attained service leaves them out the same way (`run_seconds`), so a job's share,
its VC's budget and its rank in the queue all count the time it ran, never the time it waited.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Exists, OuterRef, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

HOUR = 3600.0


@dataclass
class Usage:
    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    energy_j: float = 0.0

    def add(self, other: Usage) -> None:
        self.allocated_gpu_s += other.allocated_gpu_s
        self.used_gpu_s += other.used_gpu_s
        self.energy_j += other.energy_j

    def as_dict(self) -> dict[str, float]:
        return {
            "allocated_gpu_hours": round(self.allocated_gpu_s / HOUR, 4),
            "used_gpu_hours": round(self.used_gpu_s / HOUR, 4),
            "energy_kwh": round(self.energy_j / 3.6e6, 4),
        }


def suspended_within(attempt_id: str, lower: str, upper: str) -> str:
    """SQL for the seconds the attempt `attempt_id` was suspended within [`lower`, `upper`)
    (three SQL expressions of the row it is computed for; a suspension still going on lasts
    up to `upper`). The one measure of suspended time: allocated GPU time, budgets and attained
    service all subtract it, so they leave out the same periods. The row's columns must be
    qualified: `id` or `attempt_id` alone would name the suspension's own."""
    return f"""COALESCE((
        SELECT SUM(EXTRACT(EPOCH FROM LEAST(COALESCE(s.ended_at, {upper}), {upper})
                                      - GREATEST(s.started_at, {lower})))
        FROM jobs_suspension AS s
        WHERE s.attempt_id = {attempt_id}
          AND s.started_at < {upper}
          AND (s.ended_at IS NULL OR s.ended_at > {lower})
    ), 0)"""


# Each allocation's time, clipped to the period, less its attempt's suspensions within that
# time. GREATEST and LEAST ignore a NULL bound, so without a period this is the whole
# allocation, up to now when it is not released.
ALLOCATED_SQL = f"""
SELECT allocations.attempt_id,
       SUM(EXTRACT(EPOCH FROM allocations.held_until - allocations.held_from)
           - {suspended_within("allocations.attempt_id", "allocations.held_from", "allocations.held_until")})
FROM (
    SELECT attempt_id,
           GREATEST(created_at, %(since)s::timestamptz) AS held_from,
           LEAST(COALESCE(released_at, %(now)s::timestamptz), %(until)s::timestamptz) AS held_until
    FROM jobs_allocation
    WHERE attempt_id = ANY(%(ids)s)
) AS allocations
WHERE allocations.held_until > allocations.held_from
GROUP BY allocations.attempt_id
"""

# Each attempt's run: from its start (from its placement while it is starting) to its end, or
# to now while it runs, less its suspensions.
RUN_SQL = f"""
SELECT attempts.id,
       EXTRACT(EPOCH FROM attempts.run_until - attempts.run_from)
       - {suspended_within("attempts.id", "attempts.run_from", "attempts.run_until")}
FROM (
    SELECT id,
           COALESCE(started_at, created_at) AS run_from,
           COALESCE(ended_at, %(now)s::timestamptz) AS run_until
    FROM jobs_jobattempt
    WHERE id = ANY(%(ids)s)
) AS attempts
WHERE attempts.run_until > attempts.run_from
"""


def run_seconds(attempt_ids: Iterable[int], now: datetime | None = None) -> dict[int, float]:
    """How long each attempt ran as of `now`, its suspensions left out: the scheduler's
    attained service is this times the job's GPUs (scheduler.store), for the current attempt
    and the ended ones alike. Attempts that have not run are left out."""
    ids = list(attempt_ids)
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(RUN_SQL, {"ids": ids, "now": now or timezone.now()})
        return {attempt_id: max(float(seconds or 0), 0.0) for attempt_id, seconds in cursor.fetchall()}


# Each sample stands for the interval since its GPU's previous sample (LAG over all of the
# attempt's samples, so the first sample in the period still knows when the previous one was);
# `dt` is the part of that interval inside the period, `full_dt` the whole of it. The first
# sample after `until` contributes its interval's part before `until`. A GPU's first sample
# starts no interval, and as GREATEST ignores NULLs it is left out explicitly; so is a counter
# difference with a missing end, so that a GPU without a counter sums to NULL, not 0.
TELEMETRY_SQL = """
SELECT attempt_id,
       SUM(utilization_pct / 100.0 * dt),
       SUM(power_w * dt),
       SUM(GREATEST(energy_j - previous_energy_j, 0) * dt / NULLIF(full_dt, 0))
           FILTER (WHERE energy_j IS NOT NULL AND previous_energy_j IS NOT NULL)
FROM (
    SELECT attempt_id, gpu_uuid, utilization_pct, power_w, energy_j, previous_energy_j,
           EXTRACT(EPOCH FROM time - previous_time) AS full_dt,
           EXTRACT(EPOCH FROM LEAST(time, %(until)s::timestamptz)
                              - GREATEST(previous_time, %(since)s::timestamptz)) AS dt
    FROM (
        SELECT attempt_id, gpu_uuid, time, utilization_pct, power_w, energy_j,
               LAG(time) OVER gpu AS previous_time, LAG(energy_j) OVER gpu AS previous_energy_j
        FROM jobs_telemetrysample
        WHERE attempt_id = ANY(%(ids)s)
        WINDOW gpu AS (PARTITION BY attempt_id, gpu_uuid ORDER BY time)
    ) AS samples
) AS intervals
WHERE full_dt IS NOT NULL AND dt > 0
GROUP BY attempt_id, gpu_uuid
"""


def attempt_usage(
    attempt_ids: Iterable[int],
    now: datetime | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[int, Usage]:
    """Usage per attempt within [since, until) (the whole life without them), in two queries
    whatever the number of attempts and samples, so that a report over many jobs stays cheap.

    A counter that went down (the GPU was reset) counts nothing for that interval rather than a
    negative energy. A GPU without counter readings falls back on its power readings."""
    ids = list(attempt_ids)
    usage: dict[int, Usage] = defaultdict(Usage)
    if not ids:
        return usage
    params = {"ids": ids, "now": now or timezone.now(), "since": since, "until": until}
    with connection.cursor() as cursor:
        cursor.execute(ALLOCATED_SQL, params)
        for attempt_id, seconds in cursor.fetchall():
            usage[attempt_id].allocated_gpu_s = float(seconds or 0)
        cursor.execute(TELEMETRY_SQL, params)
        for attempt_id, used, power_energy, counter_energy in cursor.fetchall():
            usage[attempt_id].used_gpu_s += float(used or 0)
            usage[attempt_id].energy_j += float(
                counter_energy if counter_energy is not None else power_energy or 0
            )
    return usage


def job_usage(
    job_ids: Iterable[int],
    now: datetime | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[int, Usage]:
    """Usage per job, its attempts summed: a requeued job is charged for every run."""
    from portal.jobs.models import JobAttempt

    attempts = dict(JobAttempt.objects.filter(job_id__in=list(job_ids)).values_list("pk", "job_id"))
    per_job: dict[int, Usage] = defaultdict(Usage)
    for attempt_id, usage in attempt_usage(attempts, now, since, until).items():
        per_job[attempts[attempt_id]].add(usage)
    return per_job


def with_usage_between(jobs: Any, since: datetime, until: datetime, now: datetime) -> Any:
    """The `jobs` that held a GPU during [since, until), whenever their attempts were created:
    a job that started before the period and ran through it is charged to it too."""
    from portal.jobs.models import Allocation

    if since >= until:
        return jobs.none()
    overlapping = (
        Allocation.objects.filter(attempt__job=OuterRef("pk"), created_at__lt=until)
        .annotate(held_until=Coalesce("released_at", Value(now, output_field=DateTimeField())))
        .filter(held_until__gt=since)
    )
    return jobs.filter(Exists(overlapping))


# The GPU time each VC's jobs held in [since, now), every allocation clipped to it and its
# attempt's suspensions left out as in ALLOCATED_SQL, in one query: what a VC's budget is
# checked against in every scheduling cycle.
ALLOCATED_BY_VC_SQL = f"""
SELECT held.virtual_cluster_id,
       SUM(EXTRACT(EPOCH FROM held.held_until - held.held_from)
           - {suspended_within("held.attempt_id", "held.held_from", "held.held_until")})
FROM (
    SELECT job.virtual_cluster_id,
           a.attempt_id,
           GREATEST(a.created_at, %(since)s::timestamptz) AS held_from,
           LEAST(COALESCE(a.released_at, %(now)s::timestamptz), %(now)s::timestamptz) AS held_until
    FROM jobs_allocation AS a
    JOIN jobs_jobattempt AS attempt ON attempt.id = a.attempt_id
    JOIN jobs_job AS job ON job.id = attempt.job_id
    WHERE job.virtual_cluster_id = ANY(%(ids)s)
      AND a.created_at < %(now)s::timestamptz
      AND (a.released_at IS NULL OR a.released_at > %(since)s::timestamptz)
) AS held
GROUP BY held.virtual_cluster_id
"""


def allocated_gpu_s_by_vc(vc_ids: Iterable[int], since: datetime, now: datetime) -> dict[int, float]:
    """GPU-seconds the jobs of each VC held in [since, now), as `attempt_usage` counts allocated
    time (suspended periods left out); VCs whose jobs held none are left out."""
    ids = list(vc_ids)
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(ALLOCATED_BY_VC_SQL, {"ids": ids, "since": since, "now": now})
        return {vc_id: float(seconds or 0) for vc_id, seconds in cursor.fetchall()}


GROUPS = {"job": "pk", "vc": "virtual_cluster__name", "tenant": "tenant__name", "user": "owner__username"}


def usage_report(
    jobs: Any,
    group: str,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Usage of `jobs` (a queryset the caller has already limited to what it may see) within
    [since, until), summed per job, VC, tenant or user, largest first."""
    keys = dict(jobs.values_list("pk", GROUPS[group]))
    totals: dict[Any, Usage] = defaultdict(Usage)
    counts: dict[Any, int] = defaultdict(int)
    for job_id, usage in job_usage(keys, now, since, until).items():
        totals[keys[job_id]].add(usage)
    for key in keys.values():
        counts[key] += 1
    rows = [{group: key, "jobs": counts[key], **totals[key].as_dict()} for key in counts]
    return sorted(rows, key=lambda row: (-row["allocated_gpu_hours"], str(row[group])))

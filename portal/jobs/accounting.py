"""Who used what: allocated GPU-hours, GPU-hours weighted by utilization, and energy.

Allocated time comes from allocations (held from placement to release). Utilization and energy
come from the attempt's telemetry: utilization and power are integrated over the time between a
GPU's consecutive samples; energy is the difference of the GPU's energy counter where NVML has
one, else the integral of power.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
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


def attempt_usage(attempt_ids: Iterable[int], now: datetime | None = None) -> dict[int, Usage]:
    """Usage per attempt, in two queries whatever the number of attempts and samples."""
    ids = list(attempt_ids)
    usage: dict[int, Usage] = defaultdict(Usage)
    if not ids:
        return usage
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attempt_id, SUM(EXTRACT(EPOCH FROM COALESCE(released_at, %s) - created_at)) "
            "FROM jobs_allocation WHERE attempt_id = ANY(%s) GROUP BY attempt_id",
            [now, ids],
        )
        for attempt_id, seconds in cursor.fetchall():
            usage[attempt_id].allocated_gpu_s = float(seconds or 0)
        cursor.execute(
            "SELECT attempt_id, SUM(utilization_pct / 100.0 * dt), SUM(power_w * dt), "
            "MAX(energy_j) - MIN(energy_j) "
            "FROM (SELECT attempt_id, gpu_uuid, utilization_pct, power_w, energy_j, "
            "EXTRACT(EPOCH FROM time - LAG(time) OVER (PARTITION BY attempt_id, gpu_uuid ORDER BY time)) "
            "AS dt "
            "FROM jobs_telemetrysample WHERE attempt_id = ANY(%s)) AS samples "
            "GROUP BY attempt_id, gpu_uuid",
            [ids],
        )
        for attempt_id, used, power_energy, counter_energy in cursor.fetchall():
            usage[attempt_id].used_gpu_s += float(used or 0)
            usage[attempt_id].energy_j += float(
                counter_energy if counter_energy is not None else power_energy or 0
            )
    return usage


def job_usage(job_ids: Iterable[int], now: datetime | None = None) -> dict[int, Usage]:
    from portal.jobs.models import JobAttempt

    attempts = dict(JobAttempt.objects.filter(job_id__in=list(job_ids)).values_list("pk", "job_id"))
    per_job: dict[int, Usage] = defaultdict(Usage)
    for attempt_id, usage in attempt_usage(attempts, now).items():
        per_job[attempts[attempt_id]].add(usage)
    return per_job


GROUPS = {"job": "pk", "vc": "virtual_cluster__name", "tenant": "tenant__name", "user": "owner__username"}


def usage_report(jobs: Any, group: str) -> list[dict[str, Any]]:
    """Usage of `jobs` (a queryset the caller has already limited to what it may see), summed per
    job, VC, tenant or user, largest first."""
    keys = dict(jobs.values_list("pk", GROUPS[group]))
    totals: dict[Any, Usage] = defaultdict(Usage)
    counts: dict[Any, int] = defaultdict(int)
    for job_id, usage in job_usage(keys).items():
        totals[keys[job_id]].add(usage)
    for key in keys.values():
        counts[key] += 1
    rows = [{group: key, "jobs": counts[key], **totals[key].as_dict()} for key in counts]
    return sorted(rows, key=lambda row: (-row["allocated_gpu_hours"], str(row[group])))

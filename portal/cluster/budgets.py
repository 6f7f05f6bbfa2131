"""Monthly GPU-hour budgets of virtual clusters.

A budget is checked before a job starts, never by stopping running work: a VC whose jobs have
held its month's GPU-hours starts none until the month (UTC) turns or an admin raises the budget,
and the jobs that run on may take it past the budget. That is Slurm's GrpTRESMins without its
cancelling of running jobs, which would throw away work a budget was meant to ration. The hours
are the usage report's allocated GPU time, so what a tenant reads on its usage page for the
month is what its budget was held against.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from portal.cluster.models import VirtualCluster
from portal.jobs.accounting import HOUR, allocated_gpu_s_by_vc


def month_start(now: datetime) -> datetime:
    """The first instant of `now`'s calendar month in UTC."""
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month_start(now: datetime) -> datetime:
    start = month_start(now)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


def gpu_hours_this_month(vcs: Iterable[VirtualCluster], now: datetime) -> dict[int, float]:
    """GPU-hours each VC's jobs held since the start of `now`'s month (UTC), 0 for none."""
    ids = [vc.pk for vc in vcs]
    held = allocated_gpu_s_by_vc(ids, month_start(now), now)
    return {vc_id: held.get(vc_id, 0.0) / HOUR for vc_id in ids}


def is_spent(vc: VirtualCluster, gpu_hours: float) -> bool:
    return vc.gpu_hours_per_month is not None and gpu_hours >= vc.gpu_hours_per_month


def spent_message(vc: VirtualCluster, gpu_hours: float, now: datetime) -> str:
    """Why none of the VC's jobs may start, with the numbers and when that ends; "" while its
    budget is not spent (or it has none)."""
    if not is_spent(vc, gpu_hours):
        return ""
    month = month_start(now)
    return (
        f"VC {vc.name} has used {gpu_hours:,.1f} of its {vc.gpu_hours_per_month:,} GPU-hours for "
        f"{month:%B} (UTC): none of its jobs starts until {next_month_start(now):%Y-%m-%d} or until "
        "an admin raises its budget"
    )

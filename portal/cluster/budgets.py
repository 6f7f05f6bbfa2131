"""Monthly GPU-hour budgets of virtual clusters.

A budget is checked before a job starts, never by stopping running work: a VC whose jobs have
held its month's GPU-hours starts none until the month (UTC) turns or an admin raises the budget,
and the jobs that run on may take it past the budget. That is Slurm's GrpTRESMins without its
cancelling of running jobs, which would throw away work a budget was meant to ration. The hours
are the usage report's allocated GPU time, so the report for the month's UTC days gives what
its budget was held against.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Q

from portal.cluster.models import VirtualCluster
from portal.jobs.accounting import HOUR, allocated_gpu_s_by_vc

# The shares of its budget at which a VC's tenant admins are told, once each a month: early
# enough to raise the budget or plan the month's rest before jobs stop starting, and when they do.
BUDGET_NOTICE_PCTS = (80, 100)


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
    return _usage_text(vc, gpu_hours, now, "none of its jobs starts")


def _usage_text(vc: VirtualCluster, gpu_hours: float, now: datetime, then: str) -> str:
    return (
        f"VC {vc.name} has used {gpu_hours:,.1f} of its {vc.gpu_hours_per_month:,} GPU-hours for "
        f"{month_start(now):%B} (UTC): {then} until {next_month_start(now):%Y-%m-%d} or until "
        "an admin raises its budget"
    )


def notice_pct(vc: VirtualCluster, gpu_hours: float) -> int:
    """The highest notice level the VC's use has reached (0: none, or no budget)."""
    if vc.gpu_hours_per_month is None:
        return 0
    reached = [pct for pct in BUDGET_NOTICE_PCTS if gpu_hours * 100 >= pct * vc.gpu_hours_per_month]
    return max(reached, default=0)


def notice_text(vc: VirtualCluster, gpu_hours: float, now: datetime) -> str:
    return spent_message(vc, gpu_hours, now) or _usage_text(
        vc, gpu_hours, now, "once it has used them all, none of its jobs starts"
    )


def notify_budgets(now: datetime) -> list[str]:
    """Tells the tenant admins of each VC that has reached a notice level of its budget this
    month and was not yet told of it, by mail and on their webhooks, after commit. The level is
    claimed by compare-and-set, so two workers never tell it twice. Returns the VCs told."""
    from portal.cluster.tasks import mail_budget_notice, post_budget_notice

    budgeted = list(VirtualCluster.objects.filter(gpu_hours_per_month__isnull=False))
    hours = gpu_hours_this_month(budgeted, now)
    month = month_start(now).date()
    told = []
    for vc in budgeted:
        pct = notice_pct(vc, hours[vc.pk])
        if pct <= (vc.budget_notice_pct if vc.budget_notice_month == month else 0):
            continue
        not_told = (
            Q(budget_notice_month__isnull=True) | ~Q(budget_notice_month=month) | Q(budget_notice_pct__lt=pct)
        )
        with transaction.atomic():
            if not VirtualCluster.objects.filter(not_told, pk=vc.pk).update(
                budget_notice_month=month, budget_notice_pct=pct
            ):
                continue
            text = notice_text(vc, hours[vc.pk], now)
            transaction.on_commit(lambda vc_id=vc.pk, text=text: mail_budget_notice.delay(vc_id, text))
            transaction.on_commit(lambda vc_id=vc.pk, text=text: post_budget_notice.delay(vc_id, text))
        told.append(vc.name)
    return told

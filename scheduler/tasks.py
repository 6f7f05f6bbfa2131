"""Celery glue for the scheduling loop: one cycle at a time, triggered by changes and by beat."""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from portal.jobs.services import settle_dependencies
from portal.lib.redis import get_redis
from portal.metrics.cycle_timing import record_cycle_duration
from scheduler import core
from scheduler.store import apply_plan, end_overdue_stops, load_snapshot

CYCLE_LOCK = 0x6770_7363  # the advisory lock id: one cycle at a time across workers
PAUSE_KEY = "scheduler:paused"
QUEUED_KEY = "scheduler:cycle-queued"
QUEUED_TTL_MS = 10_000  # should a queued cycle be lost with its worker, beat covers the gap


def set_loop_paused(paused: bool) -> None:
    """Pauses the loop and its housekeeping for maintenance: running jobs go on; nothing new
    starts or is preempted, no node is declared lost, no time limit or idle policy acts."""
    if paused:
        get_redis().set(PAUSE_KEY, 1)
    else:
        get_redis().delete(PAUSE_KEY)


def loop_paused() -> bool:
    return bool(get_redis().exists(PAUSE_KEY))


def request_cycle() -> None:
    """Asks for a cycle now. Requests coalesce: while one cycle is queued and has not started,
    more requests add nothing, since it will see their changes when it starts."""
    if get_redis().set(QUEUED_KEY, 1, px=QUEUED_TTL_MS, nx=True):
        schedule_cycle.delay()


def load_profile() -> core.Profile:
    return core.load_profile(settings.SCHEDULER_PROFILE)


def run_cycle(
    profile: core.Profile | None = None,
    wait: bool = False,
    unless_paused: bool = False,
    requested: bool = False,
) -> dict[str, Any] | None:
    """One cycle: snapshot -> decide -> apply, in one transaction under the advisory lock.

    With wait, it queues behind a cycle that holds the lock; otherwise it returns None then.
    With unless_paused, the pause is checked again once the lock is held: a cycle that queued
    behind another before the loop was paused does not run after it. A requested cycle
    (`requested`) lets new requests queue another only once it holds the lock: until then its
    snapshot is still to come and will see their changes, so requests made while it waits add
    no second waiter (each would hold a worker).
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            if wait:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CYCLE_LOCK])
            else:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [CYCLE_LOCK])
                if not cursor.fetchone()[0]:
                    return None
        if requested:
            get_redis().delete(QUEUED_KEY)
        if unless_paused and loop_paused():
            return {"paused": True}
        now = time.time()
        started = time.perf_counter()
        loaded = load_snapshot(now, held=settle_dependencies())
        plan = core.decide(loaded.snapshot, profile or load_profile(), now)
        result = apply_plan(plan, loaded, now)
    record_cycle_duration(time.perf_counter() - started)
    return result


@shared_task(acks_late=False)
def schedule_cycle(from_beat: bool = False) -> dict[str, Any] | None:
    """A requested cycle queues behind one in progress: it must see the change that asked for
    it. Beat's cycle (`from_beat`) is only the safety net, so it does not wait: while a cycle
    holds the lock it returns None at once. Waiting, beat's tasks piled up behind a slow cycle,
    each holding a worker (the beat entry's expiry drops those a busy worker never took).

    Beat's task also ends the stops whose agents never confirmed them (end_overdue_stops)."""
    if loop_paused():
        return {"paused": True}
    if from_beat:
        profile_grace_s = load_profile().cycle.grace_period_s
        end_overdue_stops(timezone.now(), settings.TIME_LIMIT_FORCE_AFTER_S, profile_grace_s)
        return run_cycle(unless_paused=True)
    return run_cycle(wait=True, unless_paused=True, requested=True)

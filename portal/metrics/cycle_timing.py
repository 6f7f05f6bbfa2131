"""The scheduling-cycle duration histogram, kept in Redis: cycles run in any worker process, and
/metrics is served by any web process, so the counts live where both can reach them."""

from __future__ import annotations

from portal.lib.redis import get_redis

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
KEY = "metrics:cycle_seconds"


def record_cycle_duration(seconds: float) -> None:
    bucket = next((str(b) for b in BUCKETS if seconds <= b), "+Inf")
    pipe = get_redis().pipeline()
    pipe.hincrby(KEY, bucket, 1)
    pipe.hincrbyfloat(KEY, "sum", seconds)
    pipe.execute()


def cycle_histogram() -> tuple[list[tuple[str, int]], float]:
    """Cumulative bucket counts as Prometheus wants them, and the sum of durations."""
    raw = {k.decode(): float(v) for k, v in get_redis().hgetall(KEY).items()}
    cumulative, running = [], 0
    for bound in [*map(str, BUCKETS), "+Inf"]:
        running += int(raw.get(bound, 0))
        cumulative.append((bound, running))
    return cumulative, raw.get("sum", 0.0)

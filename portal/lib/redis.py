"""One Redis client (and connection pool) per process, for everything but the channel layer."""

from __future__ import annotations

import functools
import os

import redis
from django.conf import settings


def get_redis() -> redis.Redis:
    return _client_for(os.getpid(), settings.REDIS_URL)


@functools.cache
def _client_for(pid: int, url: str) -> redis.Redis:
    # Keyed by pid: a forked Celery worker must not share its parent's sockets.
    return redis.Redis.from_url(url)

"""The scheduler tests are pure: no database, no Django settings, no cache, no live stack.

The repository-wide conftest has autouse fixtures for Django tests (fast password hashing
through pytest-django's `settings`, clearing the cache, pausing the live worker). These tests
use none of that, so the fixtures are replaced by no-ops here: the suite runs the same with
pytest-django active and with `-p no:django`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def fast_password_hashing() -> None:
    return None


@pytest.fixture(autouse=True)
def fresh_throttle_counts() -> None:
    return None


@pytest.fixture(autouse=True)
def background_only_in_live_tests() -> Iterator[None]:
    yield


@pytest.fixture(autouse=True)
def webhooks_stay_on_loopback() -> None:
    return None

"""The scheduler tests are pure: no database, no Django settings.

The repository-wide conftest switches fast password hashing on for every test through
pytest-django's `settings` fixture; these tests never hash a password, so the fixture is
replaced by a no-op here and the suite also runs with `-p no:django`.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fast_password_hashing() -> None:
    return None

"""Benchmarks that need the portal: start a private PostgreSQL and Redis, point Django at them,
migrate, and clean up afterwards, as `make test` does."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from portal.devstack import private_services

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def portal_database() -> Iterator[dict[str, str]]:
    """Yields the environment of a migrated portal database on private services."""
    with private_services() as services:
        env = {**os.environ, **services.env, "DEBUG": "true"}
        os.environ.update(services.env)
        os.environ["DEBUG"] = "true"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=REPO, env=env, check=True
        )
        import django

        django.setup()
        yield env

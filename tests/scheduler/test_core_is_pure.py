"""scheduler.core and scheduler.sim must import only the standard library and themselves, so
the same code runs inside Celery, in the simulator and in tests without a database."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.import_scan import imported_modules, imported_roots

ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = [ROOT / "scheduler" / "core", ROOT / "scheduler" / "sim"]
FORBIDDEN = {"django", "celery", "portal", "redis", "psycopg", "psycopg2", "channels", "rest_framework"}


def pure_files() -> list[Path]:
    return sorted(p for package in PURE_PACKAGES for p in package.rglob("*.py"))


def test_there_is_code_to_scan() -> None:
    assert len(pure_files()) >= 10


@pytest.mark.parametrize("path", pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_stdlib_and_scheduler(path: Path) -> None:
    roots = imported_roots(path)
    assert not roots & FORBIDDEN, f"{path.name} imports {sorted(roots & FORBIDDEN)}"
    foreign = {r for r in roots if r not in sys.stdlib_module_names and r != "scheduler"}
    assert not foreign, f"{path.name} imports non-stdlib modules {sorted(foreign)}"


def test_core_does_not_import_the_simulator() -> None:
    for path in (ROOT / "scheduler" / "core").rglob("*.py"):
        for _, module in imported_modules(path):
            assert not module.startswith("scheduler.sim"), path.name


def test_scan_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from django.db import models\nimport celery.app\n", encoding="utf-8")
    assert imported_roots(bad) >= {"django", "celery"}

"""The agent package imports no Django, Celery, portal, Redis, psycopg or Channels (an AST scan)."""

from __future__ import annotations

from pathlib import Path

import agents
from tests.import_scan import imported_modules

FORBIDDEN = ("django", "celery", "portal", "redis", "psycopg", "psycopg2", "channels", "rest_framework")
PACKAGE_DIR = Path(agents.__file__).parent


def test_agents_import_no_django_or_portal() -> None:
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    assert len(files) > 10
    offending = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {module}"
        for path in files
        for line, module in imported_modules(path)
        if module.split(".")[0] in FORBIDDEN
    ]
    assert offending == []


def test_the_scan_would_notice(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import django.conf\nfrom portal.jobs import services\nimportlib.import_module('celery')\n"
    )
    assert [module for _, module in imported_modules(sample)] == ["django.conf", "portal.jobs", "celery"]

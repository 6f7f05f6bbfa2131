"""The client package must install and run without the portal: an AST scan of its imports."""

from __future__ import annotations

import sys
from pathlib import Path

import gpuportal
from tests.import_scan import imported_modules

FORBIDDEN = ("django", "portal", "celery", "channels", "rest_framework", "agents", "scheduler", "psycopg")
PACKAGE_DIR = Path(gpuportal.__file__).parent
EXAMPLES_DIR = PACKAGE_DIR.parent / "examples"


def test_the_client_package_and_examples_import_no_django_portal_or_agents() -> None:
    files = sorted(PACKAGE_DIR.rglob("*.py")) + sorted(EXAMPLES_DIR.rglob("*.py"))
    assert len(files) >= 7
    offending = [
        f"{path.name}:{line}: {module}"
        for path in files
        for line, module in imported_modules(path)
        if module.split(".")[0] in FORBIDDEN
    ]
    assert offending == []


def test_the_checkpoint_helper_needs_only_the_standard_library() -> None:
    """Job images may lack httpx, rich and pydantic; the helper must still import."""
    modules = [m for _, m in imported_modules(PACKAGE_DIR / "checkpoint.py")]
    outside = [m for m in modules if m.split(".")[0] not in sys.stdlib_module_names | {"__future__"}]
    assert outside == []
    init = [m for _, m in imported_modules(PACKAGE_DIR / "__init__.py")]
    assert set(init) <= {"__future__"}


def test_the_scan_would_notice(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import django.conf\nfrom portal.jobs import services\nimportlib.import_module('celery')\n"
    )
    assert [module for _, module in imported_modules(sample)] == ["django.conf", "portal.jobs", "celery"]

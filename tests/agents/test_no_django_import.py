"""The agent package imports no Django, Celery, portal, Redis, psycopg or Channels (an AST scan)."""

from __future__ import annotations

import ast
from pathlib import Path

import agents

FORBIDDEN = ("django", "celery", "portal", "redis", "psycopg", "psycopg2", "channels", "rest_framework")
PACKAGE_DIR = Path(agents.__file__).parent


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            found += [(node.lineno, arg.value) for arg in node.args if isinstance(arg, ast.Constant)]
    return found


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

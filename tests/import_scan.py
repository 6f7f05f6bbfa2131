"""What a Python file imports, read from its syntax tree: the purity tests of scheduler/core,
agents/ and gpuportal/ all ask this one question."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every absolute import, including import_module("...") calls."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
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


def imported_roots(path: Path) -> set[str]:
    return {module.split(".")[0] for _, module in imported_modules(path)}

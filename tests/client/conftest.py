"""Run the real `gpuportal` command (a subprocess) against the live portal."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def cli_env(home: Path, url: str | None, token: str | None) -> dict[str, str]:
    """A clean environment: no GPUPORTAL_* from the developer's shell, a private config dir,
    and the repository on the path whether or not the package was pip-installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPORTAL_")}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        COLUMNS="220",
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
    )
    if url:
        env["GPUPORTAL_URL"] = url
    if token:
        env["GPUPORTAL_TOKEN"] = token
    return env


@pytest.fixture
def run_cli(live_stack: dict[str, Any], tmp_path: Path) -> RunCli:
    """run_cli(token, "list", "--all") -> CompletedProcess; token None means the stored one;
    `env` adds to (or overrides) the clean environment, e.g. the terminal's width."""

    def run(
        token: str | None,
        *args: str,
        input: str | None = None,
        timeout: float = 240,
        url: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "gpuportal", *args, "--poll", "0.5"]
            if args and args[0] in ("submit", "logs")
            else [sys.executable, "-m", "gpuportal", *args],
            env={**cli_env(tmp_path / "home", live_stack["http"] if url else None, token), **(env or {})},
            cwd=tmp_path,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if "HTTP 5" in result.stderr:  # a portal bug: keep its traceback with the failure
            web_log = Path(live_stack["logs"]) / "web.log"
            result.stderr += "\n--- web.log (tail) ---\n" + "\n".join(web_log.read_text().splitlines()[-60:])
        return result

    return run

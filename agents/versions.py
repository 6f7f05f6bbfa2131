"""Version gate: a node whose container runtime is too old to be safe registers drained.

Default minimums and the CVEs behind them (details in docs/agent.md):

- runc 1.1.12: CVE-2024-21626 ("Leaky Vessels"), a file-descriptor leak that lets a
  container escape to the host.
- Docker Engine 25.0.2: the first 25.x release that ships runc 1.1.12 and the matching
  engine fixes.
- NVIDIA Container Toolkit 1.17.8: CVE-2024-0132 (fixed in 1.16.2), its bypass
  CVE-2025-23359 (fixed in 1.17.4) and CVE-2025-23266 "NVIDIAScape" (fixed in 1.17.8),
  each a container escape through the toolkit's hooks driven by an image.

Distributions backport fixes without changing the upstream version (Debian's runc
1.1.5+ds1-1+deb12u1 carries the CVE-2024-21626 fix): an operator who checked that can
lower the minimum on the command line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from agents.protocol import RuntimeInfo

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class MinimumVersions:
    docker: str | None = "25.0.2"
    runc: str | None = "1.1.12"
    nvidia_container_toolkit: str | None = "1.17.8"


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """The leading ``major.minor[.patch]`` of a version string; None when there is none."""
    if not text:
        return None
    match = _VERSION.search(text)
    if match is None:
        return None
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def drain_reasons(info: RuntimeInfo, minimums: MinimumVersions, check_toolkit: bool) -> list[str]:
    """Why this node must not get work; empty when every checked version is recent enough.

    ``check_toolkit`` is True when containers get real GPUs through the NVIDIA toolkit; an
    unknown toolkit version then counts as too old (fail closed).
    """
    if info.kind != "docker":
        return []
    reasons = []
    for name, found, minimum in (
        ("Docker Engine", info.version, minimums.docker),
        ("runc", info.runc_version, minimums.runc),
    ):
        reason = _too_old(name, found, minimum)
        if reason:
            reasons.append(reason)
    if check_toolkit:
        reason = _too_old(
            "NVIDIA Container Toolkit",
            info.nvidia_container_toolkit_version,
            minimums.nvidia_container_toolkit,
        )
        if reason:
            reasons.append(reason)
    return reasons


def detect_toolkit_version() -> str | None:
    """Ask the NVIDIA Container Toolkit CLI for its version; None when it is not installed."""
    for command in (["nvidia-ctk", "--version"], ["nvidia-container-cli", "--version"]):
        if shutil.which(command[0]) is None:
            continue
        try:
            output = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        parsed = parse_version(output)
        if parsed is not None:
            return ".".join(map(str, parsed))
    return None


def _too_old(name: str, found: str | None, minimum: str | None) -> str | None:
    if minimum is None:
        return None
    required = parse_version(minimum)
    actual = parse_version(found)
    if actual is None:
        return f"{name} version is unknown; {minimum} or newer is required"
    if required is not None and actual < required:
        return f"{name} {found} is older than the required {minimum}"
    return None

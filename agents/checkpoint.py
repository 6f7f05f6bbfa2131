"""The checkpoint marker: how a job tells the agent that it saved a checkpoint.

Contract with the job (documented in docs/agent.md):

1. The job finds its checkpoint directory in ``GPUPORTAL_CHECKPOINT_DIR``. On a later
   attempt it gets the same directory and ``GPUPORTAL_RESUME=1``.
2. On the checkpoint signal (``GPUPORTAL_CHECKPOINT_SIGNAL``, default SIGUSR1) it saves,
   then writes ``checkpoint.json`` into that directory *atomically* (write a temporary
   file in the same directory, then rename it over the marker), e.g. with
   :func:`write_marker`::

       {"step": 4000, "path": "step-4000"}

   ``path`` is the checkpoint (file or directory), relative to the checkpoint directory.
   An optional ``time`` (ISO 8601 with a zone) says when it was taken; the agent uses
   the marker's modification time otherwise.
3. The agent sees a *new* marker (a different file than before the signal), stops the
   job and reports ``checkpoint_done`` with path, size, step and time.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

MARKER_NAME = "checkpoint.json"


class CheckpointMarker(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    step: int = Field(ge=0)
    path: str = Field(min_length=1, max_length=4096)
    time: AwareDatetime | None = None


@dataclass(frozen=True)
class MarkerIdentity:
    """Tells one marker file from another: a rename always brings a new inode."""

    inode: int
    mtime_ns: int


@dataclass(frozen=True)
class FoundCheckpoint:
    path: Path
    size_bytes: int
    step: int
    time: datetime


class BadMarkerError(ValueError):
    """The marker exists but is not valid or points outside the checkpoint directory."""


def write_marker(checkpoint_dir: str | Path, step: int, path: str) -> Path:
    """Write the marker atomically (for jobs and tests; the client package has its own copy)."""
    directory = Path(checkpoint_dir)
    temporary = directory / f".{MARKER_NAME}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps({"step": step, "path": path, "time": datetime.now(UTC).isoformat()}))
    os.replace(temporary, directory / MARKER_NAME)
    return directory / MARKER_NAME


def marker_identity(checkpoint_dir: Path) -> MarkerIdentity | None:
    try:
        stat = (checkpoint_dir / MARKER_NAME).stat()
    except FileNotFoundError:
        return None
    return MarkerIdentity(inode=stat.st_ino, mtime_ns=stat.st_mtime_ns)


def read_marker(checkpoint_dir: Path) -> FoundCheckpoint:
    """Parse the marker and measure the checkpoint it names; raises BadMarkerError."""
    marker_path = checkpoint_dir / MARKER_NAME
    try:
        marker = CheckpointMarker.model_validate_json(marker_path.read_bytes())
    except (OSError, ValidationError) as error:
        raise BadMarkerError(f"checkpoint marker is not valid: {error}") from error
    root = Path(os.path.realpath(checkpoint_dir))
    target = Path(os.path.realpath(root / marker.path))
    if target != root and root not in target.parents:
        raise BadMarkerError(f"checkpoint path {marker.path!r} is outside the checkpoint directory")
    if not target.exists():
        raise BadMarkerError(f"checkpoint path {marker.path!r} does not exist")
    taken = marker.time or datetime.fromtimestamp(marker_path.stat().st_mtime, UTC)
    return FoundCheckpoint(path=target, size_bytes=_size(target), step=marker.step, time=taken)


async def wait_for_new_marker(
    checkpoint_dir: Path,
    before: MarkerIdentity | None,
    timeout_s: float,
    still_running: Callable[[], Awaitable[bool]],
    poll_s: float = 0.05,
) -> FoundCheckpoint | None:
    """Wait until a marker different from ``before`` appears; None on timeout.

    Also stops waiting when the job ends (``still_running`` returns False): a job that
    saves and exits on the signal is the common case.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        current = marker_identity(checkpoint_dir)
        if current is not None and current != before:
            return read_marker(checkpoint_dir)
        if loop.time() >= deadline or not await still_running():
            # One last look: the job may have written the marker just before exiting.
            current = marker_identity(checkpoint_dir)
            if current is not None and current != before:
                return read_marker(checkpoint_dir)
            return None
        await asyncio.sleep(poll_s)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            file_path = Path(directory) / name
            if not file_path.is_symlink():
                total += file_path.stat().st_size
    return total

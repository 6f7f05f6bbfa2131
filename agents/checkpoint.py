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
   the marker's modification time otherwise. An optional ``metric`` (a number) with
   ``metric_mode`` (``min``, the default, or ``max``) says how good it is: the portal's
   garbage collection keeps the best one besides the latest.
3. The agent sees a *new* marker (a different file than before the signal), builds the
   checkpoint's manifest (every file with its size and sha256), publishes it atomically
   under ``.manifests/`` in the directory, and only then reports ``checkpoint_done`` and
   stops the job. A checkpoint without a published manifest is never reported, so the
   portal never refers to it.
4. A resuming attempt is told which committed checkpoint to resume from; the agent checks
   the files against its manifest before it starts the attempt and points the marker at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal
from uuid import uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from agents.protocol import ManifestFile, ResumeFrom

MARKER_NAME = "checkpoint.json"
MANIFEST_DIR = ".manifests"
MANIFEST_VERSION = 1
# A checkpoint with more files than this is refused: its manifest would not fit a message.
MAX_MANIFEST_FILES = 10_000
# A marker is a few hundred bytes; a larger one is refused unread rather than read into memory
# (a job could point it at something endless).
MAX_MARKER_BYTES = 64 * 1024
# Reading a new marker and measuring its checkpoint may take at least this long, even when the
# grace period is nearly over; after that the checkpoint wait gives up and the job is stopped.
MARKER_READ_MIN_S = 10.0
# Test hook: with this variable set to N seconds the agent pauses that long in the middle of
# building a manifest (after the first file) and creates MANIFEST_PAUSE_FLAG in the checkpoint
# directory first, so a fault test can kill it there. Never set it in production.
MANIFEST_PAUSE_ENV = "GPUPORTAL_AGENT_TEST_MANIFEST_PAUSE_S"
MANIFEST_PAUSE_FLAG = ".manifest-pause"


class CheckpointMarker(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    step: int = Field(ge=0)
    path: str = Field(min_length=1, max_length=4096)
    time: AwareDatetime | None = None
    metric: float | None = Field(default=None, allow_inf_nan=False)
    metric_mode: Literal["min", "max"] = "min"


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
    metric: float | None = None
    metric_mode: str = "min"


class Manifest(BaseModel):
    """Every file of one checkpoint, relative to the checkpoint directory, with size and sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = MANIFEST_VERSION
    step: int = Field(ge=0)
    path: str
    time: AwareDatetime
    metric: float | None = None
    metric_mode: Literal["min", "max"] = "min"
    files: list[ManifestFile]

    @property
    def size_bytes(self) -> int:
        return sum(item.size for item in self.files)


@dataclass(frozen=True)
class PublishedManifest:
    manifest: Manifest
    relative_path: str  # of the manifest file, relative to the checkpoint directory
    sha256: str  # of the manifest file's bytes: what the portal commits and a resume checks


class ManifestError(ValueError):
    """The checkpoint cannot be described safely (a path or link escapes), or does not match."""


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
    """The marker entry itself (lstat: a link is not followed to whatever it names)."""
    try:
        info = os.lstat(checkpoint_dir / MARKER_NAME)
    except FileNotFoundError:
        return None
    return MarkerIdentity(inode=info.st_ino, mtime_ns=info.st_mtime_ns)


def read_marker(checkpoint_dir: Path) -> FoundCheckpoint:
    """Parse the marker and measure the checkpoint it names; raises BadMarkerError."""
    payload, modified = _read_marker_bytes(checkpoint_dir / MARKER_NAME)
    try:
        marker = CheckpointMarker.model_validate_json(payload)
    except ValidationError as error:
        raise BadMarkerError(f"checkpoint marker is not valid: {error}") from error
    root = Path(os.path.realpath(checkpoint_dir))
    target = Path(os.path.realpath(root / marker.path))
    if target != root and root not in target.parents:
        raise BadMarkerError(f"checkpoint path {marker.path!r} is outside the checkpoint directory")
    if not target.exists():
        raise BadMarkerError(f"checkpoint path {marker.path!r} does not exist")
    taken = marker.time or datetime.fromtimestamp(modified, UTC)
    return FoundCheckpoint(
        path=target,
        size_bytes=_size(target),
        step=marker.step,
        time=taken,
        metric=marker.metric,
        metric_mode=marker.metric_mode,
    )


def _read_marker_bytes(marker_path: Path) -> tuple[bytes, float]:
    """The marker's bytes and modification time; raises BadMarkerError.

    The job owns the directory and may put anything under the marker's name. The root agent
    must never follow a link (it would read a host file, and its text would end up in the
    reason sent to the portal), never wait on a FIFO (the read would block for ever and the
    job would keep its GPUs), and never read an endless device into memory: so the marker is
    opened without following links and without blocking, and must be a small regular file.
    """
    try:
        fd = os.open(marker_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        reason = "it is a symbolic link" if error.errno == errno.ELOOP else error.strerror
        raise BadMarkerError(f"checkpoint marker cannot be read: {reason}") from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadMarkerError("checkpoint marker is not a regular file")
        if info.st_size > MAX_MARKER_BYTES:
            raise BadMarkerError(f"checkpoint marker is larger than {MAX_MARKER_BYTES} bytes")
        chunks = []
        size = 0
        while chunk := os.read(fd, MAX_MARKER_BYTES + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_MARKER_BYTES:  # grew while it was read
                raise BadMarkerError(f"checkpoint marker is larger than {MAX_MARKER_BYTES} bytes")
        return b"".join(chunks), info.st_mtime
    except OSError as error:
        raise BadMarkerError(f"checkpoint marker cannot be read: {error.strerror}") from error
    finally:
        os.close(fd)


async def wait_for_new_marker(
    checkpoint_dir: Path,
    before: MarkerIdentity | None,
    timeout_s: float,
    still_running: Callable[[], Awaitable[bool]],
    poll_s: float = 0.05,
) -> FoundCheckpoint | None:
    """Wait until a marker different from ``before`` appears; None on timeout.

    Also stops waiting when the job ends (``still_running`` returns False): a job that
    saves and exits on the signal is the common case. Reading the marker is bounded too (by
    what is left of ``timeout_s``, at least MARKER_READ_MIN_S): the job is stopped when its
    grace period ends even if its checkpoint directory hangs (a stuck network filesystem);
    raises BadMarkerError then.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        current = marker_identity(checkpoint_dir)
        if current is not None and current != before:
            return await _read_marker_bounded(checkpoint_dir, max(deadline - loop.time(), MARKER_READ_MIN_S))
        if loop.time() >= deadline or not await still_running():
            # One last look: the job may have written the marker just before exiting.
            current = marker_identity(checkpoint_dir)
            if current is not None and current != before:
                return await _read_marker_bounded(checkpoint_dir, MARKER_READ_MIN_S)
            return None
        await asyncio.sleep(poll_s)


async def _read_marker_bounded(checkpoint_dir: Path, timeout_s: float) -> FoundCheckpoint:
    """read_marker off the event loop (it walks the checkpoint), given up after ``timeout_s``;
    a thread stuck in the filesystem is left behind, the agent goes on."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(read_marker, checkpoint_dir), timeout_s)
    except TimeoutError:
        raise BadMarkerError(f"checkpoint marker could not be read within {timeout_s:g}s") from None


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


# ---------------------------------------------------------------------------------------------
# Manifests: what makes a checkpoint complete for the portal, and what a resume checks.
# ---------------------------------------------------------------------------------------------


def build_manifest(checkpoint_dir: Path, found: FoundCheckpoint) -> Manifest:
    """List and hash every file of the checkpoint ``found`` names; raises ManifestError.

    Paths are relative to the checkpoint directory. A symlink is followed only when it stays
    inside the directory (then the file it names is hashed under the link's path); anything
    else that is not a regular file (a device, a socket, a link out) refuses the checkpoint,
    because a resume could not trust it. Runs for as long as hashing takes: call it off the
    event loop.
    """
    root = Path(os.path.realpath(checkpoint_dir))
    target = Path(os.path.realpath(found.path))
    if target == root or root not in target.parents:
        raise ManifestError(f"checkpoint path {str(found.path)!r} must lie inside the checkpoint directory")
    if MANIFEST_DIR in target.relative_to(root).parts:
        raise ManifestError("the checkpoint path must not be inside the manifest directory")
    paths = [target] if not target.is_dir() else sorted(_walk(target))
    if len(paths) > MAX_MANIFEST_FILES:
        raise ManifestError(f"the checkpoint has {len(paths)} files; the limit is {MAX_MANIFEST_FILES}")
    pause_s = float(os.environ.get(MANIFEST_PAUSE_ENV) or 0)
    files = []
    for index, path in enumerate(paths):
        relative = path.relative_to(root).as_posix()
        real = Path(os.path.realpath(path))
        if real != root and root not in real.parents:
            raise ManifestError(f"{relative} links outside the checkpoint directory")
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise ManifestError(f"{relative} is not a regular file")
        size, digest = _hash_file(real)
        files.append(ManifestFile(path=relative, size=size, sha256=digest))
        if pause_s and index == 0:
            (root / MANIFEST_PAUSE_FLAG).write_text(relative)
            time.sleep(pause_s)
    return Manifest(
        step=found.step,
        path=target.relative_to(root).as_posix(),
        time=found.time,
        metric=found.metric,
        metric_mode=found.metric_mode,  # type: ignore[arg-type]
        files=files,
    )


def publish_manifest(checkpoint_dir: Path, manifest: Manifest) -> PublishedManifest:
    """Write the manifest into ``.manifests/`` atomically (temporary file, fsync, rename, fsync
    of the directory), so a crash leaves either no manifest or a whole one.

    The file is named by its own hash: replicas on several hosts share the directory and save
    the same step, each with its own marker time, so a name by step and path alone would let
    one replica's manifest replace the one the portal committed for the other.

    The job owns the checkpoint directory and could make ``.manifests`` a link to any host
    directory: it is used only when it is a real directory, opened without following links,
    and the manifest is written and renamed through that directory's descriptor. Raises
    ManifestError when ``.manifests`` is not a directory, OSError when writing fails."""
    payload = manifest.model_dump_json().encode()
    digest = hashlib.sha256(payload).hexdigest()
    name = f"{manifest.step}-{digest[:16]}.json"
    checkpoint_fd = os.open(checkpoint_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(MANIFEST_DIR, 0o755, dir_fd=checkpoint_fd)
        try:
            manifests_fd = os.open(
                MANIFEST_DIR,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=checkpoint_fd,
            )
        except OSError as error:  # ELOOP (a link) or ENOTDIR (a file, a pipe)
            raise ManifestError(f"{MANIFEST_DIR} in the checkpoint directory is not a directory") from error
    finally:
        os.close(checkpoint_fd)
    try:
        _atomic_write(manifests_fd, name, payload)
    finally:
        os.close(manifests_fd)
    return PublishedManifest(
        manifest=manifest,
        relative_path=f"{MANIFEST_DIR}/{name}",
        sha256=digest,
    )


def verify_resume(checkpoint_dir: Path, resume: ResumeFrom) -> Manifest:
    """Check the committed checkpoint a resuming attempt starts from: the manifest file is the
    one the portal committed (same sha256), and every file in it has its size and sha256.
    Raises ManifestError with the first difference. Runs for as long as hashing takes."""
    root = Path(os.path.realpath(checkpoint_dir))
    manifest_path = Path(os.path.realpath(root / resume.manifest_path))
    if root not in manifest_path.parents:
        raise ManifestError(f"manifest {resume.manifest_path!r} is outside the checkpoint directory")
    try:
        payload = manifest_path.read_bytes()
    except OSError as error:
        raise ManifestError(f"manifest {resume.manifest_path} cannot be read: {error.strerror}") from error
    if hashlib.sha256(payload).hexdigest() != resume.manifest_sha256:
        raise ManifestError(f"manifest {resume.manifest_path} differs from the one the portal committed")
    try:
        manifest = Manifest.model_validate_json(payload)
    except ValidationError as error:
        raise ManifestError(f"manifest {resume.manifest_path} is not valid: {error}") from error
    for item in manifest.files:
        path = Path(os.path.realpath(root / item.path))
        if root not in path.parents:
            raise ManifestError(f"{item.path} is outside the checkpoint directory")
        try:
            size, digest = _hash_file(path)
        except OSError as error:
            raise ManifestError(f"{item.path} cannot be read: {error.strerror}") from error
        if size != item.size:
            raise ManifestError(f"{item.path} has {size} bytes; the manifest says {item.size}")
        if digest != item.sha256:
            raise ManifestError(f"{item.path} does not match its sha256 in the manifest")
    return manifest


def point_marker_at(checkpoint_dir: Path, manifest: Manifest) -> None:
    """Make the marker name the committed checkpoint a resume starts from, for jobs that read
    the marker to resume (a newer marker may name a checkpoint the portal never committed)."""
    directory = Path(checkpoint_dir)
    marker = {"step": manifest.step, "path": manifest.path, "time": manifest.time.isoformat()}
    if manifest.metric is not None:
        marker |= {"metric": manifest.metric, "metric_mode": manifest.metric_mode}
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _atomic_write(directory_fd, MARKER_NAME, json.dumps(marker).encode())
    finally:
        os.close(directory_fd)


def _walk(directory: Path) -> list[Path]:
    """Every non-directory entry below ``directory``, without following directory links."""
    found = []
    for parent, subdirectories, names in os.walk(directory):
        for name in subdirectories:
            if (Path(parent) / name).is_symlink():
                names.append(name)  # a link to a directory: refused (or hashed) like a file link
        found.extend(Path(parent) / name for name in names)
    return found


def _hash_file(path: Path) -> tuple[int, str]:
    """Size and sha256 of a regular file. Opened without blocking and checked on the open
    descriptor: the job may swap a checked file for a FIFO, whose read would never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ManifestError(f"{path.name} is not a regular file")
        digest = hashlib.sha256()
        size = 0
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _atomic_write(directory_fd: int, name: str, payload: bytes) -> None:
    """Temporary file, fsync, rename, fsync of the directory: a crash leaves the old file or the
    whole new one. The temporary name is unique because replicas share the directory.

    Everything goes through the directory's descriptor, and the temporary file is created new
    (O_EXCL, O_NOFOLLOW): the job that owns the directory cannot redirect the write with a
    link. The rename replaces a link named ``name`` itself, never what it points to."""
    temporary = f".{name}.{uuid4().hex}.tmp"
    fd = os.open(
        temporary,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=directory_fd,
    )
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    os.fsync(directory_fd)

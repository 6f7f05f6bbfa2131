"""The in-job checkpoint helper: the job's half of the agent's checkpoint contract.

The agent sets, for every attempt:

- ``GPUPORTAL_CHECKPOINT_DIR``: the job's checkpoint directory, the same for every attempt;
- ``GPUPORTAL_CHECKPOINT_SIGNAL``: the signal that asks the job to save (default SIGUSR1);
- ``GPUPORTAL_RESUME``: ``1`` when this attempt should continue from the last checkpoint.

When the portal wants the GPUs back it sends the signal, then waits (up to the job's grace
period) for a *new* ``checkpoint.json`` marker in the directory. The marker is
``{"step": N, "path": "<relative path>", "time": "<ISO 8601>"}``, optionally with
``"metric": <number>`` and ``"metric_mode": "min"`` (or ``"max"``), and must be replaced
atomically, because the agent reads it as soon as the new file appears. The agent also reports
checkpoints the job saves on its own, each with a manifest of its files; the portal keeps the
newest two and the best one (by the metric) and deletes older ones itself.

This module uses only the standard library, so it works in any job image that has Python,
without the rest of the client package (httpx, rich, pydantic) installed.

Typical use::

    from gpuportal.checkpoint import Checkpointer

    ckpt = Checkpointer()                       # registers the checkpoint signal
    state = ckpt.load_json() if ckpt.resume else None
    step = state["step"] if state else 0
    while step < total:
        step += 1
        loss = train_one_step()
        if step % 100 == 0 or ckpt.requested:
            ckpt.save_json(step, {"step": step}, metric=loss)   # lower is better
        if ckpt.requested:                      # the portal asked: saved, now leave
            break
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

MARKER_NAME = "checkpoint.json"
DEFAULT_SIGNAL = "SIGUSR1"
ENV_DIR = "GPUPORTAL_CHECKPOINT_DIR"
ENV_SIGNAL = "GPUPORTAL_CHECKPOINT_SIGNAL"
ENV_RESUME = "GPUPORTAL_RESUME"


class CheckpointError(RuntimeError):
    """The helper cannot do what was asked (no directory, a broken marker, ...)."""


@dataclass(frozen=True)
class SavedCheckpoint:
    """What the marker says: the step and the checkpoint's absolute path."""

    step: int
    path: Path
    time: datetime | None


def checkpoint_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The job's checkpoint directory, or None when the job runs outside the portal."""
    value = (environ if environ is not None else os.environ).get(ENV_DIR, "")
    return Path(value) if value else None


def is_resume(environ: dict[str, str] | None = None) -> bool:
    """True when the portal started this attempt to continue from the last checkpoint."""
    return (environ if environ is not None else os.environ).get(ENV_RESUME, "0") == "1"


def checkpoint_signal(environ: dict[str, str] | None = None) -> signal.Signals:
    """The signal the agent sends when the job must save (from the job spec, SIGUSR1 by default)."""
    name = (environ if environ is not None else os.environ).get(ENV_SIGNAL, "") or DEFAULT_SIGNAL
    try:
        return signal.Signals[name.upper()]
    except KeyError:
        raise CheckpointError(f"unknown checkpoint signal {name!r} in {ENV_SIGNAL}") from None


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write a file so that readers see the old content or the new, never a torn one.

    The temporary file lives in the same directory (a rename is atomic only within one file
    system) and is flushed to disk before the rename, so a crash cannot leave a marker that
    points at a half-written checkpoint.
    """
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    with _temporary_beside(target) as (handle, temporary):
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(temporary, target)
    _fsync_directory(target.parent)
    return target


def write_marker(
    directory: str | Path, step: int, path: str, metric: float | None = None, metric_mode: str = "min"
) -> Path:
    """Tell the agent that the checkpoint at ``path`` (relative to ``directory``) is complete.

    Each call creates a new file (a rename brings a new inode), which is how the agent tells
    a marker written after its request from one written before it. ``metric`` (with
    ``metric_mode`` ``min`` or ``max``: which is better) lets the portal keep the best
    checkpoint when it deletes old ones.
    """
    if step < 0:
        raise CheckpointError("a checkpoint step cannot be negative")
    if Path(path).is_absolute() or ".." in Path(path).parts or not path:
        raise CheckpointError(f"the checkpoint path must be relative to the directory, not {path!r}")
    if metric_mode not in ("min", "max"):
        raise CheckpointError(f"metric_mode must be min or max, not {metric_mode!r}")
    marker: dict[str, Any] = {"step": int(step), "path": path, "time": datetime.now(UTC).isoformat()}
    if metric is not None:
        marker |= {"metric": float(metric), "metric_mode": metric_mode}
    return atomic_write(Path(directory) / MARKER_NAME, json.dumps(marker))


def read_marker(directory: str | Path) -> SavedCheckpoint | None:
    """The last complete checkpoint named by the marker; None when there is none yet."""
    root = Path(directory)
    try:
        raw = json.loads((root / MARKER_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise CheckpointError(f"the checkpoint marker in {root} is not valid: {error}") from error
    if not isinstance(raw, dict) or not isinstance(raw.get("step"), int) or not raw.get("path"):
        raise CheckpointError(f"the checkpoint marker in {root} lacks step or path")
    taken = None
    if isinstance(raw.get("time"), str):
        with contextlib.suppress(ValueError):
            taken = datetime.fromisoformat(raw["time"])
    return SavedCheckpoint(step=raw["step"], path=root / raw["path"], time=taken)


class Checkpointer:
    """One job's checkpointing: the signal flag, atomic saves, the marker, and resuming.

    The signal handler only sets a flag. Saving inside a handler would interrupt the
    training step half-way (and Python's own I/O is not reentrant), so the training loop
    checks :attr:`requested` between steps and saves there.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        register: bool = True,
        keep: int | None = None,
        on_request: Callable[[], None] | None = None,
    ) -> None:
        found = Path(directory) if directory is not None else checkpoint_dir()
        if found is None:
            raise CheckpointError(
                f"no checkpoint directory: {ENV_DIR} is not set (the portal sets it for every job; "
                "pass a directory to run outside the portal)"
            )
        self.directory = found
        self.directory.mkdir(parents=True, exist_ok=True)
        self.resume = is_resume()
        self.signal = checkpoint_signal()
        self.keep = None if keep is None else max(1, keep)
        self._requested = False
        self._on_request = on_request
        if register:
            self.register()

    # -- the signal -----------------------------------------------------------------------

    def register(self) -> None:
        """Install the handler for the checkpoint signal (only from the main thread)."""
        signal.signal(self.signal, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self._requested = True
        if self._on_request is not None:
            self._on_request()

    @property
    def requested(self) -> bool:
        """True once the portal asked for a checkpoint: save now, then exit."""
        return self._requested

    # -- saving -------------------------------------------------------------------------

    def save_bytes(
        self,
        step: int,
        data: bytes,
        name: str | None = None,
        metric: float | None = None,
        metric_mode: str = "min",
    ) -> Path:
        """Save one file atomically and point the marker at it."""
        relative = name or f"step-{step}"
        target = atomic_write(self.directory / relative, data)
        write_marker(self.directory, step, relative, metric, metric_mode)
        self._prune(relative)
        return target

    def save_json(
        self,
        step: int,
        state: Any,
        name: str | None = None,
        metric: float | None = None,
        metric_mode: str = "min",
    ) -> Path:
        """Save a JSON-serialisable state; the usual choice for small training state."""
        return self.save_bytes(
            step, json.dumps(state).encode(), name or f"step-{step}.json", metric, metric_mode
        )

    @contextlib.contextmanager
    def saving(
        self, step: int, name: str | None = None, metric: float | None = None, metric_mode: str = "min"
    ) -> Iterator[Path]:
        """For frameworks that write files themselves (``torch.save(model, path)``).

        Yields a temporary path in the checkpoint directory; when the block ends without an
        error it is renamed to its final name and the marker is written. A failed save
        leaves the previous checkpoint in place.
        """
        relative = name or f"step-{step}"
        final = self.directory / relative
        fd, temporary = tempfile.mkstemp(prefix=f".{relative}.", suffix=".tmp", dir=self.directory)
        os.close(fd)
        os.unlink(temporary)  # the caller may write a file or a directory there
        try:
            yield Path(temporary)
            if final.is_dir() and Path(temporary).is_dir():
                _remove(final)
            os.replace(temporary, final)
        except BaseException:
            _remove(Path(temporary))
            raise
        _fsync_directory(self.directory)
        write_marker(self.directory, step, relative, metric, metric_mode)
        self._prune(relative)

    # -- resuming -----------------------------------------------------------------------

    def latest(self) -> SavedCheckpoint | None:
        """The last complete checkpoint, whether or not this attempt resumes."""
        return read_marker(self.directory)

    def load_bytes(self) -> bytes | None:
        saved = self.latest()
        return saved.path.read_bytes() if saved is not None else None

    def load_json(self) -> Any:
        """The state of the last complete checkpoint, or None when there is none."""
        data = self.load_bytes()
        return json.loads(data) if data is not None else None

    # -- housekeeping -------------------------------------------------------------------

    def _prune(self, current: str) -> None:
        """With ``keep``, keep only the newest ``keep`` checkpoints the helper wrote (for runs
        outside the portal). Under the portal leave ``keep`` unset: its garbage collection deletes
        old checkpoints and never one an attempt still resumes from."""
        if self.keep is None:
            return
        ours = [
            p
            for p in self.directory.iterdir()
            if p.name.startswith("step-") and p.name != current and not p.name.endswith(".tmp")
        ]
        ours.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in ours[self.keep - 1 :]:
            _remove(old)


@contextlib.contextmanager
def _temporary_beside(target: Path) -> Iterator[tuple[IO[bytes], str]]:
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    handle = os.fdopen(fd, "wb")
    try:
        yield handle, temporary
    except BaseException:
        handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    finally:
        handle.close()


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
        path.rmdir()
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

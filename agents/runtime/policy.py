"""What an attempt may ask of its host, checked by the agent itself before every start.

The portal validates job specs too, but the agent never relies on that: a value that
reached the database through a portal bug must still not reach the host (threat model:
an agent compromise is a host compromise). The portal may import :func:`env_problems`
to give the same answer at submit time.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from agents.protocol import DesiredAttempt

# Names only the agent sets. LD_* and NVIDIA_* steer the dynamic loader and the NVIDIA
# container hooks (CVE-2025-23266 used an image-controlled LD_PRELOAD against a host
# hook); CUDA_VISIBLE_DEVICES and GPUPORTAL_* describe the allocation.
RESERVED_ENV_PREFIXES = ("LD_", "NVIDIA_", "GPUPORTAL_")
RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES"})

# Container paths a mount may never cover.
FORBIDDEN_TARGETS = ("/", "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64")


# A Docker image reference: [registry[:port]/]path[:tag][@sha256:digest], lower-case path
# components. Anything else (shell syntax, options, upper case) never reaches the engine.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)


class PolicyError(ValueError):
    """The attempt asks for something this node does not allow; it is not started."""


@dataclass(frozen=True)
class VolumeRoot:
    """A host directory an admin allowed for job mounts; writable only when said so."""

    path: Path
    writable: bool = False

    @classmethod
    def parse(cls, text: str) -> VolumeRoot:
        """``/shared/data`` (read-only) or ``/shared/scratch:rw``."""
        path, _, mode = text.partition(":")
        if mode not in ("", "ro", "rw"):
            raise ValueError(f"volume root mode must be ro or rw, not {mode!r}")
        return cls(Path(path), writable=mode == "rw")


@dataclass(frozen=True)
class ResolvedMount:
    source: Path  # real path on the host, inside an allowed root
    target: str
    read_only: bool


@dataclass(frozen=True)
class HostPolicy:
    volume_roots: tuple[VolumeRoot, ...] = ()
    checkpoint_roots: tuple[Path, ...] = ()
    forbidden_sources: tuple[Path, ...] = field(default_factory=tuple)  # e.g. the agent's state dir
    allowed_registries: tuple[str, ...] = ()  # image registries containers may come from; () = any


@dataclass(frozen=True)
class LaunchPlan:
    """An attempt checked against the policy, with the environment the agent sets."""

    attempt: DesiredAttempt
    env: dict[str, str]
    mounts: tuple[ResolvedMount, ...]
    checkpoint_dir: Path | None  # on the host, created


def is_reserved_env(name: str) -> bool:
    upper = name.upper()
    return upper in RESERVED_ENV_NAMES or upper.startswith(RESERVED_ENV_PREFIXES)


def env_problems(env: dict[str, str]) -> list[str]:
    """Why a user environment is refused; empty when it is acceptable."""
    return [
        f"environment variable {name} is reserved for the agent"
        for name in sorted(env)
        if is_reserved_env(name)
    ]


def image_registry(image: str) -> str:
    """The registry an image reference pulls from, as Docker reads it: the first path part when
    it names a host (has a dot or a port, or is localhost), else Docker Hub."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def image_problems(image: str, allowed_registries: tuple[str, ...] = ()) -> list[str]:
    """Why an image reference is refused; empty when it is a plain, well-formed reference from
    an allowed registry (any registry when none are listed)."""
    if len(image) > 255 or not _IMAGE_REFERENCE.match(image):
        return [f"image {image[:80]!r} is not a valid image reference"]
    registry = image_registry(image)
    if allowed_registries and registry not in allowed_registries:
        return [f"registry {registry} is not allowed here (allowed: {', '.join(allowed_registries)})"]
    return []


def agent_env(attempt: DesiredAttempt, checkpoint_dir_seen_by_job: str | None) -> dict[str, str]:
    """The variables the agent sets for every attempt; they win over anything else."""
    uuids = ",".join(gpu.uuid for gpu in attempt.gpus)
    return {
        "GPUPORTAL_JOB_ID": attempt.job_id,
        "GPUPORTAL_ATTEMPT_ID": attempt.attempt_id,
        "GPUPORTAL_CHECKPOINT_DIR": checkpoint_dir_seen_by_job or "",
        "GPUPORTAL_RESUME": "1" if attempt.resume else "0",
        "GPUPORTAL_CHECKPOINT_SIGNAL": attempt.checkpoint_signal,
        "GPUPORTAL_REPLICA": str(attempt.replica),
        "GPUPORTAL_REPLICAS": str(attempt.replicas),
        "GPUPORTAL_REPLICA_NODES": ",".join(attempt.replica_nodes),
        # An empty list hides every GPU; an image's own NVIDIA_VISIBLE_DEVICES=all (CUDA base
        # images set it) must not widen the allocation, so the agent always sets it.
        "CUDA_VISIBLE_DEVICES": uuids,
        "NVIDIA_VISIBLE_DEVICES": uuids or "void",
    }


def prepare(attempt: DesiredAttempt, policy: HostPolicy, checkpoint_target: str | None = None) -> LaunchPlan:
    """Check an attempt and build its launch plan; raises PolicyError with every problem.

    ``checkpoint_target`` is where the checkpoint directory appears to the job (a path in
    the container); None means the job sees the host path (process runtime).
    """
    problems = env_problems(attempt.env)
    mounts: list[ResolvedMount] = []
    for mount in attempt.mounts:
        try:
            mounts.append(resolve_mount(mount.source, mount.target, mount.read_only, policy))
        except PolicyError as error:
            problems.append(str(error))
    checkpoint_dir = None
    if attempt.checkpoint_dir is not None:
        try:
            checkpoint_dir = resolve_checkpoint_dir(attempt.checkpoint_dir, policy)
        except PolicyError as error:
            problems.append(str(error))
    if problems:
        raise PolicyError("; ".join(problems))
    seen_by_job = None
    if checkpoint_dir is not None:
        seen_by_job = checkpoint_target or str(checkpoint_dir)
    env = {**attempt.env, **agent_env(attempt, seen_by_job)}
    return LaunchPlan(attempt=attempt, env=env, mounts=tuple(mounts), checkpoint_dir=checkpoint_dir)


def resolve_mount(source: str, target: str, read_only: bool, policy: HostPolicy) -> ResolvedMount:
    """Resolve symlinks and check the mount against the admin's volume roots."""
    if not source.startswith("/"):
        raise PolicyError(f"mount source {source!r} is not an absolute path")
    real_source = Path(os.path.realpath(source))
    root = _containing_root(real_source, policy.volume_roots)
    if root is None:
        raise PolicyError(f"mount source {source!r} is outside the volumes allowed on this node")
    if any(
        _is_within(real_source, forbidden) or _is_within(forbidden, real_source)
        for forbidden in policy.forbidden_sources
    ):
        raise PolicyError(f"mount source {source!r} overlaps a directory of the agent")
    if not read_only and not root.writable:
        raise PolicyError(f"mount source {source!r} may only be mounted read-only")
    normalized_target = _normalize_target(target)
    return ResolvedMount(source=real_source, target=normalized_target, read_only=read_only)


def resolve_checkpoint_dir(path: str, policy: HostPolicy) -> Path:
    """The checkpoint directory must lie in a checkpoint root; it is created when missing."""
    if not path.startswith("/"):
        raise PolicyError(f"checkpoint directory {path!r} is not an absolute path")
    real_path = Path(os.path.realpath(path))
    # Strictly below a root: the root itself holds every job's checkpoints.
    if not any(Path(os.path.realpath(root)) in real_path.parents for root in policy.checkpoint_roots):
        raise PolicyError(f"checkpoint directory {path!r} is not inside a checkpoint root of this node")
    real_path.mkdir(parents=True, exist_ok=True)
    return real_path


def _normalize_target(target: str) -> str:
    """The target as the engine resolves it: empty and ``.`` components dropped. Built from
    the components by hand, since PurePosixPath keeps a leading ``//`` (POSIX lets it mean
    something else) while the engine reads ``//etc`` as ``/etc``: the check must see that."""
    if not target.startswith("/") or "\\" in target or "\x00" in target:
        raise PolicyError(f"mount target {target!r} is not a clean absolute path")
    parts = [part for part in target.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PolicyError(f"mount target {target!r} contains '..'")
    normalized = "/" + "/".join(parts)
    for forbidden in FORBIDDEN_TARGETS:
        if normalized == forbidden or (forbidden != "/" and normalized.startswith(forbidden + "/")):
            raise PolicyError(f"mount target {target!r} covers a system directory")
    return normalized


def _containing_root(path: Path, roots: tuple[VolumeRoot, ...]) -> VolumeRoot | None:
    """The most specific root that contains ``path`` (a rw root may sit inside a ro one)."""
    containing = [root for root in roots if _is_within(path, Path(os.path.realpath(root.path)))]
    return max(containing, key=lambda root: len(Path(os.path.realpath(root.path)).parts), default=None)


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents

"""Checkpoint garbage collection: every job keeps its newest checkpoints and its best one, and
never one an attempt still needs.

Two phases, so that a crash anywhere leaves nothing referenced that is gone:

1. In one transaction per job, with the job row locked (the scheduler moves the row, and
   record_checkpoint locks it, before either picks or adds a checkpoint), find what the
   retention policy does not keep and no live attempt refers to, and mark it `deleting`.
   From then on no attempt can be given it.
2. Delete the files of every `deleting` checkpoint (idempotent: a file already gone is fine),
   and only then mark the row `deleted`. A run that dies between the two leaves `deleting`
   rows, which the next run finishes.

The worker deletes the files itself: the checkpoint store is shared storage, mounted at
CHECKPOINT_ROOT on the GPU hosts and on the workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from portal.jobs.choices import ATTEMPT_ENDED_STATES, TERMINAL_STATES
from portal.jobs.models import Checkpoint, Job, JobAttempt
from portal.jobs.services import resume_point

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionPolicy:
    keep_latest: int
    keep_best: int


class Scored(Protocol):
    pk: Any
    metric: float | None
    metric_mode: str


def retention_policy(job: Job) -> RetentionPolicy:
    """The job's spec (checkpoint.keep_latest, checkpoint.keep_best), else the cluster default.
    At least one is always kept: the next attempt resumes from it."""
    spec = job.spec.get("checkpoint") or {}
    return RetentionPolicy(
        keep_latest=max(1, int(spec.get("keep_latest", settings.CHECKPOINT_KEEP_LATEST))),
        keep_best=max(0, int(spec.get("keep_best", settings.CHECKPOINT_KEEP_BEST))),
    )


def checkpoints_to_keep(
    newest_first: Sequence[Scored], policy: RetentionPolicy, referenced: Iterable[Any]
) -> set[Any]:
    """The pks the policy keeps: the newest `keep_latest`, the best `keep_best` by metric (in the
    direction the newest scored checkpoint gives; the newer wins a tie), and every referenced one."""
    keep = {c.pk for c in newest_first[: policy.keep_latest]}
    scored = [c for c in newest_first if c.metric is not None]
    if scored and policy.keep_best:
        sign = -1.0 if scored[0].metric_mode == "max" else 1.0
        ranked = sorted(enumerate(scored), key=lambda item: (sign * item[1].metric, item[0]))  # type: ignore[operator]
        keep |= {c.pk for _, c in ranked[: policy.keep_best]}
    return keep | set(referenced)


def referenced_checkpoints(job: Job) -> set[int]:
    """Checkpoints an attempt needs: the one each live attempt (starting, running, suspended,
    checkpointing for a preemption or migration) started from, and, for a job that has not ended,
    the one its next attempt would resume from."""
    referenced = set(
        JobAttempt.objects.filter(job=job, resume_from__isnull=False)
        .exclude(state__in=ATTEMPT_ENDED_STATES)
        .values_list("resume_from_id", flat=True)
    )
    if job.state not in TERMINAL_STATES and (next_resume := resume_point(job)) is not None:
        referenced.add(next_resume.pk)
    return referenced


def condemn_checkpoints(job_id: int) -> list[int]:
    """Phase 1 for one job: marks what the policy lets go `deleting`, in the transaction that
    checks the references, with the job row locked. Returns the pks marked."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        checkpoints = Checkpoint.objects.filter(job=job).committed().newest_first()
        committed = list(checkpoints.only("id", "metric", "metric_mode"))
        keep = checkpoints_to_keep(committed, retention_policy(job), referenced_checkpoints(job))
        condemned = [c.pk for c in committed if c.pk not in keep]
        Checkpoint.objects.filter(pk__in=condemned).update(state=Checkpoint.State.DELETING)
    return condemned


def delete_checkpoint_files(checkpoint: Checkpoint) -> None:
    """Removes the checkpoint's files, its emptied directories and its manifest; never a file
    that a committed checkpoint of the job also lists (jobs that save in place reuse a name), nor
    anything outside the job's directory. Idempotent. Raises OSError when the store is not
    reachable, so the row stays `deleting` for the next run."""
    from portal.agentgw.desired import checkpoint_dir

    root = Path(checkpoint_dir(checkpoint.job))
    if not Path(settings.CHECKPOINT_ROOT).is_dir():
        raise FileNotFoundError(f"the checkpoint store {settings.CHECKPOINT_ROOT} is not mounted here")
    kept: set[str] = set()
    for other in Checkpoint.objects.filter(job_id=checkpoint.job_id).committed():
        kept |= {item["path"] for item in other.manifest} | {other.manifest_path, _relative(root, other.path)}
    relative = _relative(root, checkpoint.path)
    if checkpoint.manifest:
        for item in checkpoint.manifest:
            if item["path"] not in kept:
                _unlink_inside(root, item["path"])
        _remove_empty_directories(root, relative)
    elif relative not in kept and (target := _inside(root, relative)) is not None:
        # Committed before manifests existed: its path is all there is to go by.
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    if checkpoint.manifest_path:
        _unlink_inside(root, checkpoint.manifest_path)


def delete_condemned_checkpoints() -> dict[str, int]:
    """Phase 2: the files of every `deleting` checkpoint, then its row marked `deleted`."""
    counts = {"deleted": 0, "failed": 0}
    deleting = Checkpoint.objects.filter(state=Checkpoint.State.DELETING)
    for checkpoint in deleting.select_related("job__tenant"):
        try:
            delete_checkpoint_files(checkpoint)
        except OSError as error:
            log.warning("checkpoint %s of job %s not deleted: %s", checkpoint.pk, checkpoint.job_id, error)
            counts["failed"] += 1
            continue
        counts["deleted"] += deleting.filter(pk=checkpoint.pk).update(
            state=Checkpoint.State.DELETED, deleted_at=timezone.now()
        )
    return counts


def collect_checkpoints() -> dict[str, int]:
    """One garbage collection run over every job with more than one committed checkpoint."""
    jobs = (
        Checkpoint.objects.committed()
        .values("job_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("job_id", flat=True)
    )
    condemned = sum(len(condemn_checkpoints(job_id)) for job_id in jobs)
    return {"condemned": condemned, **delete_condemned_checkpoints()}


def _relative(root: Path, path: str) -> str:
    """A checkpoint's path (absolute, as the agent reported it) relative to the job's directory."""
    candidate = Path(path)
    return candidate.relative_to(root).as_posix() if candidate.is_relative_to(root) else candidate.name


def _inside(root: Path, relative: str) -> Path | None:
    """root/relative if it stays inside root once its directories' links are resolved."""
    target = root / relative
    real_root = Path(os.path.realpath(root))
    parent = Path(os.path.realpath(target.parent))
    if relative in ("", ".") or (parent != real_root and real_root not in parent.parents):
        return None
    return parent / target.name


def _unlink_inside(root: Path, relative: str) -> None:
    target = _inside(root, relative)
    if target is None:
        log.warning("not deleting %r: outside the checkpoint directory %s", relative, root)
        return
    if target.is_dir() and not target.is_symlink():
        _remove_empty_directories(root, relative)
        return
    target.unlink(missing_ok=True)


def _remove_empty_directories(root: Path, relative: str) -> None:
    """The checkpoint's directory and its subdirectories, bottom-up, where they are empty."""
    target = _inside(root, relative)
    if target is None or not target.is_dir() or target.is_symlink():
        return
    for directory, _, _ in sorted(os.walk(target), key=lambda entry: len(entry[0]), reverse=True):
        with contextlib.suppress(OSError):  # not empty: a file another checkpoint keeps
            os.rmdir(directory)

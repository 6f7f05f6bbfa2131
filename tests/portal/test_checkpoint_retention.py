"""The retention rule of checkpoint garbage collection (portal.jobs.checkpoints), as a table.
The GC itself, with real agents, files and the Celery task: tests/reliability/test_checkpoints.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from portal.jobs.checkpoints import RetentionPolicy, checkpoints_to_keep, retention_policy
from portal.jobs.models import Job


@dataclass
class Saved:
    pk: int
    metric: float | None = None
    metric_mode: str = "min"


def newest_first(*metrics: float | None, mode: str = "min") -> list[Saved]:
    """Checkpoints 1..n (n the newest), given oldest first; returned newest first."""
    return [Saved(pk, metric, mode) for pk, metric in reversed(list(enumerate(metrics, start=1)))]


@pytest.mark.parametrize(
    ("checkpoints", "policy", "referenced", "kept"),
    [
        (newest_first(None, None, None, None), RetentionPolicy(2, 1), [], {3, 4}),
        (newest_first(0.9, 0.1, 0.5, 0.6, 0.7), RetentionPolicy(2, 1), [], {2, 4, 5}),
        (newest_first(0.9, 0.1, 0.5, 0.6, 0.7, mode="max"), RetentionPolicy(2, 1), [], {1, 4, 5}),
        (newest_first(0.9, 0.1, 0.5, 0.6, 0.7), RetentionPolicy(2, 0), [], {4, 5}),
        (newest_first(0.9, 0.1, 0.5, 0.6, 0.7), RetentionPolicy(1, 2), [], {2, 3, 5}),
        (newest_first(0.3, 0.3, 0.9, 0.9), RetentionPolicy(1, 1), [], {2, 4}),  # a tie: the newer
        (newest_first(0.9, 0.1, 0.5, 0.6, 0.7, 0.8, 0.95), RetentionPolicy(2, 1), [4, 7], {2, 4, 6, 7}),
    ],
    ids=["no metric", "min", "max", "no best", "more best", "tie", "referenced"],
)
def test_what_the_policy_keeps(checkpoints, policy, referenced, kept) -> None:  # type: ignore[no-untyped-def]
    assert checkpoints_to_keep(checkpoints, policy, referenced) == kept


def test_the_job_spec_overrides_the_cluster_default_and_one_is_always_kept(settings) -> None:  # type: ignore[no-untyped-def]
    settings.CHECKPOINT_KEEP_LATEST, settings.CHECKPOINT_KEEP_BEST = 3, 2
    assert retention_policy(Job(spec={})) == RetentionPolicy(3, 2)
    assert retention_policy(Job(spec={"checkpoint": {"keep_latest": 5, "keep_best": 0}})) == RetentionPolicy(
        5, 0
    )
    settings.CHECKPOINT_KEEP_LATEST = 0
    assert retention_policy(Job(spec={})).keep_latest == 1

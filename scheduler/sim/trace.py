"""Trace parsers: real GPU-cluster job logs into one `TraceJob` shape.

Formats (column layouts are those of the published files, unchanged):
- itp:    job_id,submission_time,duration,num_gpu  (Microsoft ITP, ElasticFlow traces)
- philly: timestamp,duration,num_gpus,gpu_time,cluster  (Philly job log with VCs; the
          `cluster` column is the virtual cluster; timestamps become seconds since the first)
- openb:  name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
          deletion_time,scheduled_time  (Alibaba openb pod list). A pod's duration is
          deletion - scheduled; pods never scheduled or without GPUs are skipped (counted),
          and a fractional GPU (gpu_milli < 1000) is rounded up to one whole GPU.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from scheduler.sim.inputs import read_csv

FORMATS = ("itp", "philly", "openb")
DEFAULT_VC = "default"


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float
    duration: float  # true run time: used only to end the job, never shown to the scheduler
    gpus: int
    vc: str = DEFAULT_VC
    user: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    skipped: int = 0  # rows that are not GPU jobs or have no usable times


# The columns each format's parser reads; a file without them is not a trace of that format.
COLUMNS = {
    "itp": ("job_id", "submission_time", "duration", "num_gpu"),
    "philly": ("timestamp", "duration", "num_gpus", "cluster"),
    "openb": (
        "name",
        "cpu_milli",
        "memory_mib",
        "num_gpu",
        "creation_time",
        "deletion_time",
        "scheduled_time",
    ),
}


def load_trace(path: str | Path, fmt: str) -> Trace:
    """Raises `InputFileError` for a file that is not a trace of `fmt` or has a bad value."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")
    with read_csv(path, COLUMNS[fmt], f"a trace of format {fmt}") as rows:
        if fmt == "itp":
            return _collect(_itp(rows))
        if fmt == "philly":
            return _collect(_philly(rows))
        return _collect(_openb(rows))


def _collect(parsed: Iterator[TraceJob | None]) -> Trace:
    jobs: list[TraceJob] = []
    skipped = 0
    for job in parsed:
        if job is None:
            skipped += 1
        else:
            jobs.append(job)
    jobs.sort(key=lambda j: (j.submit, j.id))
    return Trace(tuple(jobs), skipped)


def _itp(rows: csv.DictReader[str]) -> Iterator[TraceJob | None]:
    for row in rows:
        gpus = int(float(row["num_gpu"]))
        duration = float(row["duration"])
        if gpus <= 0 or duration < 0:
            yield None
            continue
        yield TraceJob(row["job_id"], float(row["submission_time"]), duration, gpus)


def _philly(rows: csv.DictReader[str]) -> Iterator[TraceJob | None]:
    origin: datetime | None = None
    for n, row in enumerate(rows):
        when = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S")
        if origin is None:
            origin = when
        gpus = int(float(row["num_gpus"]))
        duration = float(row["duration"])
        if gpus <= 0 or duration < 0:
            yield None
            continue
        yield TraceJob(f"p{n}", (when - origin).total_seconds(), duration, gpus, vc=row["cluster"].strip())


def _openb(rows: csv.DictReader[str]) -> Iterator[TraceJob | None]:
    for row in rows:
        gpus = int(float(row["num_gpu"] or 0))
        scheduled = row.get("scheduled_time", "").strip()
        deletion = row.get("deletion_time", "").strip()
        if gpus <= 0 or not scheduled or not deletion:
            yield None
            continue
        duration = float(deletion) - float(scheduled)
        if duration < 0:
            yield None
            continue
        yield TraceJob(
            row["name"],
            float(row["creation_time"]),
            duration,
            gpus,
            vc=DEFAULT_VC,
            cpu_milli=int(float(row["cpu_milli"] or 0)),
            memory_mib=int(float(row["memory_mib"] or 0)),
        )

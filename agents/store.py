"""The agent's per-attempt records on disk: what it was asked to run and what it last reported.

One JSON file per attempt in ``<state-dir>/attempts/``, replaced atomically. The record
is what keeps the status ``generation`` monotone across agent restarts, remembers why
an attempt is being stopped (stop vs. checkpoint) and keeps the outcome of attempts the
runtime cannot show any more (start failures, vanished containers) until the portal no
longer desires them.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from agents.protocol import AttemptState, DesiredAttempt, ExitReason

DEFAULT_GRACE_S = 30.0


class AttemptRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt_id: str
    job_id: str
    spec: DesiredAttempt | None = None  # None when found by label without a record (state dir lost)
    state: AttemptState
    generation: int = 0
    exit_code: int | None = None
    reason: ExitReason | None = None
    message: str = ""
    stop_reason: ExitReason | None = None  # set when the agent itself stops the attempt

    @property
    def grace_s(self) -> float:
        return self.spec.grace_period_s if self.spec is not None else DEFAULT_GRACE_S

    @property
    def gpu_uuids(self) -> list[str]:
        return [gpu.uuid for gpu in self.spec.gpus] if self.spec is not None else []


class AttemptStore:
    def __init__(self, state_dir: Path) -> None:
        self.directory = Path(state_dir) / "attempts"
        self.directory.mkdir(parents=True, exist_ok=True)

    def get(self, attempt_id: str) -> AttemptRecord | None:
        try:
            return AttemptRecord.model_validate_json((self.directory / f"{attempt_id}.json").read_bytes())
        except FileNotFoundError:
            return None

    def all(self) -> list[AttemptRecord]:
        records = []
        for path in sorted(self.directory.glob("*.json")):
            records.append(AttemptRecord.model_validate_json(path.read_bytes()))
        return records

    def put(self, record: AttemptRecord) -> None:
        path = self.directory / f"{record.attempt_id}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(record.model_dump_json())
        os.replace(temporary, path)

    def delete(self, attempt_id: str) -> None:
        (self.directory / f"{attempt_id}.json").unlink(missing_ok=True)

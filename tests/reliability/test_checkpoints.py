"""Checkpoint manifests and garbage collection (reliability-security.md F16, F17) with real agent
processes, the fault stack's web, worker and beat, and the test PostgreSQL.

F16: the agent dies (SIGKILL) while it builds the manifest of a preemption's checkpoint; the
checkpoint is never committed, the preemption is reported as failed in the job's events, and the
next attempt resumes from the last committed checkpoint, although the job's marker names the
newer one.

F17: garbage collection (the Celery task, on the stack's worker) runs while the job's live
attempt resumed from checkpoint N-3 and a preemption holds checkpoint N: those two, the latest two
and the best one survive; every other checkpoint loses its row and its files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from agents.checkpoint import (
    MANIFEST_DIR,
    MANIFEST_PAUSE_ENV,
    MANIFEST_PAUSE_FLAG,
    MARKER_NAME,
    verify_resume,
)
from portal.agentgw.desired import resume_from
from portal.jobs.models import Checkpoint, Job, JobAttempt, LogLine
from tests.conftest import wait_for
from tests.reliability.conftest import SLEEP, job_state, wait_ready

pytestmark = pytest.mark.django_db(transaction=True)

GC_TASK = "portal.jobs.tasks.collect_checkpoints"

# Resumes from the step its marker names. Saves checkpoint n+1 (a directory of two files, with a
# metric) when the test creates TRIGGERS/save-<n+1>, exits 3 on TRIGGERS/fail-<n> (once), and on
# the checkpoint signal saves, then exits at once, or, while TRIGGERS/hold exists, ignores the
# agent's SIGTERM until TRIGGERS/release appears (so its attempt stays live while the preemption
# holds the checkpoint).
JOB = """
import json, os, signal, sys, time
directory, triggers = os.environ["GPUPORTAL_CHECKPOINT_DIR"], {triggers!r}
metrics = {metrics!r}
step = 0
if os.environ["GPUPORTAL_RESUME"] == "1":
    with open(os.path.join(directory, "checkpoint.json")) as f:
        step = json.load(f)["step"]
print(f"from {{step}}", flush=True)

def save(n):
    os.makedirs(os.path.join(directory, f"step-{{n}}"), exist_ok=True)
    with open(os.path.join(directory, f"step-{{n}}", "weights.bin"), "wb") as f:
        f.write(os.urandom({size}))
    with open(os.path.join(directory, f"step-{{n}}", "state.json"), "w") as f:
        json.dump({{"step": n}}, f)
    with open(os.path.join(directory, ".marker.tmp"), "w") as f:
        json.dump({{"step": n, "path": f"step-{{n}}", "metric": metrics.get(str(n))}}, f)
    os.replace(os.path.join(directory, ".marker.tmp"), os.path.join(directory, "checkpoint.json"))
    print(f"saved {{n}}", flush=True)

def on_term(*_):
    if not os.path.exists(os.path.join(triggers, "hold")):
        os._exit(143)

asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
signal.signal(signal.SIGTERM, on_term)
while True:
    if asked:
        step += 1
        save(step)
        hold, release = os.path.join(triggers, "hold"), os.path.join(triggers, "release")
        while os.path.exists(hold) and not os.path.exists(release):
            time.sleep(0.05)
        sys.exit(0)
    if os.path.exists(os.path.join(triggers, f"save-{{step + 1}}")):
        step += 1
        save(step)
    if os.path.exists(os.path.join(triggers, f"fail-{{step}}")):
        os.unlink(os.path.join(triggers, f"fail-{{step}}"))
        sys.exit(3)
    time.sleep(0.05)
"""


def job_script(triggers: Path, metrics: dict[int, float] | None = None, size: int = 4096) -> str:
    return JOB.format(
        triggers=str(triggers), metrics={str(k): v for k, v in (metrics or {}).items()}, size=size
    )


def job_dir(portal: Any, job_id: int) -> Path:
    job = Job.objects.select_related("tenant").get(pk=job_id)
    return portal.run_dir / "checkpoints" / job.tenant.name / str(job_id)


def committed_steps(job_id: int) -> list[int]:
    return sorted(Checkpoint.objects.filter(job_id=job_id, state="committed").values_list("step", flat=True))


def first_line(job_id: int, number: int) -> str:
    lines = LogLine.objects.filter(attempt__job_id=job_id, attempt__number=number, text__startswith="from ")
    return wait_for(
        lambda: lines.values_list("text", flat=True).first(), 60, f"attempt {number}'s first line"
    )


def save(triggers: Path, job_id: int, step: int) -> None:
    """Has the job save checkpoint `step` and waits until the portal committed it."""
    (triggers / f"save-{step}").touch()
    wait_for(lambda: step in committed_steps(job_id), 30, f"checkpoint {step} to be committed")


def preempt(api: Any) -> int:
    """A production job that needs the whole node: the scheduler preempts the dev job on it."""
    return api("vision-admin").submit(
        "urgent", SLEEP.format(seconds=1), flavor="l-A100", priority="production"
    )


def run_gc(portal: Any) -> None:
    offset = portal.log_size("worker")
    portal.celery().send_task(GC_TASK)
    wait_for(lambda: portal.task_succeeded(GC_TASK, offset), 60, "the garbage collection task to finish")


def test_an_agent_killed_mid_manifest_leaves_the_checkpoint_uncommitted_and_the_job_resumes_from_the_last_one(
    api, agents, portal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """F16 with a preemption: the kill lands between the job's marker and the agent's manifest."""
    triggers = tmp_path / "triggers"
    triggers.mkdir()
    agent = agents("a100-node-1")
    wait_ready("a100-node-1")
    job = api("alice").submit(
        "killed-mid-manifest",
        job_script(triggers, size=2_000_000),
        flavor="l-A100",
        priority="dev",
        checkpoint={"enabled": True, "grace_seconds": 30},
    )
    wait_for(lambda: job_state(job) == "running", 60, "the job to run")
    assert first_line(job, 1) == "from 0"
    save(triggers, job, 1)
    directory = job_dir(portal, job)
    committed = Checkpoint.objects.get(job_id=job, step=1)
    assert [f["path"] for f in committed.manifest] == ["step-1/state.json", "step-1/weights.bin"]

    # The agent restarts with the pause hook: it stops in the middle of the next manifest.
    agent.stop()
    monkeypatch.setenv(MANIFEST_PAUSE_ENV, "60")
    agent.start()
    wait_for(lambda: agent.proc.poll() is None and job_state(job) == "running", 30, "the agent to be back")
    time.sleep(2)  # reconnected and converged (a lost hello would show as a stopped job below)
    urgent = preempt(api)
    wait_for(lambda: (directory / MANIFEST_PAUSE_FLAG).exists(), 60, "the agent to be building the manifest")
    marker = json.loads((directory / MARKER_NAME).read_text())
    assert marker["step"] == 2  # the job saved step 2 and named it in its marker
    agent.kill()
    monkeypatch.delenv(MANIFEST_PAUSE_ENV)

    # Nothing of step 2 reached the portal, or the manifest directory.
    assert committed_steps(job) == [1]
    assert [p.name.split("-")[0] for p in (directory / MANIFEST_DIR).glob("*.json")] == ["1"]

    (directory / MANIFEST_PAUSE_FLAG).unlink()
    agent.start()
    wait_for(lambda: job_state(urgent) == "succeeded", 90, "the production job to run once the GPUs are free")
    wait_for(lambda: JobAttempt.objects.filter(job_id=job, number=2).exists(), 60, "attempt 2")
    second = JobAttempt.objects.get(job_id=job, number=2)
    assert second.resume and second.resume_from_id == committed.pk
    # The agent checked step 1 against its manifest and pointed the marker back at it.
    assert first_line(job, 2) == "from 1"
    assert json.loads((directory / MARKER_NAME).read_text())["step"] == 1
    wait_for(lambda: job_state(job) == "running", 30, "the job to run again")

    first = JobAttempt.objects.get(job_id=job, number=1)
    assert first.state == "stopped" and first.replica_states["0"]["reason"] == "stopped"
    failed = Job.objects.get(pk=job).events.filter(data__checkpoint="failed").get()
    cause = Job.objects.get(pk=job).events.get(to_state="checkpointing").data["preemption"]
    assert failed.reason == (
        f"checkpoint failed ({cause}): attempt 1 stopped without a committed checkpoint "
        "(replica 0: stopped); the next attempt resumes from step 1"
    )
    assert failed.data["resume_from_step"] == 1 and failed.data["preemption"] == cause
    assert committed_steps(job) == [1]  # the partial checkpoint is never referenced
    assert api("alice").post(f"/api/v1/jobs/{job}/cancel/").status_code == 200


def test_gc_keeps_what_live_attempts_and_the_policy_need_and_deletes_the_rest(
    api, agents, portal, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """F17: keep latest 2 + best 1 (the cluster default); N = 7, best = 2, attempt 2 runs from 4."""
    triggers = tmp_path / "triggers"
    triggers.mkdir()
    agents("a100-node-1")
    wait_ready("a100-node-1")
    metrics = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.6, 5: 0.7, 6: 0.8, 7: 0.95}  # lower is better
    job = api("alice").submit(
        "collected",
        job_script(triggers, metrics),
        flavor="l-A100",
        priority="dev",
        checkpoint={"enabled": True, "grace_seconds": 120},
        retries={"limit": 1, "backoff_seconds": 0},
    )
    wait_for(lambda: job_state(job) == "running", 60, "the job to run")
    directory = job_dir(portal, job)
    for step in (1, 2, 3, 4):
        save(triggers, job, step)

    # Attempt 1 fails; attempt 2 resumes from checkpoint 4 (N-3) and saves 5 and 6.
    (triggers / "fail-4").touch()
    wait_for(lambda: JobAttempt.objects.filter(job_id=job, number=2).exists(), 60, "attempt 2")
    by_step = {c.step: c for c in Checkpoint.objects.filter(job_id=job)}
    assert JobAttempt.objects.get(job_id=job, number=2).resume_from_id == by_step[4].pk
    assert first_line(job, 2) == "from 4"
    for step in (5, 6):
        save(triggers, job, step)

    # A preemption: the job saves 7 (N) and holds on, so attempt 2 is still live during the GC.
    (triggers / "hold").touch()
    urgent = preempt(api)
    wait_for(lambda: 7 in committed_steps(job), 60, "the preemption's checkpoint 7 to be committed")
    assert job_state(job) == "checkpointing"
    run_gc(portal)

    states = dict(Checkpoint.objects.filter(job_id=job).values_list("step", "state"))
    assert states == {
        1: "deleted",
        2: "committed",  # the best
        3: "deleted",
        4: "committed",  # attempt 2 resumed from it and still runs
        5: "deleted",
        6: "committed",  # latest 2
        7: "committed",  # latest 2, and what the next attempt resumes from
    }
    for step, state in states.items():
        checkpoint = Checkpoint.objects.get(job_id=job, step=step)
        if state == "deleted":
            assert checkpoint.deleted_at is not None
            assert not (directory / f"step-{step}").exists()
            assert not (directory / checkpoint.manifest_path).exists()
        else:  # whole: a resume from it would pass the agent's check
            assert verify_resume(directory, resume_from(checkpoint.job, checkpoint)).step == step
    assert job_state(job) == "checkpointing"  # the GC ran while the preemption held checkpoint 7

    # Attempt 2 ends; the production job runs, then attempt 3 resumes from 7.
    (triggers / "release").touch()
    wait_for(lambda: job_state(urgent) == "succeeded", 90, "the production job to run")
    (triggers / "hold").unlink()
    assert first_line(job, 3) == "from 7"
    run_gc(portal)
    # Checkpoint 4 was needed only by attempt 2, which has ended.
    assert committed_steps(job) == [2, 6, 7]
    assert not (directory / "step-4").exists()
    assert sorted(p.name for p in directory.iterdir() if p.name.startswith("step-")) == [
        "step-2",
        "step-6",
        "step-7",
    ]
    assert api("alice").post(f"/api/v1/jobs/{job}/cancel/").status_code == 200


def test_the_reference_check_waits_for_an_attempt_being_given_a_checkpoint(api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    """F17's same-transaction rule: while another transaction holds the job row (as the scheduler
    does while it creates an attempt and picks its checkpoint), the GC waits for it and then sees
    the new reference, instead of condemning the checkpoint the attempt was just given."""
    import threading

    from django.db import connection, transaction
    from django.utils import timezone

    from portal.jobs.checkpoints import condemn_checkpoints

    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    first = JobAttempt.objects.create(job=job, number=1, state="stopped")
    made = [
        Checkpoint.objects.create(
            job=job, attempt=first, path=f"step-{step}", size_bytes=1, step=step, written_at=timezone.now()
        )
        for step in (1, 2, 3, 4, 5)
    ]
    locked, condemned, waited = threading.Event(), [], []

    def give_the_oldest_to_a_new_attempt() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=job.pk)
                locked.set()
                time.sleep(0.8)  # the GC starts meanwhile
                JobAttempt.objects.create(job=job, number=2, resume=True, resume_from=made[0])
        finally:
            connection.close()

    def collect() -> None:
        try:
            locked.wait(10)
            started = time.monotonic()
            condemned.extend(condemn_checkpoints(job.pk))
            waited.append(time.monotonic() - started)
        finally:
            connection.close()

    threads = [threading.Thread(target=give_the_oldest_to_a_new_attempt), threading.Thread(target=collect)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert waited and waited[0] > 0.3  # it waited for the job row
    assert sorted(Checkpoint.objects.get(pk=pk).step for pk in condemned) == [2, 3]
    assert committed_steps(job.pk) == [1, 4, 5]
    JobAttempt.objects.filter(job=job, number=2).update(state="stopped")


def test_file_deletion_waits_for_the_store_is_idempotent_and_spares_shared_and_outside_files(
    api_for, small_job, settings, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Phase 2 of the GC: a checkpoint leaves `deleting` only once its files are gone; a store the
    worker cannot see leaves it `deleting` for the next run; a file a kept checkpoint also lists
    (a job that saves in place) and a forged path out of the job's directory are never deleted."""
    from django.utils import timezone

    from portal.agentgw.desired import checkpoint_dir
    from portal.jobs.checkpoints import delete_condemned_checkpoints

    settings.CHECKPOINT_ROOT = str(tmp_path / "store")
    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1, state="stopped")
    root = Path(checkpoint_dir(job))
    files = {
        "step-1/weights.bin": b"old",
        "state": b"in place",
        ".manifests/1.json": b"{}",
        ".manifests/2.json": b"{}",
    }
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the job's")

    def entry(path: str) -> dict[str, Any]:
        return {"path": path, "size": 1, "sha256": "0" * 64}

    def make(step: int, state: str, manifest: list[dict[str, Any]]) -> Checkpoint:
        return Checkpoint.objects.create(
            job=job,
            attempt=attempt,
            path=str(root / f"step-{step}"),
            size_bytes=1,
            step=step,
            written_at=timezone.now(),
            manifest_path=f".manifests/{step}.json",
            manifest_sha256="0" * 64,
            manifest=manifest,
            state=state,
        )

    old = make(1, "deleting", [entry("step-1/weights.bin"), entry("state"), entry("../../../outside.txt")])
    make(2, "committed", [entry("state")])

    (tmp_path / "store").rename(tmp_path / "offline")  # the worker does not see the store
    assert delete_condemned_checkpoints() == {"deleted": 0, "failed": 1}
    old.refresh_from_db()
    assert old.state == "deleting" and old.deleted_at is None
    (tmp_path / "offline").rename(tmp_path / "store")

    assert delete_condemned_checkpoints() == {"deleted": 1, "failed": 0}
    old.refresh_from_db()
    assert old.state == "deleted" and old.deleted_at is not None
    assert not (root / "step-1").exists() and not (root / ".manifests/1.json").exists()
    assert (root / "state").read_bytes() == b"in place"  # checkpoint 2 lists it too
    assert (root / ".manifests/2.json").exists()
    assert outside.read_text() == "not the job's"
    assert delete_condemned_checkpoints() == {"deleted": 0, "failed": 0}  # nothing left to do

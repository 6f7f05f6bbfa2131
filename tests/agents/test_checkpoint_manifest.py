"""Checkpoint manifests: what the agent publishes before it reports a checkpoint, and what it
checks before an attempt resumes from one (docs/agent.md, Checkpoints)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from agent_builders import make_attempt
from fake_portal import FakePortal, wait_for
from test_agent_connection import gpu, make_agent, running, state_dir  # noqa: F401 (fixture)

from agents.checkpoint import (
    MANIFEST_DIR,
    MARKER_NAME,
    BadMarkerError,
    FoundCheckpoint,
    ManifestError,
    build_manifest,
    point_marker_at,
    publish_manifest,
    read_marker,
    verify_resume,
    write_marker,
)
from agents.protocol import (
    AttemptState,
    CheckpointDone,
    CheckpointRequest,
    ExitReason,
    RequestReject,
    ResumeFrom,
)

PY = sys.executable


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def found(directory: Path, relative: str, step: int = 7, metric: float | None = None) -> FoundCheckpoint:
    return FoundCheckpoint(
        path=directory / relative,
        size_bytes=0,
        step=step,
        time=datetime(2026, 11, 22, 1, 0, tzinfo=UTC),
        metric=metric,
    )


def make_checkpoint(directory: Path, name: str = "step-7") -> dict[str, bytes]:
    files = {
        f"{name}/model.bin": os.urandom(3000),
        f"{name}/sub/optim.json": b'{"lr": 0.1}',
        f"{name}/empty": b"",
    }
    for relative, data in files.items():
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        (directory / relative).write_bytes(data)
    return files


def published(directory: Path, name: str = "step-7", step: int = 7) -> ResumeFrom:
    result = publish_manifest(directory, build_manifest(directory, found(directory, name, step)))
    return ResumeFrom(step=step, path=name, manifest_path=result.relative_path, manifest_sha256=result.sha256)


def test_the_manifest_lists_every_file_with_its_size_and_sha256(tmp_path: Path) -> None:
    files = make_checkpoint(tmp_path)
    manifest = build_manifest(tmp_path, found(tmp_path, "step-7", metric=0.25))
    assert {f.path: (f.size, f.sha256) for f in manifest.files} == {
        path: (len(data), sha(data)) for path, data in files.items()
    }
    assert (manifest.step, manifest.path, manifest.metric) == (7, "step-7", 0.25)
    assert manifest.size_bytes == sum(len(data) for data in files.values())
    # A single-file checkpoint is its own manifest entry.
    (tmp_path / "single.pt").write_bytes(b"abc")
    single = build_manifest(tmp_path, found(tmp_path, "single.pt"))
    assert [(f.path, f.size, f.sha256) for f in single.files] == [("single.pt", 3, sha(b"abc"))]


def test_the_manifest_is_published_atomically_and_its_digest_is_that_of_its_bytes(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    manifest = build_manifest(tmp_path, found(tmp_path, "step-7"))
    result = publish_manifest(tmp_path, manifest)
    written = (tmp_path / result.relative_path).read_bytes()
    assert result.relative_path.startswith(f"{MANIFEST_DIR}/7-")
    assert sha(written) == result.sha256
    assert json.loads(written)["files"] == [f.model_dump() for f in manifest.files]
    assert [p.name for p in (tmp_path / MANIFEST_DIR).iterdir()] == [Path(result.relative_path).name]


def test_replicas_publishing_the_same_step_never_replace_each_others_manifest(tmp_path: Path) -> None:
    """Replicas on several hosts share the directory and save the same step, each marker with
    its own time: whichever manifest the portal committed must still be there to resume from."""
    make_checkpoint(tmp_path)
    first = publish_manifest(tmp_path, build_manifest(tmp_path, found(tmp_path, "step-7")))
    later = FoundCheckpoint(path=tmp_path / "step-7", size_bytes=0, step=7, time=datetime.now(UTC))
    second = publish_manifest(tmp_path, build_manifest(tmp_path, later))
    assert first.relative_path != second.relative_path
    for result in (first, second):
        resume = ResumeFrom(
            step=7, path="step-7", manifest_path=result.relative_path, manifest_sha256=result.sha256
        )
        assert verify_resume(tmp_path, resume).time in (found(tmp_path, "step-7").time, later.time)
    # The same manifest published twice is one file.
    again = publish_manifest(tmp_path, build_manifest(tmp_path, found(tmp_path, "step-7")))
    assert again.relative_path == first.relative_path
    assert len(list((tmp_path / MANIFEST_DIR).iterdir())) == 2


def test_links_out_of_the_directory_and_special_paths_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "job"
    make_checkpoint(directory)
    secret = tmp_path / "secret"
    secret.write_text("host file")
    # A link inside the directory is hashed under its own path.
    os.symlink(directory / "step-7" / "model.bin", directory / "step-7" / "alias.bin")
    manifest = build_manifest(directory, found(directory, "step-7"))
    paths = {f.path: f.sha256 for f in manifest.files}
    assert paths["step-7/alias.bin"] == paths["step-7/model.bin"]
    # A link out of it refuses the checkpoint.
    os.symlink(secret, directory / "step-7" / "leak")
    with pytest.raises(ManifestError, match="links outside"):
        build_manifest(directory, found(directory, "step-7"))
    os.unlink(directory / "step-7" / "leak")
    os.symlink(tmp_path, directory / "step-7" / "leakdir")
    with pytest.raises(ManifestError):
        build_manifest(directory, found(directory, "step-7"))
    os.unlink(directory / "step-7" / "leakdir")
    # The whole directory, or a path outside it, is not a checkpoint.
    with pytest.raises(ManifestError, match="inside the checkpoint directory"):
        build_manifest(directory, found(directory, "."))
    with pytest.raises(ManifestError, match="inside the checkpoint directory"):
        build_manifest(directory, found(directory, "../secret"))
    os.mkfifo(directory / "step-7" / "pipe")
    with pytest.raises(ManifestError, match="not a regular file"):
        build_manifest(directory, found(directory, "step-7"))


def test_verify_accepts_the_committed_checkpoint_and_points_the_marker_at_it(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    resume = published(tmp_path)
    # A newer marker names a checkpoint whose manifest was never committed.
    (tmp_path / "step-9").write_bytes(b"partial")
    write_marker(tmp_path, 9, "step-9")
    manifest = verify_resume(tmp_path, resume)
    point_marker_at(tmp_path, manifest)
    marker = read_marker(tmp_path)
    assert (marker.step, marker.path) == (7, (tmp_path / "step-7").resolve())
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / "step-7/model.bin").write_bytes(b"y" * 3000), "does not match its sha256"),
        (lambda d: (d / "step-7/model.bin").write_bytes(b"y" * 10), "has 10 bytes; the manifest says 3000"),
        (lambda d: (d / "step-7/sub/optim.json").unlink(), "step-7/sub/optim.json cannot be read"),
        (
            lambda d: next((d / MANIFEST_DIR).iterdir()).write_text('{"forged": true}'),
            "differs from the one the portal committed",
        ),
        (lambda d: next((d / MANIFEST_DIR).iterdir()).unlink(), "cannot be read"),
    ],
    ids=["changed content", "truncated", "missing file", "manifest changed", "manifest missing"],
)
def test_verify_refuses_a_checkpoint_that_does_not_match_with_the_reason(
    tmp_path: Path, damage, reason
) -> None:  # type: ignore[no-untyped-def]
    make_checkpoint(tmp_path)
    resume = published(tmp_path)
    verify_resume(tmp_path, resume)  # whole, it passes
    damage(tmp_path)
    with pytest.raises(ManifestError, match=reason):
        verify_resume(tmp_path, resume)


def test_verify_refuses_a_manifest_path_outside_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "job"
    make_checkpoint(directory)
    resume = published(directory)
    outside = resume.model_copy(update={"manifest_path": "../elsewhere.json"})
    with pytest.raises(ManifestError, match="outside the checkpoint directory"):
        verify_resume(directory, outside)


# ----------------------------------------------------------------------------- the agent


def test_a_manifest_directory_that_is_not_a_real_directory_is_refused(tmp_path: Path) -> None:
    """The job owns the checkpoint directory: a ``.manifests`` link must not make the (root)
    agent write into a host directory, nor a file in its place be written through."""
    directory, outside = tmp_path / "job", tmp_path / "host-dir"
    outside.mkdir()
    make_checkpoint(directory)
    manifest = build_manifest(directory, found(directory, "step-7"))
    os.symlink(outside, directory / MANIFEST_DIR)
    with pytest.raises(ManifestError, match="is not a directory"):
        publish_manifest(directory, manifest)
    assert list(outside.iterdir()) == []
    os.unlink(directory / MANIFEST_DIR)
    (directory / MANIFEST_DIR).write_text("a file")
    with pytest.raises(ManifestError, match="is not a directory"):
        publish_manifest(directory, manifest)
    os.unlink(directory / MANIFEST_DIR)
    # A link planted under the manifest's own name is replaced, not written through.
    (directory / MANIFEST_DIR).mkdir()
    victim = outside / "victim"
    victim.write_text("host file")
    name = publish_manifest(directory, manifest).relative_path
    os.unlink(directory / name)
    os.symlink(victim, directory / name)
    publish_manifest(directory, manifest)
    assert victim.read_text() == "host file"
    assert not (directory / name).is_symlink()


def test_the_marker_is_read_only_as_a_small_regular_file(tmp_path: Path) -> None:
    """A link is not followed (a host file's text would reach the agent's log and the portal),
    and a device is not read (``/dev/zero`` would be read into memory without end)."""
    directory = tmp_path / "job"
    directory.mkdir()
    (directory / "step-1").write_bytes(b"x")
    secret = tmp_path / "shadow"
    secret.write_text('{"step": 1, "path": "SECRET-HASH-VALUE"}')
    os.symlink(secret, directory / MARKER_NAME)
    with pytest.raises(BadMarkerError) as refused:
        read_marker(directory)
    assert "SECRET" not in str(refused.value) and "symbolic link" in str(refused.value)
    os.unlink(directory / MARKER_NAME)
    os.symlink("/dev/zero", directory / MARKER_NAME)
    with pytest.raises(BadMarkerError, match="symbolic link"):
        read_marker(directory)
    os.unlink(directory / MARKER_NAME)
    (directory / MARKER_NAME).write_text(json.dumps({"step": 1, "path": "step-1", "pad": "x" * 70_000}))
    with pytest.raises(BadMarkerError, match="larger than"):
        read_marker(directory)
    write_marker(directory, 1, "step-1")
    assert read_marker(directory).step == 1


SAVE_ON_SIGNAL = """
import json, os, signal, sys, time
directory = os.environ["GPUPORTAL_CHECKPOINT_DIR"]
marker = os.path.join(directory, "checkpoint.json")
resume = os.environ["GPUPORTAL_RESUME"] == "1"
print("marker " + (str(json.load(open(marker))["step"]) if resume else "none"), flush=True)
def save(signum, frame):
    os.makedirs(os.path.join(directory, "step-5"), exist_ok=True)
    for name, size in (("a.bin", 2000), ("b.bin", 10)):
        with open(os.path.join(directory, "step-5", name), "wb") as f:
            f.write(b"z" * size)
    tmp = os.path.join(directory, ".m.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": 5, "path": "step-5", "metric": 0.5, "metric_mode": "max"}, f)
    os.replace(tmp, os.path.join(directory, "checkpoint.json"))
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_the_agent_reports_a_checkpoint_only_with_its_published_manifest(
    state_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt" / "job-1"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        portal.desired = [
            make_attempt("att-1", command=[PY, "-c", SAVE_ON_SIGNAL], checkpoint_dir=str(directory))
        ]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-1").get(1) == "ready")
            assert portal.log_lines("att-1")[0] == "marker none"
            await portal.send(CheckpointRequest(attempt_id="att-1", grace_period_s=20))
            await wait_for(lambda: portal.of_type(CheckpointDone))
            (done,) = portal.of_type(CheckpointDone)
            assert [(f.path, f.size) for f in done.files] == [("step-5/a.bin", 2000), ("step-5/b.bin", 10)]
            assert done.size_bytes == 2010 and (done.metric, done.metric_mode) == (0.5, "max")
            assert done.manifest_path is not None
            assert sha((directory / done.manifest_path).read_bytes()) == done.manifest_sha256
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            assert portal.last_status("att-1").reason == ExitReason.CHECKPOINTED


@pytest.mark.asyncio
async def test_a_resume_starts_from_the_committed_checkpoint_and_refuses_a_damaged_one(
    state_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt" / "job-1"
    directory.mkdir(parents=True)
    (directory / "step-3").write_bytes(b"committed")
    resume = published(directory, "step-3", 3)
    # The newest marker names a checkpoint that was never committed.
    (directory / "step-4").write_bytes(b"partial")
    write_marker(directory, 4, "step-4")
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        good = make_attempt(
            "att-2",
            command=[PY, "-c", SAVE_ON_SIGNAL],
            checkpoint_dir=str(directory),
            resume=True,
            resume_from=resume,
            gpus=[gpu(agent, 0)],
        )
        portal.desired = [good]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-2").get(0) is not None)
            assert portal.log_lines("att-2")[0] == "marker 3"
            assert json.loads((directory / MARKER_NAME).read_text())["path"] == "step-3"

            (directory / "step-3").write_bytes(b"tampered!")  # same size, other content
            damaged = make_attempt(
                "att-3",
                command=[PY, "-c", SAVE_ON_SIGNAL],
                checkpoint_dir=str(directory),
                resume=True,
                resume_from=resume,
                gpus=[gpu(agent, 1)],
            )
            await portal.set_desired([good, damaged])
            await wait_for(lambda: (s := portal.last_status("att-3")) is not None and s.state.is_terminal)
            status = portal.last_status("att-3")
            assert (status.state, status.reason) == (AttemptState.EXITED, ExitReason.START_FAILED)
            assert status.message == (
                "cannot resume from checkpoint step 3: step-3 does not match its sha256 in the manifest"
            )
            assert portal.log_lines("att-3") == {}  # never started


SAVES_ON_ITS_OWN = """
import json, os, sys, time
directory = os.environ["GPUPORTAL_CHECKPOINT_DIR"]
go = sys.argv[1]
for step in (1, 2):
    while not os.path.exists(f"{go}-{step}"):
        time.sleep(0.01)
    with open(os.path.join(directory, f"step-{step}.bin"), "wb") as f:
        f.write(bytes([step]) * 100 * step)
    with open(os.path.join(directory, ".m.tmp"), "w") as f:
        json.dump({"step": step, "path": f"step-{step}.bin", "metric": step / 10}, f)
    os.replace(os.path.join(directory, ".m.tmp"), os.path.join(directory, "checkpoint.json"))
    print(f"saved {step}", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_checkpoints_a_running_job_saves_on_its_own_are_reported_once_each(
    state_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt" / "job-1"
    directory.mkdir(parents=True)
    write_marker(directory, 0, "old")  # there before the attempt: not reported
    (directory / "old").write_bytes(b"old")
    go = tmp_path / "go"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        portal.desired = [
            make_attempt(
                "att-1", command=[PY, "-c", SAVES_ON_ITS_OWN, str(go)], checkpoint_dir=str(directory)
            )
        ]
        async with running(agent):
            await wait_for(
                lambda: (s := portal.last_status("att-1")) is not None and s.state == AttemptState.RUNNING
            )
            for step in (1, 2):
                Path(f"{go}-{step}").touch()
                await wait_for(lambda step=step: len(portal.of_type(CheckpointDone)) == step)
            await asyncio.sleep(0.3)  # a few more monitor rounds: nothing is reported twice
            reports = portal.of_type(CheckpointDone)
            assert [(d.step, d.request_id, d.metric) for d in reports] == [(1, None, 0.1), (2, None, 0.2)]
            assert [[(f.path, f.size) for f in d.files] for d in reports] == [
                [("step-1.bin", 100)],
                [("step-2.bin", 200)],
            ]
            assert portal.last_status("att-1").state == AttemptState.RUNNING  # saving is not stopping


LINKS_OUT = """
import json, os, signal, sys, time
directory = os.environ["GPUPORTAL_CHECKPOINT_DIR"]
def save(signum, frame):
    os.makedirs(os.path.join(directory, "step-1"), exist_ok=True)
    os.symlink("/etc/hostname", os.path.join(directory, "step-1", "weights.bin"))
    with open(os.path.join(directory, ".m.tmp"), "w") as f:
        json.dump({"step": 1, "path": "step-1"}, f)
    os.replace(os.path.join(directory, ".m.tmp"), os.path.join(directory, "checkpoint.json"))
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_a_checkpoint_linking_out_of_its_directory_is_refused_and_the_job_stopped(
    state_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt" / "job-1"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        portal.desired = [make_attempt("att-1", command=[PY, "-c", LINKS_OUT], checkpoint_dir=str(directory))]
        async with running(agent):
            await wait_for(lambda: portal.log_lines("att-1").get(0) == "ready")
            request = CheckpointRequest(attempt_id="att-1", grace_period_s=20)
            await portal.send(request)
            await wait_for(lambda: portal.of_type(RequestReject))
            (reject,) = portal.of_type(RequestReject)
            assert reject.request_id == request.id
            assert reject.reason == "step-1/weights.bin links outside the checkpoint directory"
            assert not portal.of_type(CheckpointDone)
            assert not (directory / MANIFEST_DIR).exists()
            await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
            assert portal.last_status("att-1").reason == ExitReason.STOPPED


FIFO_MARKER = """
import os, signal, time
directory = os.environ["GPUPORTAL_CHECKPOINT_DIR"]
def save(signum, frame):
    os.mkfifo(os.path.join(directory, "checkpoint.json"))
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_a_fifo_marker_neither_blocks_the_agent_nor_keeps_the_job_running(
    state_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Reading a FIFO blocks until someone writes to it: the checkpoint flow would wait for
    ever, and the job would never be stopped and keep its GPUs."""
    directory = tmp_path / "ckpt" / "job-1"
    async with FakePortal() as portal:
        agent = make_agent(portal.url, state_dir)
        portal.desired = [
            make_attempt("att-1", command=[PY, "-c", FIFO_MARKER], checkpoint_dir=str(directory))
        ]
        async with running(agent):
            try:
                await wait_for(lambda: portal.log_lines("att-1").get(0) == "ready")
                await portal.send(CheckpointRequest(attempt_id="att-1", grace_period_s=2))
                await wait_for(lambda: portal.of_type(RequestReject), timeout_s=10)
                (reject,) = portal.of_type(RequestReject)
                assert reject.reason == "checkpoint marker is not a regular file"
                await wait_for(lambda: portal.last_status("att-1").state == AttemptState.EXITED)
                assert portal.last_status("att-1").reason == ExitReason.STOPPED
            finally:
                _unblock_readers(directory / MARKER_NAME)


def _unblock_readers(fifo: Path) -> None:
    """A reader stuck on the FIFO (before the fix) gets its end of file, so the test ends."""
    with contextlib.suppress(OSError):  # no FIFO, or nobody reads it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

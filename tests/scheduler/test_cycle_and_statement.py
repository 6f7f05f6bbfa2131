"""The cycle's contract (deterministic, snapshot untouched, a reason and estimate for every
pending job), the Statement's exact undo, and profile validation."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from sched_builders import Snap, profile

from scheduler.core import PendingJob, ReasonCode, Snapshot, decide, load_profile
from scheduler.core.profile import PROFILES_DIR, Profile
from scheduler.core.state import GpuHold, build_state
from scheduler.core.statement import Statement


def busy_snapshot() -> Snapshot:
    snap = Snap().nodes(6, 8).vc("vision", 16, borrow=16).vc("speech", 16, borrow=8)
    snap.running("r1", [("n0", (0, 1, 2, 3, 4, 5, 6, 7))], vc="vision", attained_gpu_s=50_000)
    snap.running("r2", [("n1", (0, 1))], vc="speech", started_at=10)
    for i in range(30):
        snap.pending(
            f"p{i:02d}",
            gpus_=[1, 2, 4, 8][i % 4],
            replicas=2 if i % 7 == 0 else 1,
            vc=["vision", "speech"][i % 2],
            user=["alice", "bob", "carol"][i % 3],
            submitted_at=100 + i,
            estimated_runtime_s=600 * (i % 5 + 1),
        )
    return snap.build()


@pytest.mark.parametrize("name", ["fifo", "tiresias", "default"])
def test_shipped_profiles_load_and_decide(name: str) -> None:
    plan = decide(busy_snapshot(), load_profile(name), now=1000.0)
    assert plan.starts


@pytest.mark.parametrize("name", ["fifo", "tiresias", "default"])
def test_same_snapshot_same_plan_whatever_the_input_order(name: str) -> None:
    snapshot = busy_snapshot()
    shuffled = list(snapshot.pending)
    random.Random(7).shuffle(shuffled)
    other = Snapshot(snapshot.nodes, snapshot.vcs, snapshot.running, tuple(shuffled))
    prof = load_profile(name)
    assert decide(snapshot, prof, 1000.0) == decide(other, prof, 1000.0)


def test_snapshot_is_not_mutated() -> None:
    snapshot = busy_snapshot()
    before = copy.deepcopy(snapshot)
    decide(snapshot, load_profile("default"), 1000.0)
    assert snapshot == before


def test_every_pending_job_gets_a_reason_and_an_estimate() -> None:
    snapshot = busy_snapshot()
    plan = decide(snapshot, load_profile("fifo"), 1000.0)
    started = {s.job_id for s in plan.starts}
    assert {p.job_id for p in plan.pending} == {j.id for j in snapshot.pending} - started
    for status in plan.pending:
        assert status.reason is not ReasonCode.STARTED and status.message
        assert status.estimated_start is not None and status.estimated_start >= 1000.0


def test_estimates_follow_running_jobs_ends() -> None:
    # One 8-GPU node: a job runs until t=500 (time limit); two 8-GPU jobs queue behind it.
    snap = (
        Snap()
        .node("n0", 8)
        .running("r", [("n0", tuple(range(8)))], time_limit_s=500.0)
        .pending("a", 8, submitted_at=1, estimated_runtime_s=300)
        .pending("b", 8, submitted_at=2, estimated_runtime_s=300)
    )
    plan = decide(snap.build(), profile(queue_sort=["fifo"]), now=100.0)
    estimates = {p.job_id: p.estimated_start for p in plan.pending}
    assert estimates == {"a": 500.0, "b": 800.0}


def test_starts_place_every_replica_on_distinct_gpus() -> None:
    plan = decide(busy_snapshot(), load_profile("default"), 1000.0)
    seen: set[tuple[str, int]] = set()
    for start in plan.starts:
        for replica in start.placement:
            for index in replica.gpu_indices:
                assert (replica.node, index) not in seen
                seen.add((replica.node, index))


def test_statement_discard_restores_the_state_exactly() -> None:
    snapshot = busy_snapshot()
    state, holds = build_state(snapshot)
    before = copy.deepcopy(state)
    statement = Statement(state)
    statement.release(holds["r1"][0])
    statement.reserve(GpuHold(0, "A100", (0, 1, 2), 0, 0, "speech", "bob"))
    statement.reserve(GpuHold(2, "A100", (4, 5), 0, 0, "speech", "bob"))
    assert state.free_total != before.free_total
    statement.discard()
    assert state == before


def test_statement_commit_keeps_the_changes() -> None:
    state, _ = build_state(busy_snapshot())
    free_before = state.free_total["A100"]
    statement = Statement(state)
    statement.reserve(GpuHold(2, "A100", (4, 5), 0, 0, "speech", "bob"))
    statement.commit()
    statement.discard()  # nothing left to undo
    assert state.free_total["A100"] == free_before - 2
    assert state.vc_used("speech", "A100") == 4


@pytest.mark.parametrize(
    ("data", "error"),
    [
        pytest.param(
            {"plugins": {"queue_sort": ["lottery"]}}, "unknown scheduler plugin", id="unknown-plugin"
        ),
        pytest.param({"plugins": {"score": ["fifo"]}}, "cannot run at extension point", id="wrong-point"),
        pytest.param({"plugins": {"bind": []}}, "unknown extension points", id="unknown-point"),
        pytest.param({"cycle": {"grace": 3}}, "unknown cycle settings", id="unknown-setting"),
        pytest.param(
            {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"service": "energy"}}},
            "service must be",
            id="bad-plugin-args",
        ),
    ],
)
def test_profile_validation(data: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Profile.from_dict({"name": "bad", **data})


def test_shipped_profiles_are_valid_json_with_descriptions() -> None:
    names = sorted(p.stem for p in Path(PROFILES_DIR).glob("*.json"))
    assert {"default", "fifo", "tiresias"} <= set(names)
    for name in names:
        data = json.loads((Path(PROFILES_DIR) / f"{name}.json").read_text())
        assert data["name"] == name and data["description"]


def test_zero_gpu_job_is_reported_not_placed() -> None:
    snapshot = Snap().node("n0", 8).build()
    job = PendingJob(id="cpu", vc="team", user="u", replicas=1, gpus_per_replica=0, submitted_at=0)  # type: ignore[arg-type]
    plan = decide(Snapshot(snapshot.nodes, snapshot.vcs, (), (job,)), profile(admission=[]), 0.0)
    assert not plan.starts and plan.pending[0].reason is ReasonCode.NO_MATCHING_GPU


@pytest.mark.parametrize("first_in_line", [False, True])
def test_a_job_gpus_were_freed_for_is_placed_before_the_queue(first_in_line: bool) -> None:
    """One GPU free and two jobs that want it: FIFO gives it to `early`, unless `claimant` is
    first in line (jobs were preempted or it was moved for it in an earlier cycle)."""
    snap = (
        Snap()
        .node("a", 2)
        .running("busy", [("a", (0,))])
        .pending("early", 1, submitted_at=1.0)
        .pending("claimant", 1, submitted_at=2.0, first_in_line=first_in_line)
    )
    plan = decide(snap.build(), profile(queue_sort=["priority", "fifo"]), now=10.0)
    assert [s.job_id for s in plan.starts] == (["claimant"] if first_in_line else ["early"])
    assert [p.job_id for p in plan.pending] == (["early"] if first_in_line else ["claimant"])


def test_a_moved_job_goes_after_the_jobs_first_in_line() -> None:
    """A gang waited for a job moved out of its way. Placed first in queue order, the moved job
    would take a GPU of the only free 4-GPU block (the spread score sends it to the emptiest
    node) and the gang would wait again; after the gang, both start, before `early`."""
    snap = (
        Snap()
        .node("a", 4)
        .node("c", 2)
        .running("busy", [("c", (0,))])
        .pending("early", 1, submitted_at=0.0)
        .pending("moved", 1, submitted_at=1.0, moved=True)
        .pending("gang", 4, submitted_at=2.0, first_in_line=True)
    )
    plan = decide(snap.build(), profile(queue_sort=["fifo"], score=["spread"]), now=10.0)
    placed = {s.job_id: [r.node for r in s.placement] for s in plan.starts}
    assert placed == {"gang": ["a"], "moved": ["c"]}

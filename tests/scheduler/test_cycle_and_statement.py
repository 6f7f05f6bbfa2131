"""The cycle's contract (deterministic, snapshot untouched, a reason and estimate for every
pending job), the Statement's exact undo, and profile validation."""

from __future__ import annotations

import copy
import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from sched_builders import Snap, profile

from scheduler.core import NodeState, PendingJob, ReasonCode, Snapshot, decide, load_profile
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


@pytest.mark.parametrize(("replicas", "per_replica"), [(1, 0), (2, 0), (0, 4)], ids=["1x0", "2x0", "0x4"])
@pytest.mark.parametrize("name", ["", "fifo", "default"])
def test_zero_gpu_job_is_reported_not_placed(replicas: int, per_replica: int, name: str) -> None:
    """A job that asks for no GPU is never placed, so it has no estimated start either (it
    was told it starts now, beside a reason saying it cannot be placed)."""
    snapshot = Snap().node("n0", 8).vc("team", 8).build()
    job = PendingJob(
        id="cpu", vc="team", user="u", replicas=replicas, gpus_per_replica=per_replica, submitted_at=0
    )  # type: ignore[arg-type]
    prof = load_profile(name) if name else profile(admission=[])
    plan = decide(Snapshot(snapshot.nodes, snapshot.vcs, (), (job,)), prof, 0.0)
    assert not plan.starts and plan.pending[0].reason is ReasonCode.NO_MATCHING_GPU
    assert plan.pending[0].estimated_start is None


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


@pytest.mark.parametrize("name", ["fifo", "tiresias", "default"])
def test_a_job_held_back_by_its_vc_quota_is_not_told_it_starts_now(name: str) -> None:
    """VC team may hold 2 GPUs and holds 2 until 16,200 (time limits); the node has room. Job
    lo may yield to p early (lower priority), which frees one GPU of the quota, not two: p
    starts when hi ends as well, not now."""
    snap = (
        Snap()
        .node("n0", 8)
        .vc("team", 0, 2)
        .running("hi", [("n0", (0,))], vc="team", started_at=9_000.0, priority=1000, time_limit_s=7_200.0)
        .running("lo", [("n0", (2,))], vc="team", started_at=9_000.0, priority=0, time_limit_s=7_200.0)
        .pending("p", 2, vc="team", submitted_at=9_500.0, priority=100, time_limit_s=3_600.0)
        .build()
    )
    (status,) = decide(snap, load_profile(name), 10_000.0).pending
    assert status.reason is ReasonCode.VC_QUOTA
    assert status.estimated_start == 16_200.0


@pytest.mark.parametrize("name", ["fifo", "default"])
def test_the_next_job_of_a_vc_whose_job_was_preempted_has_an_estimate(name: str) -> None:
    """VC a reclaims its 8 GPUs from b's borrowing job v. v's GPUs stay charged to b until v is
    gone (its grace); b's next job y is held by b's quota until then, and by the GPUs until x
    ends: it gets that estimate, not none."""
    snap = (
        Snap()
        .node("n0", 8, "A100")
        .vc("a", 8, 0)
        .vc("b", 4, 4)
        .running("v", [("n0", tuple(range(8)))], vc="b", started_at=1_000.0, estimated_runtime_s=100_000.0)
        .pending("x", 8, vc="a", submitted_at=9_000.0, estimated_runtime_s=3_600.0)
        .pending("y", 4, vc="b", submitted_at=9_500.0, estimated_runtime_s=3_600.0)
        .build()
    )
    plan = decide(snap, load_profile(name), now=10_000.0)
    assert [p.job_id for p in plan.preemptions] == ["v"]
    (y,) = [p for p in plan.pending if p.job_id == "y"]
    assert y.estimated_start is not None and y.estimated_start > 10_000.0


@pytest.mark.parametrize("name", ["fifo", "tiresias", "default"])
def test_a_quota_bound_estimate_does_not_depend_on_the_order_of_running_jobs(name: str) -> None:
    """Team's a (1 GPU) and other's b (3 GPUs) end at 5,000 on the full node n0, team's c at
    9,000. p waits for team's quota: a's end gives it room at 5,000, whether or not the walk
    needed a's GPU to find p a free one (it does not when it reads b's end first)."""
    snap = (
        Snap()
        .node("n0", 4)
        .node("n1", 1)
        .vc("team", 0, 2)
        .vc("other", 0, 8)
        .running("a", [("n0", (0,))], vc="team", started_at=1_000.0, time_limit_s=4_000.0)
        .running("b", [("n0", (1, 2, 3))], vc="other", started_at=1_000.0, time_limit_s=4_000.0)
        .running("c", [("n1", (0,))], vc="team", started_at=1_000.0, time_limit_s=8_000.0)
        .pending("p", 1, vc="team", submitted_at=1_500.0)
        .build()
    )
    prof = load_profile(name)
    estimates = set()
    for order in itertools.permutations(snap.running):
        (status,) = decide(Snapshot(snap.nodes, snap.vcs, order, snap.pending), prof, 2_000.0).pending
        assert status.reason is ReasonCode.VC_QUOTA
        estimates.add(status.estimated_start)
    assert len(estimates) == 1
    if name == "fifo":
        assert estimates == {5_000.0}


@pytest.mark.parametrize(
    ("running", "pending"),
    [
        pytest.param((), ("p", "p"), id="two-pending-jobs-of-one-id"),
        pytest.param(("p",), ("p",), id="a-pending-job-with-a-running-jobs-id"),
        pytest.param(("r", "r"), (), id="two-running-jobs-of-one-id"),
    ],
)
def test_a_snapshot_with_a_job_id_twice_is_refused(
    running: tuple[str, ...], pending: tuple[str, ...]
) -> None:
    """The cycle keys its work by job id: a duplicate gave two Starts for one id, or started
    a running job again. The callers' ids are unique, so decide refuses and names the id."""
    snap = Snap().node("n0", 8).node("n1", 8)
    for i, job_id in enumerate(running):
        snap.running(job_id, [(f"n{i}", (0,))])
    for job_id in pending:
        snap.pending(job_id, 1)
    with pytest.raises(ValueError, match=f"job id '{(running or pending)[0]}'"):
        decide(snap.build(), load_profile("default"), 100.0)


def stopped_and_drained_snapshot() -> Snapshot:
    """A VC stopped with a drain (its three running jobs are told to stop), a VC on hold (its
    three pending jobs wait, vc-stopped), a draining node with two jobs on it, and an open VC
    whose job preempts two lower-priority jobs."""
    snap = (
        Snap()
        .nodes(3, 8)
        .node("d0", 8, state=NodeState.DRAINING)
        .vc("drained", 8, stop_policy="hold-and-drain")
        .vc("held", 8, stop_policy="hold")
        .vc("open", 32, borrow=32)
    )
    for i, job_id in enumerate(("dz", "da", "dm")):
        snap.running(job_id, [("n0", (i,))], vc="drained", started_at=0.0)
    for i, job_id in enumerate(("ny", "nb")):
        snap.running(job_id, [("d0", (i,))], vc="open", started_at=0.0)
    for i, job_id in enumerate(("lw", "lc")):
        snap.running(job_id, [("n1", tuple(range(4 * i, 4 * i + 4)))], vc="open", started_at=0.0, priority=0)
    snap.running(
        "full", [("n2", tuple(range(8)))], vc="open", started_at=0.0, priority=1000, preemptible=False
    )
    snap.running(
        "rest", [("n0", tuple(range(3, 8)))], vc="open", started_at=0.0, priority=1000, preemptible=False
    )
    for job_id in ("hz", "ha", "hm"):
        snap.pending(job_id, 1, vc="held", submitted_at=10.0)
    snap.pending("urgent", 8, vc="open", submitted_at=20.0, priority=1000)
    return snap.build()


@pytest.mark.parametrize("name", ["fifo", "default"])
def test_preemptions_and_stopped_vcs_statuses_do_not_depend_on_the_snapshot_order(name: str) -> None:
    """Preemptions and the statuses of a stopped VC's jobs come out in job id order: the same
    snapshot in any order gives the same plan."""
    snapshot = stopped_and_drained_snapshot()
    prof = load_profile(name)
    plan = decide(snapshot, prof, 5_000.0)
    assert len(plan.preemptions) >= 5 and sum(p.reason == "vc-stopped" for p in plan.pending) == 3
    rng = random.Random(11)
    for _ in range(5):
        running, pending = list(snapshot.running), list(snapshot.pending)
        rng.shuffle(running)
        rng.shuffle(pending)
        assert (
            decide(replace(snapshot, running=tuple(running), pending=tuple(pending)), prof, 5_000.0) == plan
        )

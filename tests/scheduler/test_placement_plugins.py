"""Table tests for GPU choice (Gandiva topology, HiveD buddy), scores, gangs and eligibility."""

from __future__ import annotations

import pytest
from sched_builders import Snap, gpus, profile

from scheduler.core import Node, NodeName, NodeState, ReasonCode, decide
from scheduler.core.plugins.placement import choose_buddy, choose_by_topology, largest_free_block
from scheduler.core.state import NodeSlot


def slot(count: int = 8, nvlink: int = 4, pcie: int = 2) -> NodeSlot:
    node = Node(NodeName("n"), gpus(count, nvlink=nvlink, pcie=pcie))
    return NodeSlot(0, node, True, {"A100": set(range(count))}, {g.index: g for g in node.gpus}, None, None)


@pytest.mark.parametrize(
    ("free", "count", "expected"),
    [
        pytest.param({0, 1, 2, 3, 4, 5, 6, 7}, 4, (0, 1, 2, 3), id="whole-nvlink-group"),
        pytest.param({0, 4, 5, 6, 7}, 1, (0,), id="single-gpu-goes-to-the-split-group"),
        pytest.param({1, 2, 3, 4, 5, 6, 7}, 2, (2, 3), id="pair-in-fuller-group-same-pcie"),
        pytest.param({0, 2, 4, 5, 6}, 3, (4, 5, 6), id="three-inside-one-nvlink-group"),
        pytest.param({0, 1, 4, 5, 6}, 4, (4, 5, 6, 0), id="spans-groups-fullest-first"),
        pytest.param({0, 1}, 3, None, id="not-enough-free"),
    ],
)
def test_topology_choice(free: set[int], count: int, expected: tuple[int, ...] | None) -> None:
    chosen = choose_by_topology(free, slot(), count)
    if expected is None:
        assert chosen is None
    else:
        assert chosen is not None and sorted(chosen) == sorted(expected)


@pytest.mark.parametrize(
    ("free", "count", "strict", "expected"),
    [
        pytest.param(set(range(8)), 2, False, (0, 1), id="aligned-pair-from-empty-node"),
        pytest.param({2, 3, 4, 5, 6, 7}, 2, False, (2, 3), id="pair-whose-buddy-is-used-keeps-4-block"),
        pytest.param({1, 2, 3, 4, 5, 6, 7}, 1, False, (1,), id="single-fills-split-pair"),
        pytest.param({1, 2, 5, 6}, 2, True, None, id="strict-no-aligned-pair"),
        pytest.param({1, 2, 5, 6}, 2, False, (1, 2), id="lenient-falls-back-to-topology"),
        pytest.param(set(range(8)), 3, False, (0, 1, 2), id="three-takes-an-aligned-four-block"),
    ],
)
def test_buddy_choice(free: set[int], count: int, strict: bool, expected: tuple[int, ...] | None) -> None:
    assert choose_buddy(free, slot(), count, strict) == expected


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        pytest.param(set(range(8)), 8, id="empty-node"),
        pytest.param({0, 1, 2, 3, 5}, 4, id="first-half"),
        pytest.param({1, 2, 5, 6}, 1, id="no-aligned-pair"),
        pytest.param(set(), 0, id="full"),
    ],
)
def test_largest_free_block(free: set[int], expected: int) -> None:
    assert largest_free_block(list(range(8)), free) == expected


def placed_nodes(plan: object) -> list[str]:
    return [r.node for s in plan.starts for r in s.placement]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("scores", "order", "expected_node"),
    [
        pytest.param(["binpack"], "fullest", "busy", id="binpack-fills-the-busy-node"),
        pytest.param(["spread"], "emptiest", "idle", id="spread-picks-the-idle-node"),
    ],
)
def test_binpack_and_spread(scores: list[str], order: str, expected_node: str) -> None:
    snap = Snap().node("busy", 8).node("idle", 8).running("r", [("busy", (0, 1, 2, 3))]).pending("j", 2)
    plan = decide(snap.build(), profile(score=scores, cycle={"candidate_order": order}), 0.0)
    assert placed_nodes(plan) == [expected_node]


def test_gang_prefers_one_rack() -> None:
    snap = (
        Snap()
        .node("a0", 8, rack="ra")
        .node("b0", 8, rack="rb")
        .node("a1", 8, rack="ra")
        .node("b1", 8, rack="rb")
        .running("r1", [("b0", (0, 1, 2, 3, 4, 5, 6))])
        .pending("gang", gpus_=8, replicas=2)
    )
    plan = decide(snap.build(), profile(score=["topology", "binpack"]), 0.0)
    assert sorted(placed_nodes(plan)) == ["a0", "a1"]


def test_gang_is_all_or_nothing_and_reports_nodes() -> None:
    snap = (
        Snap()
        .nodes(6, 8)
        .running("r0", [("n0", (0,))])
        .running("r1", [("n1", (0,))])
        .running("r2", [("n2", (0,))])
        .running("r3", [("n3", (0,))])
        .pending("gang", gpus_=8, replicas=4)
        .pending("small", gpus_=1, submitted_at=5)
    )
    plan = decide(snap.build(), profile(), 0.0)
    assert [s.job_id for s in plan.starts] == ["small"]
    gang = next(p for p in plan.pending if p.job_id == "gang")
    assert gang.reason is ReasonCode.GANG_NODES
    assert gang.message == "gang needs 4 nodes with 8 free A100; 2 have them"


def test_fragmentation_is_named() -> None:
    snap = Snap().nodes(3, 8)
    for i in range(3):
        snap.running(f"r{i}", [(f"n{i}", (0, 1, 2, 3))])
    plan = decide(snap.pending("j", 8).build(), profile(), 0.0)
    (status,) = plan.pending
    assert status.reason is ReasonCode.FRAGMENTATION
    assert status.message == "12 A100 free but no node has 8 free (fragmentation)"


@pytest.mark.parametrize(
    ("state", "unhealthy", "expected"),
    [
        pytest.param(NodeState.READY, (), ["bad"], id="ready-node-is-used"),
        pytest.param(NodeState.CORDONED, (), ["good"], id="cordoned-excluded"),
        pytest.param(NodeState.DRAINING, (), ["good"], id="draining-excluded"),
        pytest.param(NodeState.NOT_READY, (), ["good"], id="not-ready-excluded"),
        pytest.param(NodeState.READY, (0, 1, 2, 3, 4, 5), ["good"], id="unhealthy-gpus-excluded"),
    ],
)
def test_node_and_gpu_eligibility(state: NodeState, unhealthy: tuple[int, ...], expected: list[str]) -> None:
    # "bad" is fuller, so bin-packing prefers it whenever it is eligible.
    snap = (
        Snap()
        .node("bad", 8, state=state, unhealthy=unhealthy)
        .node("good", 8)
        .running("r", [("bad", (6,))])
        .running("r2", [("good", (7,))])
        .running("r3", [("bad", (7,))])
        .pending("j", 2)
    )
    plan = decide(snap.build(), profile(score=["binpack"]), 0.0)
    assert placed_nodes(plan) == expected


def test_gpu_model_constraint() -> None:
    snap = Snap().node("v", 8, model="V100").node("a", 8, model="A100").pending("j", 4, gpu_model="A100")
    plan = decide(snap.build(), profile(), 0.0)
    assert placed_nodes(plan) == ["a"]


def test_job_wider_than_the_model_pool_is_unresolvable() -> None:
    snap = Snap().node("v", 8, model="V100").pending("j", 16, gpu_model="V100")
    plan = decide(snap.build(), profile(), 0.0)
    (status,) = plan.pending
    assert status.reason is ReasonCode.NO_MATCHING_GPU
    assert status.estimated_start is None


def test_node_resources_filter() -> None:
    snap = (
        Snap()
        .node("small", 8, cpu_milli=4000, memory_mib=1000)
        .node("big", 8, cpu_milli=64000, memory_mib=100000)
        .running("r", [("small", (0,))])
        .pending("j", 1, cpu_milli_per_replica=8000, memory_mib_per_replica=500)
    )
    plan = decide(snap.build(), profile(filter=["node_resources"], score=["binpack"]), 0.0)
    assert placed_nodes(plan) == ["big"]


def test_any_model_job_uses_a_model_that_fits() -> None:
    snap = Snap().node("v", 2, model="V100").node("a", 8, model="A100").pending("j", 4)
    plan = decide(snap.build(), profile(), 0.0)
    assert placed_nodes(plan) == ["a"]


def two_half_full_nodes() -> Snap:
    # 4 of 8 GPUs free on each node: no node holds an 8-GPU replica, the cluster holds 8 GPUs.
    return (
        Snap()
        .node("n0", 8)
        .node("n1", 8)
        .running("a", [("n0", (0, 1, 2, 3))], started_at=0)
        .running("b", [("n1", (0, 1, 2, 3))], started_at=0)
    )


@pytest.mark.parametrize(
    ("spread_after_s", "submitted_at", "spreads"),
    [
        pytest.param(None, 0.0, False, id="never-spreads-without-the-option"),
        pytest.param(600.0, 500.0, False, id="keeps-its-shape-before-the-wait-is-up"),
        pytest.param(600.0, 0.0, True, id="spreads-once-it-has-waited"),
    ],
)
def test_a_job_may_spread_over_nodes_after_a_wait(
    spread_after_s: float | None, submitted_at: float, spreads: bool
) -> None:
    snap = two_half_full_nodes().pending(
        "wide",
        8,
        submitted_at=submitted_at,
        spread_after_s=spread_after_s,
        cpu_milli_per_replica=8000,
        memory_mib_per_replica=1000,
    )
    plan = decide(snap.build(), profile(), now=1000.0)
    if not spreads:
        assert not plan.starts
        (status,) = plan.pending
        assert status.reason in (ReasonCode.FRAGMENTATION, ReasonCode.GANG_NODES)
        return
    (start,) = plan.starts
    assert len(start.placement) == 8 and all(len(r.gpu_indices) == 1 for r in start.placement)
    per_node = {r.node: sum(1 for p in start.placement if p.node == r.node) for r in start.placement}
    assert per_node == {"n0": 4, "n1": 4}


def test_a_spread_job_still_takes_one_node_when_one_has_room_under_default() -> None:
    from scheduler.core import load_profile

    snap = two_half_full_nodes().node("n2", 8).pending("wide", 8, spread_after_s=0.0)
    (start,) = decide(snap.build(), load_profile("default"), now=1000.0).starts
    assert {r.node for r in start.placement} == {"n2"}  # the affinity score keeps it together


def test_a_spread_job_asks_for_its_cpu_and_memory_divided_among_its_replicas() -> None:
    from scheduler.core.cycle import spread_waited_jobs

    snap = (
        Snap()
        .node("n0", 8)
        .pending(
            "wide", 4, replicas=2, spread_after_s=60.0, cpu_milli_per_replica=3000, memory_mib_per_replica=10
        )
    )
    (job,) = spread_waited_jobs(snap.build(), now=60.0).pending
    assert (job.replicas, job.gpus_per_replica) == (8, 1)
    assert (job.cpu_milli_per_replica, job.memory_mib_per_replica) == (750, 3)  # rounded up
    (unchanged,) = spread_waited_jobs(snap.build(), now=59.0).pending
    assert (unchanged.replicas, unchanged.gpus_per_replica) == (2, 4)

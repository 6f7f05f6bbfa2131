"""Fractional GPUs: shares of one GPU for jobs of one tenant, within its capacity and memory,
never mixed with whole-GPU work, counted for quotas as whole GPUs; FGD versus best fit."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from sched_builders import Snap, profile

from scheduler.core import Gpu, Node, NodeName, Plan, Quota, ReasonCode, VcName, VirtualCluster, decide
from scheduler.core.framework import CycleContext
from scheduler.core.plugins.sharing import FragmentationGradient
from scheduler.core.state import build_state

BEST_FIT = profile(queue_sort=["fifo"], admission=["vc_quota"], share_chooser="best_fit_share")
FGD = profile(queue_sort=["fifo"], admission=["vc_quota"], share_chooser="fgd")


def with_memory(snap: Snap, mib: int) -> Snap:
    snap._nodes = [replace(n, gpus=tuple(replace(g, memory_mib=mib) for g in n.gpus)) for n in snap._nodes]
    return snap


def placed(plan: Plan) -> dict[str, tuple[str, int, int]]:
    """job -> (node, GPU index, share)."""
    return {
        s.job_id: (s.placement[0].node, s.placement[0].gpu_indices[0], s.gpu_share_milli) for s in plan.starts
    }


def test_shares_of_one_tenant_pack_onto_one_gpu_and_the_plan_carries_them() -> None:
    snap = (
        Snap()
        .node("n0", 2)
        .pending("a", 1, gpu_share_milli=500, gpu_memory_mib=8000, submitted_at=1)
        .pending("b", 1, gpu_share_milli=400, submitted_at=2)
        .pending("whole", 1, submitted_at=3)
        .build()
    )
    plan = decide(snap, BEST_FIT, 10.0)
    where = placed(plan)
    assert where["a"][:2] == where["b"][:2], "two shares of one tenant share a GPU"
    assert (where["a"][2], where["b"][2]) == (500, 400)
    assert where["whole"][1] != where["a"][1], "whole-GPU work never lands on a shared GPU"
    start = next(s for s in plan.starts if s.job_id == "a")
    assert start.gpu_memory_mib == 8000


def test_tenants_never_share_a_gpu() -> None:
    snap = Snap().node("n0", 2)
    snap._vcs = [
        VirtualCluster(VcName("red"), (Quota("*", 2, 0),), tenant="red"),
        VirtualCluster(VcName("blue"), (Quota("*", 2, 0),), tenant="blue"),
    ]
    snap.pending("r", 1, vc="red", gpu_share_milli=300, submitted_at=1)
    snap.pending("b", 1, vc="blue", gpu_share_milli=300, submitted_at=2)
    snap.pending("b2", 1, vc="blue", gpu_share_milli=300, submitted_at=3)
    snap.pending("r2", 1, vc="red", gpu_share_milli=800, submitted_at=4)
    plan = decide(snap.build(), BEST_FIT, 10.0)
    where = placed(plan)
    assert where["r"][1] != where["b"][1]
    assert where["b2"][1] == where["b"][1]
    # 300 + 800 does not fit red's GPU and blue's GPU is blue's: r2 waits.
    assert "r2" not in where
    status = next(p for p in plan.pending if p.job_id == "r2")
    assert status.reason is ReasonCode.INSUFFICIENT_GPUS and "tenant red" in status.message


def test_gpu_memory_limits_sharing() -> None:
    snap = with_memory(
        Snap()
        .node("n0", 2)
        .pending("a", 1, gpu_share_milli=300, gpu_memory_mib=10_000, submitted_at=1)
        .pending("b", 1, gpu_share_milli=300, gpu_memory_mib=8_000, submitted_at=2),
        16_000,
    ).build()
    where = placed(decide(snap, BEST_FIT, 10.0))
    assert where["a"][1] != where["b"][1], "10 + 8 GB exceed a 16 GB GPU"


def test_running_shares_are_respected() -> None:
    snap = (
        Snap()
        .node("n0", 1)
        .running("old", [("n0", (0,))], gpu_share_milli=700)
        .pending("too-big", 1, gpu_share_milli=400, submitted_at=1)
        .pending("fits", 1, gpu_share_milli=300, submitted_at=2)
        .pending("whole", 1, submitted_at=3)
        .build()
    )
    plan = decide(snap, BEST_FIT, 10.0)
    assert placed(plan) == {"fits": ("n0", 0, 300)}


def test_shares_count_for_quota_as_whole_gpus_rounded_up() -> None:
    snap = Snap().node("n0", 4).vc("team", guaranteed=1)
    for i in range(3):
        snap.pending(f"s{i}", 1, gpu_share_milli=400, submitted_at=i)
    plan = decide(snap.build(), BEST_FIT, 10.0)
    assert sorted(placed(plan)) == ["s0", "s1"]  # 800 thousandths: one GPU
    status = next(p for p in plan.pending if p.job_id == "s2")
    assert status.reason is ReasonCode.VC_QUOTA


def test_fgd_keeps_room_for_the_common_share_where_best_fit_strands_it() -> None:
    # GPU 0 has 600 thousandths left; most of the workload asks for 500. A 200 share on GPU 0
    # would leave 400 there, which no 500 task can use: FGD puts it on the free GPU 1, best
    # fit on GPU 0. (The 500 tasks come later in the queue: here they only shape the workload.)
    base = Node(NodeName("n0"), tuple(Gpu(i, "A100", uuid=f"g{i}") for i in range(2)))
    snap = Snap()
    snap._nodes = [base]
    snap.running("r", [("n0", (0,))], gpu_share_milli=400)
    snap.pending("small", 1, gpu_share_milli=200, submitted_at=1)
    for i in range(4):
        snap.pending(f"common{i}", 1, gpu_share_milli=500, submitted_at=2 + i)
    built = snap.build()
    assert placed(decide(built, BEST_FIT, 10.0))["small"] == ("n0", 0, 200)
    assert placed(decide(built, FGD, 10.0))["small"] == ("n0", 1, 200)


# -- the FGD measure, by hand -------------------------------------------------------------

# A: one whole GPU and 4 cores (half the workload); B: half a GPU and 2 cores; C: two whole
# T4 GPUs and 8 cores.
WORKLOAD = [
    {"gpus": 1, "share_milli": 0, "cpu_milli": 4000, "weight": 5},
    {"gpus": 0, "share_milli": 500, "cpu_milli": 2000, "weight": 3},
    {"gpus": 2, "share_milli": 0, "cpu_milli": 8000, "model": "T4", "weight": 2},
]


@pytest.mark.parametrize(
    ("free", "cpu", "models", "expected"),
    [
        # A strands the partly used GPUs (600 + 200), B the one with less than 500 left (200),
        # C everything (1800: no T4): 0.5 * 800 + 0.3 * 200 + 0.2 * 1800.
        ([1000, 600, 200, 0], 6000, {"A100"}, 820.0),
        # 3 cores: A no longer fits, it strands all 1800.
        ([1000, 600, 200, 0], 3000, {"A100"}, 0.5 * 1800 + 0.3 * 200 + 0.2 * 1800),
        # Whole free GPUs: A and B use them; C has its T4s but lacks CPU (8 > 6 cores).
        ([1000, 1000, 0, 0], 6000, {"T4"}, 0.2 * 2000),
        # With the CPU, C fits too: nothing is stranded.
        ([1000, 1000, 0, 0], 9000, {"T4"}, 0.0),
        # Only one whole GPU: C (two) cannot run.
        ([1000, 500, 0, 0], 9000, {"T4"}, 0.5 * 500 + 0.2 * 1500),
        ([0, 0], 9000, {"T4"}, 0.0),
    ],
)
def test_fragmentation_is_the_capacity_each_task_type_cannot_use(
    free: list[int], cpu: int, models: set[str], expected: float
) -> None:
    fgd = FragmentationGradient({"workload": WORKLOAD})
    assert [s.weight for s in fgd.shapes] == pytest.approx([0.5, 0.3, 0.2])
    assert fgd.fragmentation(free, cpu, models=frozenset(models)) == pytest.approx(expected)


def test_a_task_without_gpus_strands_all_free_gpus_and_rare_types_are_left_out() -> None:
    cpu_only = FragmentationGradient({"workload": [{"gpus": 0, "share_milli": 0, "cpu_milli": 1000}]})
    assert cpu_only.fragmentation([1000, 300], 64000) == pytest.approx(1300)
    # Keeping 70 % of the workload keeps A and B (80 %), reweighted, and leaves C out.
    fgd = FragmentationGradient({"workload": WORKLOAD, "popularity": 0.7})
    assert [(s.gpus, s.share_milli) for s in fgd.shapes] == [(1, 0), (0, 500)]
    assert [s.weight for s in fgd.shapes] == pytest.approx([0.625, 0.375])


def test_the_fgd_score_is_the_papers_sigmoid_of_the_gradient() -> None:
    fgd = FragmentationGradient({})
    assert fgd.score_of(0.0) == pytest.approx(50.0)
    assert fgd.score_of(-1000.0) == pytest.approx(100 / (1 + math.exp(-1)))
    assert fgd.score_of(1000.0) < 50.0 < fgd.score_of(-10.0)


def test_fgd_learns_the_workload_from_the_snapshot_without_one_given() -> None:
    snap = Snap().node("n0", 2).pending("a", 1, gpu_share_milli=500, cpu_milli_per_replica=1000)
    snap.pending("b", 1, gpu_share_milli=500, cpu_milli_per_replica=1000).pending("c", 2)
    built = snap.build()
    fgd = FragmentationGradient({})
    fgd.prepare(CycleContext(built, 0.0, build_state(built)[0], {}, {}))
    assert [(s.gpus, s.share_milli, s.cpu_milli) for s in fgd.shapes] == [(0, 500, 1000), (2, 0, 0)]
    assert [s.weight for s in fgd.shapes] == pytest.approx([2 / 3, 1 / 3])


def test_fgd_places_a_whole_gpu_pod_where_it_strands_least_cpu_bound_capacity() -> None:
    # Most of the workload needs 10 cores per GPU. "lean" has 2 GPUs and 12 cores, "rich" 2
    # GPUs and 64 cores. A 10-core pod on "lean" leaves its other GPU 2 cores: stranded for
    # most tasks; on "rich" nothing is stranded. (Without FGD the first node, "lean", wins.)
    workload = [{"gpus": 1, "cpu_milli": 10000, "weight": 9}, {"gpus": 1, "cpu_milli": 1000}]
    args = {"fgd": {"workload": workload}}
    fgd_only = profile(queue_sort=["fifo"], admission=["vc_quota"], score=["fgd"], plugin_args=args)
    snap = Snap().node("lean", 2, cpu_milli=12000).node("rich", 2, cpu_milli=64000)
    snap.pending("heavy", 1, cpu_milli_per_replica=10000)
    assert decide(snap.build(), fgd_only, 0.0).starts[0].placement[0].node == "rich"


def test_best_fit_prefers_the_node_with_least_cpu_and_gpu_left() -> None:
    # After a 1-GPU, 4-core pod: "big" keeps 3 of the largest node's 4 GPUs and 60 of its 64
    # cores, "small" 1 GPU and 12 cores: best fit takes "small".
    bf = profile(queue_sort=["fifo"], admission=["vc_quota"], score=["best_fit_share"])
    snap = Snap().node("big", 4, cpu_milli=64000).node("small", 2, cpu_milli=16000)
    snap.pending("p", 1, cpu_milli_per_replica=4000)
    assert decide(snap.build(), bf, 0.0).starts[0].placement[0].node == "small"
    # CPU counts: a node with 2 free GPUs of 4 but its CPU nearly gone is the better fit than
    # a node with 1 free GPU of 2 and all its CPU.
    snap = Snap().node("a", 4, cpu_milli=64000).node("b", 2, cpu_milli=64000)
    snap.running("ra", [("a", (0, 1))], cpu_milli_per_replica=56000)
    snap.running("rb", [("b", (0,))], cpu_milli_per_replica=1000)
    snap.pending("p", 1, cpu_milli_per_replica=4000)
    assert decide(snap.build(), bf, 0.0).starts[0].placement[0].node == "a"


def test_best_fit_share_goes_to_the_fullest_node_then_the_tightest_gpu() -> None:
    snap = Snap().node("n0", 4, cpu_milli=64000).node("n1", 2, cpu_milli=64000)
    snap.running("r0", [("n0", (0,))], gpu_share_milli=300, cpu_milli_per_replica=1000)
    snap.running("r1", [("n1", (0,))], gpu_share_milli=500, cpu_milli_per_replica=1000)
    snap.running("r2", [("n1", (1,))], cpu_milli_per_replica=1000)
    snap.pending("s", 1, gpu_share_milli=200, cpu_milli_per_replica=1000)
    # n1 has 0.5 GPU left, n0 3.7: the share goes to n1's shared GPU although n0's has less room.
    assert placed(decide(snap.build(), BEST_FIT, 0.0))["s"] == ("n1", 0, 200)


def test_feed_strands_the_free_gpus_the_free_cpu_cannot_feed_at_the_workloads_ratio() -> None:
    # A mix of A (1 GPU, 4 cores) and B (half a GPU, 1 core), half and half: 2.5 cores per
    # 0.75 GPU asked for, 3.33 cores per GPU. 4 free GPUs and 6 cores: one A or B fits (the
    # paper strands nothing), but 6 cores feed only 1.8 GPUs of the mix: 2.2 stranded.
    workload = [
        {"gpus": 1, "cpu_milli": 4000, "weight": 1},
        {"gpus": 0, "share_milli": 500, "cpu_milli": 1000, "weight": 1},
    ]
    assert FragmentationGradient({"workload": workload}).fragmentation([1000] * 4, 6000) == 0.0
    fed = FragmentationGradient({"workload": workload, "feed": True})
    assert fed.fragmentation([1000] * 4, 6000) == pytest.approx(2200.0)
    # With the CPU to feed them all, the paper's measure (here B's GPU with 300 left).
    assert fed.fragmentation([1000, 1000, 300], 64000) == pytest.approx(0.5 * 300 + 0.5 * 300)
    # Untracked CPU feeds everything.
    assert fed.fragmentation([1000] * 4, math.inf) == 0.0


def test_feed_sends_cpu_heavy_work_where_cpu_is_to_spare() -> None:
    # Typical tasks need 10-20 cores per GPU. A 20-core pod fits on "tight" (4 GPUs, 40
    # cores) and "rich" (4 GPUs, 64 cores) alike, and one typical task still fits beside it
    # on either: the paper's measure ties them (the first node wins). On "tight" it would
    # leave 20 cores for 3 GPUs, which the mix cannot feed; on "rich" 44 cores are enough.
    workload = [{"gpus": 1, "cpu_milli": 10000, "weight": 9}, {"gpus": 1, "cpu_milli": 20000}]
    snap = Snap().node("tight", 4, cpu_milli=40000).node("rich", 4, cpu_milli=64000)
    snap.pending("heavy", 1, cpu_milli_per_replica=20000)
    built = snap.build()
    for feed, node in ((False, "tight"), (True, "rich")):
        args = {"fgd": {"workload": workload, "feed": feed}}
        fgd_only = profile(queue_sort=["fifo"], admission=["vc_quota"], score=["fgd"], plugin_args=args)
        assert decide(built, fgd_only, 0.0).starts[0].placement[0].node == node

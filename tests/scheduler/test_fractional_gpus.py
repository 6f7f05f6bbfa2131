"""Fractional GPUs: shares of one GPU for jobs of one tenant, within its capacity and memory,
never mixed with whole-GPU work, counted for quotas as whole GPUs; FGD versus best fit."""

from __future__ import annotations

from dataclasses import replace

from sched_builders import Snap, profile

from scheduler.core import Gpu, Node, NodeName, Plan, Quota, ReasonCode, VcName, VirtualCluster, decide

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

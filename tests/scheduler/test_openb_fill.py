"""The openb fill experiment: pods fill the cluster in arrival order; what stays free but
unusable by the pods left pending is reported as unallocated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.core import Gpu, JobId, Node, NodeName, ReplicaPlacement, RunningJob, load_profile
from scheduler.sim import openb
from scheduler.sim.__main__ import main

NODES = (
    "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,1,T4\nn1,16000,65536,2,T4\ncpu-only,64000,65536,0,\n"
)
PODS_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def write(tmp_path: Path, pods: list[str]) -> tuple[Path, Path]:
    nodes, trace = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    trace.write_text(PODS_HEADER + "".join(f"{row}\n" for row in pods))
    return nodes, trace


def test_what_no_pending_pod_can_use_is_unallocated(tmp_path: Path) -> None:
    nodes, trace = write(
        tmp_path,
        [
            "p-big,4000,4096,2,1000,,LS,Running,0,9,0",  # both GPUs of n1
            "p-share,2000,2048,1,600,,LS,Running,1,9,1",  # 0.6 of n0's GPU
            "p-cpu,0,0,0,0,,BE,Running,2,9,2",  # asks for nothing: left out
            "p-share2,2000,2048,1,600,,LS,Running,3,9,3",  # 0.6 more does not fit: pending
        ],
    )
    pods, skipped = openb.load_pods(trace)
    assert skipped == 1 and [p.share_milli for p in pods] == [0, 600, 600]
    result = openb.fill(openb.load_nodes(nodes), pods, load_profile("best-fit"), demand=1.0)
    assert (result["gpus"], result["pods_placed"], result["pods_pending"]) == (3, 2, 1)
    assert result["allocated_gpu_ratio"] == pytest.approx(2.6 / 3, abs=1e-4)
    # 0.4 of n0's GPU is free, and the pending pod needs 0.6: lost to fragmentation.
    assert result["unallocated_gpus"] == pytest.approx(0.4)


def test_nothing_is_unallocated_while_pending_pods_could_still_use_it(tmp_path: Path) -> None:
    nodes, trace = write(
        tmp_path,
        [
            "a,1000,1024,1,500,,LS,Running,0,9,0",
            "b,99000,1024,1,300,,LS,Running,1,9,1",  # more CPU than any node: pending
            "c,1000,1024,2,1000,,LS,Running,2,9,2",
        ],
    )
    pods, _ = openb.load_pods(trace)
    result = openb.fill(openb.load_nodes(nodes), pods, load_profile("best-fit"), demand=1.2)
    # b never fits anywhere (CPU), so all the free capacity counts as unallocated for it.
    assert result["pods_pending"] >= 1
    free = (1 - result["allocated_gpu_ratio"]) * result["gpus"]
    assert result["unallocated_gpus"] == pytest.approx(free, abs=0.05)


def test_cli_runs_the_fill_with_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = ["a,1000,1024,1,500,,LS,Running,0,9,0", "b,1000,1024,1,700,,LS,Running,1,9,1"]
    nodes, trace = write(tmp_path, rows)
    code = main(
        ["--trace", str(trace), "--format", "openb", "--nodes", str(nodes), "--profile", "default", "--json"]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"unallocated_gpus", "allocated_gpu_ratio", "pods_pending", "profile"} <= set(summary)
    assert summary["profile"] == "default"


def test_fgd_is_given_the_task_types_of_the_replayed_pods(tmp_path: Path) -> None:
    rows = [
        "a,1000,1024,1,500,,LS,Running,0,9,0",
        "b,1000,1024,1,500,,LS,Running,1,9,1",
        "c,4000,2048,2,1000,,LS,Running,2,9,2",
    ]
    _, trace = write(tmp_path, rows)
    pods, _ = openb.load_pods(trace)
    assert openb.task_types(pods) == [
        {"gpus": 0, "share_milli": 500, "cpu_milli": 1000, "memory_mib": 1024, "weight": 2},
        {"gpus": 2, "share_milli": 0, "cpu_milli": 4000, "memory_mib": 2048, "weight": 1},
    ]
    default = openb.with_trace_workload(load_profile("default"), pods)
    assert default.plugin_args["fgd"]["workload"] == openb.task_types(pods)
    assert default.plugin_args["fgd"]["feed"] is True, "the profile's own settings are kept"
    shipped = load_profile("default").plugin_args["fgd"]
    assert "workload" not in shipped, "the shipped profile is left alone"
    best_fit = load_profile("best-fit")
    assert openb.with_trace_workload(best_fit, pods) is best_fit, "no fgd, nothing to give"


def test_the_monte_carlo_workload_is_the_trace_plus_draws_up_to_the_ratio_shuffled(tmp_path: Path) -> None:
    rows = [f"p{i},1000,1024,1,{200 + 100 * i},,LS,Running,{i},9,{i}" for i in range(5)]
    _, trace = write(tmp_path, rows)
    pods, _ = openb.load_pods(trace)
    drawn = openb.sample(pods, gpus=4, seed=7)
    assert drawn == openb.sample(pods, gpus=4, seed=7), "a seed gives one workload"
    assert {p.name for p in pods} <= {p.name for p in drawn}, "every pod of the trace is in it"
    demand = sum(p.demand_milli for p in drawn)
    assert 4 * 1000 < demand <= 1.3 * 4 * 1000
    assert openb.sample(pods, gpus=4, seed=8) != drawn


def test_free_gpus_is_what_is_not_handed_out(tmp_path: Path) -> None:
    nodes, trace = write(tmp_path, ["a,1000,1024,1,500,,LS,Running,0,9,0"])
    pods, _ = openb.load_pods(trace)
    result = openb.fill(openb.load_nodes(nodes), pods, load_profile("default"), demand=0.1)
    assert result["free_gpus"] == pytest.approx(2.5)


def test_the_openb_command_reports_each_seed_and_the_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ["a,1000,1024,1,500,,LS,Running,0,9,0", "b,1000,1024,1,700,,LS,Running,1,9,1"]
    nodes, trace = write(tmp_path, rows)
    args = ["--trace", str(trace), "--nodes", str(nodes), "--profile", "default", "--seeds", "1,2"]
    assert openb.main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [line.get("seed") for line in lines] == [1, 2, None]
    assert lines[-1]["seeds"] == 2
    mean = (lines[0]["unallocated_gpus"] + lines[1]["unallocated_gpus"]) / 2
    assert lines[-1]["unallocated_gpus"] == pytest.approx(mean)


# Three nodes for the pods without GPUs: a small one, a small one with two GPUs, a big one.
CPU_NODES = (
    Node(NodeName("small"), (Gpu(0, "T4"),), cpu_milli=16000, memory_mib=65536),
    Node(NodeName("small2"), (Gpu(0, "T4"), Gpu(1, "T4")), cpu_milli=16000, memory_mib=65536),
    Node(NodeName("big"), (Gpu(0, "T4"), Gpu(1, "T4")), cpu_milli=64000, memory_mib=65536),
)
VCS = (openb.VirtualCluster(openb.VC, (openb.Quota("*", 5, 0),), tenant="openb"),)
GPU_POD = openb.Pod("g", 12000, 1024, 1, 0)  # the workload FGD expects: one GPU, 12 cores
CPU_POD = openb.Pod("c", 8000, 1024, 0, 0)


def cpu_pod_goes_to(profile_name: str, running: list[RunningJob]) -> str:
    profile = openb.with_trace_workload(load_profile(profile_name), [GPU_POD])
    before = len(running)
    unplaced = openb.place_cpu_only(CPU_NODES, VCS, running, [(JobId("c/0"), CPU_POD)], profile)
    assert unplaced == [] and len(running) == before + 1
    job = running[-1]
    assert job.gpus == 0 and job.placement[0].gpu_indices == ()
    assert (job.cpu_milli_per_replica, job.memory_mib_per_replica) == (8000, 1024)
    return job.placement[0].node


def test_best_fit_puts_a_pod_without_gpus_on_the_node_with_least_cpu_and_gpu_left() -> None:
    # left after it: small 0.5 * 8/64 + 0.5 * 1/2 < small2 (two GPUs) < big (56 cores).
    assert cpu_pod_goes_to("best-fit", []) == "small"


def test_fgd_puts_a_pod_without_gpus_where_it_strands_no_gpu() -> None:
    # With 8 of 16 cores taken, small and small2 can no longer hold the 12-core GPU pod, so
    # their free GPUs would be stranded; on big 56 cores stay: nothing is stranded.
    assert cpu_pod_goes_to("default", []) == "big"


def test_fgd_prefers_a_node_whose_gpus_are_all_taken_among_those_it_strands_nothing_on() -> None:
    # small2's GPUs are both taken: the pod strands nothing there either, and leaves big's
    # CPU for its free GPUs.
    taken = RunningJob(
        JobId("t"),
        openb.VC,
        openb.USER,
        (ReplicaPlacement(NodeName("small2"), (0, 1)),),
        started_at=0.0,
        cpu_milli_per_replica=4000,
    )
    running = [taken]
    assert cpu_pod_goes_to("default", running) == "small2"
    # The next one no longer fits on small2 (4 + 8 + 8 > 16 cores): back to big.
    assert cpu_pod_goes_to("default", running) == "big"


def test_pods_without_gpus_are_replayed_in_their_turn_and_take_cpu(tmp_path: Path) -> None:
    nodes, trace = write(
        tmp_path,
        [
            "c1,12000,4096,0,0,,BE,Running,0,9,0",  # best fit: n0 (the fullest), 4 cores left
            "g1,8000,4096,1,1000,,LS,Running,1,9,1",  # 8 cores: not n0 any more, n1
            "g2,8000,4096,1,1000,,LS,Running,2,9,2",  # n1 again (8 cores left there)
            "g3,8000,4096,1,1000,,LS,Running,3,9,3",  # nowhere: n0 has 4 cores
        ],
    )
    pods, skipped = openb.load_pods(trace)
    assert skipped == 0 and [p.cpu_only for p in pods] == [True, False, False, False]
    result = openb.fill(openb.load_nodes(nodes), pods, load_profile("best-fit"), demand=1.0)
    assert (result["cpu_pods_placed"], result["cpu_pods_pending"]) == (1, 0)
    assert (result["pods_placed"], result["pods_pending"]) == (2, 1)
    # n0's GPU is free but no pending GPU pod has the CPU for it.
    assert result["unallocated_gpus"] == pytest.approx(1.0)
    gpu_only, skipped = openb.load_pods(trace, cpu_pods=False)
    assert skipped == 1 and len(gpu_only) == 3
    without = openb.fill(openb.load_nodes(nodes), gpu_only, load_profile("best-fit"), demand=1.0)
    assert (without["pods_placed"], without["pods_pending"]) == (3, 0)


def test_a_pending_pod_without_gpus_makes_no_free_gpu_usable(tmp_path: Path) -> None:
    nodes, trace = write(
        tmp_path,
        ["c,99000,1024,0,0,,BE,Running,0,9,0", "a,1000,1024,1,1000,,LS,Running,1,9,1"],
    )
    pods, _ = openb.load_pods(trace)
    # c, a, c, a: two GPUs asked for (over 0.34 x 3), both placed; c fits on no node.
    result = openb.fill(openb.load_nodes(nodes), pods, load_profile("best-fit"), demand=0.34)
    assert (result["cpu_pods_pending"], result["pods_placed"], result["pods_pending"]) == (2, 2, 0)
    assert result["unallocated_gpus"] == pytest.approx(1.0)


def test_fgd_task_types_include_the_pods_without_gpus(tmp_path: Path) -> None:
    _, trace = write(tmp_path, ["c,8000,1024,0,0,,BE,Running,0,9,0", "a,1000,1024,1,500,,LS,Running,1,9,1"])
    pods, _ = openb.load_pods(trace)
    cpu_type = {"gpus": 0, "share_milli": 0, "cpu_milli": 8000, "memory_mib": 1024, "weight": 1}
    assert cpu_type in openb.task_types(pods)

"""The openb fill experiment: pods fill the cluster in arrival order; what stays free but
unusable by the pods left pending is reported as unallocated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.core import load_profile
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
            "p-cpu,0,0,0,0,,BE,Running,2,9,2",  # no GPU: left out
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
    assert "fgd" not in load_profile("default").plugin_args, "the shipped profile is left alone"
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

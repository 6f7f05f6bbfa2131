"""The simulator's command line refuses bad input with one error line and no result: a wrong
file or option must not become a traceback, or a plausible result of the wrong run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import scheduler.sim.__main__ as cli
from scheduler.sim import load_trace
from scheduler.sim.__main__ import load_vc_quotas, main
from scheduler.sim.cluster import load_topology
from scheduler.sim.engine import Simulator
from scheduler.sim.inputs import InputFileError
from scheduler.sim.openb import main as openb_main

TINY = Path(__file__).parent / "data" / "tiny_itp.csv"
ITP_HEADER = "job_id,submission_time,duration,num_gpu\n"
OPENB_NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,2,T4\n"
OPENB_PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,1000\n"

# Files a case may name as {name}; written into tmp_path before the run.
FILES = {
    "not_csv.txt": "just one line of text\n",
    "not_json.json": "{not json",
    "binary.csv": "",  # written as bytes that are not UTF-8
    "bad_value.csv": ITP_HEADER + "j1,0,100,3\nj2,10,abc,2\n",
    "short_row.csv": ITP_HEADER + "j1,0,100,3\nj2,10\n",
    "no_jobs.csv": ITP_HEADER + "j1,0,100,0\n",
    "quotas_negative.csv": "vc,guaranteed,borrow_limit\na,4,4\nb,-1,4\n",
    "quotas_fraction.csv": "vc,guaranteed,borrow_limit,lending_limit\na,4,4,1.5\n",
    "quotas_twice.csv": "vc,guaranteed,borrow_limit\na,4,4\na,2,2\n",
    "quotas_columns.csv": "name,gpus\na,4\n",
    "topology_list.json": json.dumps([{"name": "n", "gpus": 4}]),
    "topology_gpus.json": json.dumps({"nodes": [{"name": "n", "gpus": 4}, {"name": "m", "gpus": 0}]}),
    "topology_name.json": json.dumps({"nodes": [{"gpus": 4}]}),
    "profile_keys.json": json.dumps({"name": "x", "colour": "blue"}),
    "profile_list.json": json.dumps(["fifo"]),
    "profile_names.json": json.dumps({"name": "x", "plugins": {"queue_sort": "fifo"}}),
    "profile_score.json": json.dumps({"name": "x", "plugins": {"score": [3]}}),
    "profile_cycle.json": json.dumps({"name": "x", "cycle": {"max_victims": "many"}}),
    "openb_nodes.csv": OPENB_NODES,
    "openb_pods.csv": OPENB_PODS,
    "openb_cpu_pods.csv": "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,0,0\n",
    "openb_no_gpu_nodes.csv": "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,0,\n",
}

ITP_RUN = ["--trace", str(TINY), "--format", "itp", "--cluster", "1x4", "--profile", "fifo"]
FILL_RUN = ["--format", "openb", "--profile", "best-fit"]

# (case id, arguments, what stderr must say); {name} is the path of that file of FILES.
CASES = [
    ("trace-missing", ["--trace", "{nope.csv}", *ITP_RUN[2:]], ["nope.csv", "No such file"]),
    ("trace-directory", ["--trace", "{.}", *ITP_RUN[2:]], ["Is a directory"]),
    ("trace-not-utf8", ["--trace", "{binary.csv}", *ITP_RUN[2:]], ["binary.csv", "not a UTF-8 text file"]),
    (
        "trace-philly-columns",
        [*ITP_RUN[:2], "--format", "philly", *ITP_RUN[4:]],
        ["tiny_itp.csv", "format philly", "timestamp, num_gpus, cluster"],
    ),
    (
        "trace-openb-columns",
        [*ITP_RUN[:2], "--format", "openb", *ITP_RUN[4:]],
        ["tiny_itp.csv", "format openb", "scheduled_time"],
    ),
    (
        "trace-itp-columns",
        ["--trace", "{quotas_columns.csv}", *ITP_RUN[2:]],
        ["quotas_columns.csv", "format itp", "job_id, submission_time, duration, num_gpu"],
    ),
    ("trace-bad-value", ["--trace", "{bad_value.csv}", *ITP_RUN[2:]], ["bad_value.csv, line 3", "'abc'"]),
    ("trace-short-row", ["--trace", "{short_row.csv}", *ITP_RUN[2:]], ["short_row.csv, line 3"]),
    ("trace-no-jobs", ["--trace", "{no_jobs.csv}", *ITP_RUN[2:]], ["no_jobs.csv has no GPU jobs"]),
    ("cluster-shape", [*ITP_RUN[:4], "--cluster", "2y4", *ITP_RUN[6:]], ["--cluster must look like 32x4"]),
    ("cluster-empty", [*ITP_RUN[:4], "--cluster", "0x4", *ITP_RUN[6:]], ["at least one node"]),
    ("cluster-none", [*ITP_RUN[:4], *ITP_RUN[6:]], ["give --cluster NxG or --topology FILE"]),
    (
        "cluster-and-topology",
        [*ITP_RUN, "--topology", "{topology_gpus.json}"],
        ["--cluster NxG or --topology FILE, not both"],
    ),
    ("topology-missing", [*ITP_RUN[:4], "--topology", "{nope.json}", *ITP_RUN[6:]], ["nope.json"]),
    (
        "topology-not-json",
        [*ITP_RUN[:4], "--topology", "{not_json.json}", *ITP_RUN[6:]],
        ["not_json.json is not a JSON file"],
    ),
    (
        "topology-no-nodes",
        [*ITP_RUN[:4], "--topology", "{topology_list.json}", *ITP_RUN[6:]],
        ["topology_list.json is not a topology file"],
    ),
    (
        "topology-zero-gpus",
        [*ITP_RUN[:4], "--topology", "{topology_gpus.json}", *ITP_RUN[6:]],
        ["topology_gpus.json, node entry 2: gpus must be"],
    ),
    (
        "topology-no-name",
        [*ITP_RUN[:4], "--topology", "{topology_name.json}", *ITP_RUN[6:]],
        ["node entry 1: it needs at least a name and gpus"],
    ),
    (
        "profile-unknown",
        [*ITP_RUN[:6], "--profile", "nope"],
        ["unknown profile 'nope'", "default, fifo", "or a JSON file"],
    ),
    ("profile-missing-file", [*ITP_RUN[:6], "--profile", "{nope.json}"], ["nope.json", "No such file"]),
    (
        "profile-not-json",
        [*ITP_RUN[:6], "--profile", "{not_csv.txt}"],
        ["profile", "not_csv.txt is not valid", "Expecting"],
    ),
    (
        "profile-invalid",
        [*ITP_RUN[:6], "--profile", "{profile_keys.json}"],
        ["profile_keys.json is not valid", "colour"],
    ),
    (
        "profile-not-an-object",
        [*ITP_RUN[:6], "--profile", "{profile_list.json}"],
        ["profile_list.json is not valid", "must be a JSON object"],
    ),
    (
        "profile-names-not-a-list",
        [*ITP_RUN[:6], "--profile", "{profile_names.json}"],
        ["profile_names.json is not valid", 'plugins.queue_sort must be a list of plugin names, not "fifo"'],
    ),
    (
        "profile-score-entry",
        [*ITP_RUN[:6], "--profile", "{profile_score.json}"],
        ["profile_score.json is not valid", "plugins.score[0]", "not 3"],
    ),
    (
        "profile-cycle-setting",
        [*ITP_RUN[:6], "--profile", "{profile_cycle.json}"],
        ["profile_cycle.json is not valid", 'cycle.max_victims must be a whole number, not "many"'],
    ),
    ("quotas-missing", [*ITP_RUN, "--vc-quotas", "{nope.csv}"], ["nope.csv", "No such file"]),
    (
        "quotas-not-quotas",
        [*ITP_RUN, "--vc-quotas", "{not_csv.txt}"],
        ["not_csv.txt is not a VC quotas file", "vc, guaranteed, borrow_limit"],
    ),
    (
        "quotas-columns",
        [*ITP_RUN, "--vc-quotas", "{quotas_columns.csv}"],
        ["quotas_columns.csv is not a VC quotas file", "no columns vc, guaranteed, borrow_limit"],
    ),
    (
        "quotas-negative",
        [*ITP_RUN, "--vc-quotas", "{quotas_negative.csv}"],
        ["quotas_negative.csv, line 3", "guaranteed must be a whole number", "'-1'"],
    ),
    (
        "quotas-fraction",
        [*ITP_RUN, "--vc-quotas", "{quotas_fraction.csv}"],
        ["quotas_fraction.csv, line 2", "lending_limit must be a whole number", "'1.5'"],
    ),
    (
        "quotas-twice",
        [*ITP_RUN, "--vc-quotas", "{quotas_twice.csv}"],
        ["quotas_twice.csv, line 3", "VC 'a' is listed twice"],
    ),
    ("max-jobs-negative", [*ITP_RUN, "--max-jobs", "-1"], ["--max-jobs", "1 or more", "'-1'"]),
    ("max-jobs-zero", [*ITP_RUN, "--max-jobs", "0"], ["--max-jobs", "1 or more", "'0'"]),
    ("max-jobs-fraction", [*ITP_RUN, "--max-jobs", "2.5"], ["--max-jobs", "whole number", "'2.5'"]),
    ("preempt-overhead-negative", [*ITP_RUN, "--preempt-overhead", "-5"], ["--preempt-overhead", "'-5'"]),
    ("preempt-overhead-nan", [*ITP_RUN, "--preempt-overhead", "nan"], ["--preempt-overhead", "'nan'"]),
    ("spread-after-negative", [*ITP_RUN, "--spread-after", "-1"], ["--spread-after", "0 or more"]),
    ("time-limit-zero", [*ITP_RUN, "--time-limit", "0"], ["--time-limit", "above 0"]),
    ("until-negative", [*ITP_RUN, "--until", "-10"], ["--until", "above 0"]),
    ("until-text", [*ITP_RUN, "--until", "soon"], ["--until", "'soon'"]),
    ("vc-unknown", [*ITP_RUN, "--vc", "nope"], ["--vc nope", "tiny_itp.csv"]),
    (
        "nodes-missing",
        ["--trace", "{openb_pods.csv}", *FILL_RUN, "--nodes", "{nope.csv}"],
        ["nope.csv", "No such file"],
    ),
    (
        "nodes-columns",
        ["--trace", "{openb_pods.csv}", *FILL_RUN, "--nodes", str(TINY)],
        ["tiny_itp.csv is not an openb node list", "sn, cpu_milli, memory_mib, gpu, model"],
    ),
    (
        "nodes-without-gpus",
        ["--trace", "{openb_pods.csv}", *FILL_RUN, "--nodes", "{openb_no_gpu_nodes.csv}"],
        ["openb_no_gpu_nodes.csv has no nodes with GPUs"],
    ),
    (
        "nodes-pods-columns",
        ["--trace", str(TINY), *FILL_RUN, "--nodes", "{openb_nodes.csv}"],
        ["tiny_itp.csv is not an openb pod list", "gpu_milli"],
    ),
    (
        "nodes-cpu-pods-only",
        ["--trace", "{openb_cpu_pods.csv}", *FILL_RUN, "--nodes", "{openb_nodes.csv}"],
        ["openb_cpu_pods.csv has no pods with GPUs"],
    ),
    (
        "nodes-with-cluster",
        ["--trace", "{openb_pods.csv}", *FILL_RUN, "--nodes", "{openb_nodes.csv}", "--cluster", "1x2"],
        ["leave out --cluster and --topology"],
    ),
    (
        "nodes-with-replay-options",
        [
            "--trace",
            "{openb_pods.csv}",
            *FILL_RUN,
            "--nodes",
            "{openb_nodes.csv}",
            "--max-jobs",
            "5",
            "--vc",
            "a",
        ],
        ["the fill experiment (--nodes) does not use --vc, --max-jobs"],
    ),
    (
        # Refused even at the replay's default: the fill has no preemption to charge it to.
        "nodes-with-preempt-overhead",
        [
            "--trace",
            "{openb_pods.csv}",
            *FILL_RUN,
            "--nodes",
            "{openb_nodes.csv}",
            "--preempt-overhead",
            "30",
        ],
        ["the fill experiment (--nodes) does not use --preempt-overhead"],
    ),
    (
        "nodes-with-profile-of-wrong-shape",
        [
            "--trace",
            "{openb_pods.csv}",
            *FILL_RUN[:2],
            "--profile",
            "{profile_score.json}",
            "--nodes",
            "{openb_nodes.csv}",
        ],
        ["profile_score.json is not valid", "plugins.score[0]"],
    ),
    (
        "nodes-demand-zero",
        ["--trace", "{openb_pods.csv}", *FILL_RUN, "--nodes", "{openb_nodes.csv}", "--demand", "0"],
        ["--demand", "above 0"],
    ),
]


def write_files(tmp_path: Path) -> None:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00job_id\x00\x9c\n")


def fill_in(arg: str, tmp_path: Path) -> str:
    if arg.startswith("{") and arg.endswith("}"):
        return str(tmp_path / arg[1:-1])
    return arg


def assert_refused(
    command: Callable[[list[str]], int],
    prog: str,
    args: list[str],
    expected: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command exits 2 with nothing on standard output and, last on standard error, one
    line of its own saying all of `expected`."""
    write_files(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        command([fill_in(arg, tmp_path) for arg in args])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error: ")
    for text in expected:
        assert text in last
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(("args", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_error_line_and_no_result(
    args: list[str], expected: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused(main, "python -m scheduler.sim", args, expected, tmp_path, capsys)


def test_a_file_error_is_one_line_without_the_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["--trace", str(tmp_path / "nope.csv"), *ITP_RUN[2:]])
    assert capsys.readouterr().err.count("\n") == 1


def test_loaders_raise_a_value_error_naming_the_file(tmp_path: Path) -> None:
    """Library callers get the same message as the command line, as a `ValueError`."""
    write_files(tmp_path)
    with pytest.raises(ValueError, match="not a trace of format philly"):
        load_trace(TINY, "philly")
    with pytest.raises(InputFileError, match=r"quotas_twice\.csv, line 3"):
        load_vc_quotas(tmp_path / "quotas_twice.csv")
    with pytest.raises(InputFileError, match="node entry 2"):
        load_topology(tmp_path / "topology_gpus.json")


def test_valid_options_at_their_bounds_still_run(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*ITP_RUN, "--max-jobs", "1", "--preempt-overhead", "0", "--spread-after", "0", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["jobs"] == 1


def test_a_replay_without_preempt_overhead_charges_the_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The option has no argparse default (so the fill can refuse it), but a replay still
    charges 30 seconds per preemption, as `--help` says."""
    given: list[float] = []
    real = cli.Simulator

    def simulator(*args: Any, preempt_overhead_s: float, **kwargs: Any) -> Simulator:
        given.append(preempt_overhead_s)
        return real(*args, preempt_overhead_s=preempt_overhead_s, **kwargs)

    monkeypatch.setattr(cli, "Simulator", simulator)
    assert main([*ITP_RUN, "--json"]) == 0
    assert main([*ITP_RUN, "--preempt-overhead", "5", "--json"]) == 0
    assert given == [30.0, 5.0]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "(default 30)" in " ".join(capsys.readouterr().out.split())


MONTE_CARLO_RUN = ["--trace", "{openb_pods.csv}", "--nodes", "{openb_nodes.csv}", "--profile", "best-fit"]
MONTE_CARLO_CASES = [
    ("trace-missing", ["--trace", "{nope.csv}", *MONTE_CARLO_RUN[2:]], ["nope.csv", "No such file"]),
    (
        "nodes-columns",
        [*MONTE_CARLO_RUN[:2], "--nodes", str(TINY), *MONTE_CARLO_RUN[4:]],
        ["tiny_itp.csv is not an openb node list"],
    ),
    (
        "nodes-without-gpus",
        [*MONTE_CARLO_RUN[:2], "--nodes", "{openb_no_gpu_nodes.csv}", *MONTE_CARLO_RUN[4:]],
        ["openb_no_gpu_nodes.csv has no nodes with GPUs"],
    ),
    (
        "pods-without-gpus",
        ["--trace", "{openb_cpu_pods.csv}", *MONTE_CARLO_RUN[2:]],
        ["openb_cpu_pods.csv has no pods with GPUs"],
    ),
    ("profile-unknown", [*MONTE_CARLO_RUN[:4], "--profile", "nope"], ["unknown profile 'nope'"]),
    (
        "profile-wrong-shape",
        [*MONTE_CARLO_RUN[:4], "--profile", "{profile_names.json}"],
        ["profile_names.json is not valid", "plugins.queue_sort"],
    ),
    ("seeds-text", [*MONTE_CARLO_RUN, "--seeds", "1,x"], ["--seeds", "'1,x'"]),
    ("ratio-zero", [*MONTE_CARLO_RUN, "--ratio", "0"], ["--ratio", "above 0"]),
    ("demand-negative", [*MONTE_CARLO_RUN, "--demand", "-1"], ["--demand", "above 0"]),
]


@pytest.mark.parametrize(
    ("args", "expected"),
    [case[1:] for case in MONTE_CARLO_CASES],
    ids=[case[0] for case in MONTE_CARLO_CASES],
)
def test_the_monte_carlo_fill_refuses_bad_input_the_same_way(
    args: list[str], expected: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused(openb_main, "python -m scheduler.sim.openb", args, expected, tmp_path, capsys)

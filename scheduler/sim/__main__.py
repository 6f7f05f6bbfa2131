"""Command line of the simulator (a stable contract: benchmarks and docs call it).

    python -m scheduler.sim --trace PATH --format itp|philly|openb --cluster NxG
        [--topology FILE] --profile NAME|FILE [--vc-quotas FILE]
        [--preempt-overhead SECONDS] [--vc NAME] [--until SECONDS] [--time-limit SECONDS]
        [--max-jobs N] [--spread-after SECONDS] --json
    python -m scheduler.sim --trace PODS.csv --format openb --nodes NODES.csv --profile NAME
        [--demand FACTOR] --json

Prints one JSON object (the last line of output) with the figures of `metrics.summarize`, or
with `--nodes` those of the openb fill experiment (`openb.fill`: unallocated_gpus,
allocated_gpu_ratio).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from scheduler.sim import openb
from scheduler.sim.cluster import load_topology, parse_cluster_spec, uniform_cluster
from scheduler.sim.engine import Simulator, VcQuotaRow
from scheduler.sim.inputs import fail, number_option, read_csv, read_profile, refused_by
from scheduler.sim.metrics import summarize
from scheduler.sim.trace import FORMATS, load_trace

QUOTA_COLUMNS = ("vc", "guaranteed", "borrow_limit")
# Applied by the replay rather than by argparse, so that the fill (--nodes), which has no
# preemption, can tell a given --preempt-overhead from the default and refuse it.
PREEMPT_OVERHEAD_S = 30.0


def load_vc_quotas(path: str | Path) -> dict[str, VcQuotaRow]:
    """CSV `vc,guaranteed,borrow_limit[,lending_limit]` (one row per VC; GPUs of any model).
    An empty or missing lending limit lends the whole guarantee. Raises `InputFileError` for
    a file that is not such a CSV, a bad number, or a VC listed twice (one row would be lost)."""
    quotas: dict[str, VcQuotaRow] = {}
    with read_csv(
        path, QUOTA_COLUMNS, "a VC quotas file (vc,guaranteed,borrow_limit[,lending_limit])"
    ) as rows:
        for row in rows:
            vc = row["vc"].strip()
            if not vc:
                raise ValueError("the vc is empty")
            if vc in quotas:
                raise ValueError(f"VC {vc!r} is listed twice")
            lending = (row.get("lending_limit") or "").strip()
            quotas[vc] = (
                gpu_count(row["guaranteed"], "guaranteed"),
                gpu_count(row["borrow_limit"], "borrow_limit"),
                gpu_count(lending, "lending_limit") if lending else None,
            )
    return quotas


def gpu_count(text: str, column: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f"{column} must be a whole number of GPUs, 0 or more, not {text.strip()!r}")
    return count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", required=True, help="trace CSV file")
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument("--cluster", help="NxG: N nodes of G GPUs (default topology)")
    parser.add_argument("--topology", help="topology JSON file (instead of --cluster)")
    parser.add_argument(
        "--profile", required=True, help="profile name (fifo, tiresias, default) or JSON file"
    )
    parser.add_argument("--vc-quotas", help="CSV vc,guaranteed,borrow_limit[,lending_limit]")
    parser.add_argument(
        "--preempt-overhead",
        type=number_option(0),
        help=f"seconds a preempted job holds its GPUs while it checkpoints (default {PREEMPT_OVERHEAD_S:g})",
    )
    parser.add_argument("--vc", help="replay only this VC's jobs")
    parser.add_argument(
        "--time-limit", type=number_option(0, above=True), help="time limit given to every job (seconds)"
    )
    parser.add_argument(
        "--spread-after",
        type=number_option(0),
        help="a job of several GPUs that waited this many seconds may be spread as 1-GPU replicas",
    )
    parser.add_argument("--max-jobs", type=number_option(1, whole=True), help="replay only the first N jobs")
    parser.add_argument(
        "--until",
        type=number_option(0, above=True),
        help="replay only jobs submitted before this many seconds after the first",
    )
    parser.add_argument("--nodes", help="openb node list CSV: run the fill experiment on those nodes")
    parser.add_argument(
        "--demand",
        type=number_option(0, above=True),
        default=1.0,
        help="fill experiment: pods arrive until they ask for this many times the cluster's GPUs",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args(argv)

    if args.cluster and args.topology:
        parser.error("give --cluster NxG or --topology FILE, not both")
    if args.nodes:
        if args.format != "openb":
            parser.error("--nodes is for --format openb (the fill experiment)")
        if args.cluster or args.topology:
            parser.error(
                "--nodes gives the cluster of the fill experiment: leave out --cluster and --topology"
            )
        replay_only = [
            option
            for option, value in (
                ("--vc-quotas", args.vc_quotas),
                ("--preempt-overhead", args.preempt_overhead),
                ("--vc", args.vc),
                ("--time-limit", args.time_limit),
                ("--spread-after", args.spread_after),
                ("--max-jobs", args.max_jobs),
                ("--until", args.until),
            )
            if value is not None
        ]
        if replay_only:
            parser.error(f"the fill experiment (--nodes) does not use {', '.join(replay_only)}")
        started = time.perf_counter()
        with refused_by(parser):
            pods, skipped = openb.load_pods(args.trace)
            fill_nodes = openb.load_nodes(args.nodes)
            profile = read_profile(args.profile)
        summary = openb.fill(fill_nodes, pods, profile, args.demand)
        wall_s = round(time.perf_counter() - started, 2)
        summary.update(skipped_rows=skipped, profile=args.profile, wall_s=wall_s)
        sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
        return 0

    if not (args.cluster or args.topology):
        parser.error("give --cluster NxG or --topology FILE")
    if args.cluster:
        try:
            nodes = uniform_cluster(*parse_cluster_spec(args.cluster))
        except ValueError as error:
            parser.error(str(error))
    with refused_by(parser):
        if args.topology:
            nodes = load_topology(args.topology)
        trace = load_trace(args.trace, args.format)
        quotas = load_vc_quotas(args.vc_quotas) if args.vc_quotas else None
        profile = read_profile(args.profile)
    if not trace.jobs:
        fail(parser, f"{args.trace} has no GPU jobs to replay ({trace.skipped} rows skipped)")
    if args.vc and all(job.vc != args.vc for job in trace.jobs):
        fail(parser, f"--vc {args.vc}: no job of {args.trace} is in that VC")
    jobs = list(trace.jobs)
    if args.until is not None:
        # The window is measured on the whole trace, so a VC replayed alone gets the same jobs.
        start = jobs[0].submit
        jobs = [j for j in jobs if j.submit - start < args.until]
    if args.vc:
        jobs = [j for j in jobs if j.vc == args.vc]
    if args.max_jobs:
        jobs = jobs[: args.max_jobs]
    started = time.perf_counter()
    result = Simulator(
        nodes,
        profile,
        jobs,
        vc_quotas=quotas,
        preempt_overhead_s=PREEMPT_OVERHEAD_S if args.preempt_overhead is None else args.preempt_overhead,
        time_limit_s=args.time_limit,
        spread_after_s=args.spread_after,
    ).run()
    summary = summarize(result)
    summary["skipped_rows"] = trace.skipped
    summary["profile"] = args.profile
    summary["wall_s"] = round(time.perf_counter() - started, 2)
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

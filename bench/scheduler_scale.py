"""Cycle latency of the scheduling core at scale, against a FIFO first-fit reference.

    python -m bench.scheduler_scale [--json] [--repeat N] [--profile NAME]

Scenarios (all in process, no database, one core):
- 10,000 pending jobs on 125 nodes x 8 GPUs,
- 50,000 pending jobs on 2,000 nodes x 8 GPUs,
- the 10,000-job queue on 250 nodes (twice the nodes) for the growth per doubling.
The cluster is 90 % busy with running jobs of 1/2/4/8 GPUs (a steady state: most of the
queue cannot start), pending jobs ask for 1/2/4/8 GPUs (some as 2-replica gangs) in 8 VCs
with quotas and borrowing, 40 users. Each scenario reports the median and worst `decide` time
over N repeats (CPU time of this process, and wall time; the 50,000-job scenario N // 2),
the reference's time over the same queue and free GPUs, their ratio, and the peak memory
of one cycle (tracemalloc, measured in a separate pass so it does not slow the timed runs).
The two 10,000-job scenarios are timed in turns, call by call, so the growth between them
does not depend on how the machine's speed drifted between two blocks of runs. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from scheduler.core import (
    FinishedService,
    Gpu,
    JobId,
    Node,
    NodeName,
    PendingJob,
    Profile,
    Quota,
    ReplicaPlacement,
    RunningJob,
    Snapshot,
    UserName,
    VcName,
    VirtualCluster,
    decide,
    load_profile,
)
from scheduler.core.service_history import FINISHED_PER_WIDTH

SIZES = (1, 2, 4, 8)


def build_snapshot(nodes: int, pending: int, busy: float = 0.9, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    node_list = tuple(
        Node(
            NodeName(f"node{i:05d}"),
            tuple(Gpu(g, "A100", f"GPU-{i}-{g}", 81920, g // 4, g // 2, g // 4) for g in range(8)),
            rack=f"rack{i // 16}",
        )
        for i in range(nodes)
    )
    vc_names = [f"vc{k}" for k in range(8)]
    capacity = nodes * 8
    vcs = tuple(
        VirtualCluster(
            VcName(v), (Quota("A100", capacity // 8, capacity // 4),), max_gpus_per_user=capacity // 16
        )
        for v in vc_names
    )
    running: list[RunningJob] = []
    target = int(capacity * busy)
    used = 0
    n = 0
    for i in range(nodes):
        free = list(range(8))
        while free and used < target:
            size = rng.choice([s for s in SIZES if s <= len(free)])
            take = tuple(free[:size])
            free = free[size:]
            used += size
            running.append(
                RunningJob(
                    JobId(f"r{n}"),
                    VcName(vc_names[n % 8]),
                    UserName(f"user{n % 40}"),
                    (ReplicaPlacement(NodeName(f"node{i:05d}"), take),),
                    started_at=float(rng.randint(0, 80_000)),
                    attained_gpu_s=float(rng.randint(0, 500_000)),
                    estimated_runtime_s=float(rng.randint(600, 90_000)),
                    priority=rng.choice([0, 100, 500]),
                )
            )
            n += 1
    queue = tuple(
        PendingJob(
            JobId(f"p{k}"),
            VcName(vc_names[k % 8]),
            UserName(f"user{k % 40}"),
            replicas=2 if k % 20 == 0 else 1,
            gpus_per_replica=rng.choice(SIZES),
            submitted_at=float(k),
            priority=rng.choice([0, 100, 500]),
            estimated_runtime_s=float(rng.randint(600, 90_000)) if k % 3 else None,
            attained_gpu_s=float(rng.choice([0, 0, 0, rng.randint(0, 200_000)])),
        )
        for k in range(pending)
    )
    # The history the portal hands the core (its last FINISHED_PER_WIDTH ended jobs of each
    # width: here as many in all, of widths drawn at random), heavy-tailed.
    finished = FinishedService(
        tuple(
            (size, size * rng.lognormvariate(8.0, 2.0))
            for size in (rng.choice(SIZES) for _ in range(FINISHED_PER_WIDTH * len(SIZES)))
        )
    )
    return Snapshot(node_list, vcs, tuple(running), queue, finished=finished)


def fifo_first_fit(snapshot: Snapshot) -> int:
    """The reference: FIFO order, each replica on the first node with room. No quotas, no
    topology, no reasons or estimates; a count of nodes per free-GPU level skips jobs that
    cannot fit without scanning the nodes. Returns the number of jobs started."""
    free: list[int] = []
    index = {}
    for i, node in enumerate(snapshot.nodes):
        index[node.name] = i
        free.append(len(node.gpus))
    for job in snapshot.running:
        for replica in job.placement:
            free[index[replica.node]] -= len(replica.gpu_indices)
    width = max(free, default=0) + 1
    nodes_with = [0] * (width + 8)
    for f in free:
        nodes_with[f] += 1
    started = 0
    for job in sorted(snapshot.pending, key=lambda j: (j.submitted_at, j.id)):
        k = job.gpus_per_replica
        if sum(nodes_with[f] * (f // k) for f in range(k, width)) < job.replicas:
            continue
        chosen: list[int] = []
        for _ in range(job.replicas):
            for i, f in enumerate(free):
                if f >= k:
                    nodes_with[f] -= 1
                    free[i] -= k
                    nodes_with[f - k] += 1
                    chosen.append(i)
                    break
        started += 1
    return started


def timed(fns: Sequence[Callable[[], Any]], repeat: int) -> list[tuple[list[float], list[float]]]:
    """Wall and CPU seconds per call of each function, the functions taking turns.

    CPU time (process_time) is what one core spent, which stays meaningful when other
    processes share the machine; wall time is reported too. Taking turns puts any drift of
    the machine's speed during the run (clock scaling, a neighbour) on every function alike,
    so a ratio between them measures the code, not when each block happened to run."""
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in fns]
    for _ in range(repeat):
        for fn, (wall, cpu) in zip(fns, times, strict=True):
            gc.collect()
            w, c = time.perf_counter(), time.process_time()
            fn()
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
    return times


def scenarios(
    sizes: Sequence[tuple[int, int]], profile: Profile, repeat: int, memory: bool
) -> list[dict[str, Any]]:
    """One result per (nodes, pending) size; the sizes' cycles and references take turns."""
    snapshots = [build_snapshot(nodes, pending) for nodes, pending in sizes]
    plans = [decide(snapshot, profile, 100_000.0) for snapshot in snapshots]
    ours = timed([partial(decide, snapshot, profile, 100_000.0) for snapshot in snapshots], repeat)
    reference = timed([partial(fifo_first_fit, snapshot) for snapshot in snapshots], repeat)
    results = []
    for (nodes, pending), snapshot, plan, (ours_wall, ours_cpu), (_, ref_cpu) in zip(
        sizes, snapshots, plans, ours, reference, strict=True
    ):
        result: dict[str, Any] = {
            "nodes": nodes,
            "gpus": nodes * 8,
            "running_jobs": len(snapshot.running),
            "pending_jobs": pending,
            "started": len(plan.starts),
            "preempted": len(plan.preemptions),
            "cycle_cpu_ms_p50": round(statistics.median(ours_cpu) * 1000, 1),
            "cycle_cpu_ms_max": round(max(ours_cpu) * 1000, 1),
            "cycle_wall_ms_p50": round(statistics.median(ours_wall) * 1000, 1),
            "fifo_first_fit_cpu_ms_p50": round(statistics.median(ref_cpu) * 1000, 1),
            "ratio_to_fifo_first_fit": round(statistics.median(ours_cpu) / statistics.median(ref_cpu), 2),
        }
        if memory:
            gc.collect()
            tracemalloc.start()
            decide(snapshot, profile, 100_000.0)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            result["cycle_peak_mib"] = round(peak / 2**20, 1)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--profile", default="default")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)

    small, doubled = scenarios([(125, 10_000), (250, 10_000)], profile, args.repeat, memory=True)
    (large,) = scenarios([(2_000, 50_000)], profile, max(args.repeat // 2, 2), memory=True)
    summary = {
        "profile": args.profile,
        "python": sys.version.split()[0],
        "s1_10k_pending_125x8": small,
        "s1_10k_pending_250x8": doubled,
        "s1_50k_pending_2000x8": large,
        "growth_when_nodes_double": round(doubled["cycle_cpu_ms_p50"] / small["cycle_cpu_ms_p50"], 2),
        "goals": {
            "cycle_cpu_ms_10k_125x8": 100,
            "cycle_cpu_ms_50k_2000x8": 1000,
            "growth_when_nodes_double": 1.3,
            "peak_mib_50k": 1024,
        },
    }
    if not args.json:
        for key in ("s1_10k_pending_125x8", "s1_10k_pending_250x8", "s1_50k_pending_2000x8"):
            print(key, summary[key])
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The openb fill experiment (Weng et al., "Beware of Fragmentation", ATC'23).

Pods of the Alibaba openb trace arrive and never leave; each batch of arrivals is one
scheduling cycle of the core. Arrivals go on (cycling through the list) until the GPUs they
asked for add up to `demand` times the cluster's GPUs. The order is the trace's creation
order, or with `sample(..., seed)` the paper's Monte-Carlo workload: the trace's pods plus
pods drawn from it at random (with replacement) until they ask for 1.3 times the cluster's
GPUs, shuffled. As in the paper every pod is placed by scoring every node (of any GPU model),
whatever the profile's candidate limit and model order for a live cluster. Then:

- `allocated_gpu_ratio`: GPUs handed out (shares as their fraction) over all GPUs;
- `free_gpus`: GPUs not handed out; with `demand` 1.0 this is the paper's "unallocated GPUs"
  when the arrived workload reaches the cluster's GPU capacity (arrived minus placed);
- `unallocated_gpus`: free GPU capacity that no pod left pending could use: on every GPU with
  free capacity, none of the pending pods' shapes fits (the share does not fit the room left,
  a whole-GPU pod finds too few whole free GPUs on the node, or the node lacks CPU or memory).
  That is capacity lost to fragmentation, the figure FGD reduces.

FGD's target workload: when the profile uses `fgd` and gives it no `workload`, the fill gives
it the task types of the pods it replays and how often each occurs, pods without GPUs
included (as the paper takes its typical pods from the trace it replays, CPU-only ones too).

Pods without GPUs (CPU and memory only) are replayed too, in their place in the arrival
order, as the paper places them on the GPU nodes: they count for no GPU demand but take the
CPU and memory GPU pods may need. The core's cycle places GPU work only, so the fill places
such a pod itself, by the profile's share chooser (the policy for work that takes no whole
GPU): `best_fit_share` puts it on the node that keeps least CPU and GPU, `fgd` where it
strands least free GPU capacity (`choose_node` of each). It then holds its CPU and memory as
a running job with no GPUs. Every pod belongs to one VC and one tenant, whose guarantee is
the whole cluster, so quotas never bind.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scheduler.core import (
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
)
from scheduler.core.framework import CycleContext
from scheduler.core.plugins.sharing import WHOLE, node_free_vector
from scheduler.core.state import build_state
from scheduler.sim.inputs import InputFileError, number_option, read_csv, read_profile, refused_by

VC = VcName("openb")
USER = UserName("openb")


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int  # whole GPUs; 1 for a fractional pod; 0 for a pod without GPUs
    share_milli: int  # 0 = whole GPUs (or none)

    @property
    def demand_milli(self) -> int:
        return self.share_milli or self.gpus * WHOLE

    @property
    def cpu_only(self) -> bool:
        return self.gpus <= 0


NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
# creation_time may be missing: the pods then arrive in the order of the list (as in the
# published openb_pod_list_multigpu50.csv).
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def load_nodes(path: str | Path) -> tuple[Node, ...]:
    """`sn,cpu_milli,memory_mib,gpu,model` rows; nodes without GPUs are left out. Raises
    `InputFileError` for a file that is not such a node list, has a bad value or no node with
    GPUs (there would be nothing to fill)."""
    nodes = []
    with read_csv(path, NODE_COLUMNS, "an openb node list") as rows:
        for row in rows:
            count = int(row["gpu"] or 0)
            if count <= 0:
                continue
            name = row["sn"]
            nodes.append(
                Node(
                    NodeName(name),
                    tuple(Gpu(i, row["model"], uuid=f"{name}-{i}") for i in range(count)),
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                )
            )
    if not nodes:
        raise InputFileError(f"{path} has no nodes with GPUs")
    return tuple(nodes)


def load_pods(path: str | Path, cpu_pods: bool = True) -> tuple[list[Pod], int]:
    """Pods in creation order, and how many rows were left out: pods that ask for nothing
    (no GPU, CPU or memory), and with `cpu_pods` false every pod without GPUs. Raises
    `InputFileError` for a file that is not an openb pod list, has a bad value or no pod with
    GPUs (the fill would place nothing it measures)."""
    rows: list[tuple[float, int, Pod]] = []
    skipped = 0
    with read_csv(path, POD_COLUMNS, "an openb pod list") as pod_rows:
        for position, row in enumerate(pod_rows):
            gpus = max(int(row["num_gpu"] or 0), 0)
            cpu, memory = int(row["cpu_milli"] or 0), int(row["memory_mib"] or 0)
            if gpus == 0 and (not cpu_pods or (cpu <= 0 and memory <= 0)):
                skipped += 1
                continue
            milli = int(row["gpu_milli"] or WHOLE)
            share = milli if gpus == 1 and 0 < milli < WHOLE else 0
            created = float(row.get("creation_time") or 0)
            pod = Pod(row["name"], cpu, memory, gpus, share)
            rows.append((created, position, pod))
    if all(pod.cpu_only for _, _, pod in rows):
        raise InputFileError(f"{path} has no pods with GPUs to place")
    rows.sort(key=lambda r: (r[0], r[1]))
    return [pod for _, _, pod in rows], skipped


def task_types(pods: Sequence[Pod]) -> list[dict[str, int]]:
    """The pods' task types (GPUs, share, CPU, memory) and how many pods have each: the
    workload FGD's fragmentation is measured against."""
    counts = Counter((0 if p.share_milli else p.gpus, p.share_milli, p.cpu_milli, p.memory_mib) for p in pods)
    return [
        {"gpus": gpus, "share_milli": share, "cpu_milli": cpu, "memory_mib": memory, "weight": n}
        for (gpus, share, cpu, memory), n in sorted(counts.items())
    ]


def sample(pods: Sequence[Pod], gpus: int, seed: int, ratio: float = 1.3) -> list[Pod]:
    """The paper's Monte-Carlo workload: every pod of the trace, plus pods drawn from it at
    random until the next one would take the demand past `ratio` times `gpus`, shuffled."""
    rng = random.Random(seed)
    out = list(pods)
    total = sum(p.demand_milli for p in out)
    while pods:
        pod = pods[rng.randrange(len(pods))]
        if total + pod.demand_milli > ratio * gpus * WHOLE:
            break
        out.append(pod)
        total += pod.demand_milli
    rng.shuffle(out)
    return out


def with_trace_workload(profile: Profile, pods: Sequence[Pod]) -> Profile:
    """The profile with `fgd` measuring fragmentation against the pods' task types, unless
    the profile gives it a workload of its own or does not use it."""
    uses_fgd = profile.share_chooser == "fgd" or any(name == "fgd" for name, _ in profile.score)
    if not uses_fgd or "workload" in profile.plugin_args.get("fgd", {}):
        return profile
    args = {name: dict(values) for name, values in profile.plugin_args.items()}
    args.setdefault("fgd", {})["workload"] = task_types(pods)
    return replace(profile, plugin_args=args)


def place_cpu_only(
    nodes: tuple[Node, ...],
    vcs: tuple[VirtualCluster, ...],
    running: list[RunningJob],
    pods: Sequence[tuple[JobId, Pod]],
    profile: Profile,
) -> list[JobId]:
    """Place pods without GPUs one after the other by the profile's share chooser; each
    placed one is appended to `running` as a job holding CPU and memory on no GPU. Returns
    the ids of those that found no node with room."""
    snapshot = Snapshot(nodes, vcs, tuple(running), ())
    state, _ = build_state(snapshot)
    ctx = CycleContext(snapshot=snapshot, now=0.0, state=state, running_by_id={}, borrowed_gpus={})
    chooser = profile.build().share_chooser
    prepare = getattr(chooser, "prepare", None)
    if prepare is not None:
        prepare(ctx)
    choose_node = getattr(chooser, "choose_node", None)
    if choose_node is None:
        raise ValueError(f"share chooser {profile.share_chooser!r} cannot place pods without GPUs")
    unplaced: list[JobId] = []
    for job_id, pod in pods:
        job = PendingJob(
            job_id,
            VC,
            USER,
            replicas=1,
            gpus_per_replica=0,
            submitted_at=0.0,
            cpu_milli_per_replica=pod.cpu_milli,
            memory_mib_per_replica=pod.memory_mib,
            preemptible=False,
        )
        room = [
            slot
            for slot in state.nodes
            if slot.usable
            and (slot.cpu_free is None or slot.cpu_free >= pod.cpu_milli)
            and (slot.memory_free is None or slot.memory_free >= pod.memory_mib)
        ]
        slot = choose_node(job, room, ctx)
        if slot is None:
            unplaced.append(job_id)
            continue
        # The working state is this function's own: charge the node for the next pod.
        if slot.cpu_free is not None:
            slot.cpu_free -= pod.cpu_milli
        if slot.memory_free is not None:
            slot.memory_free -= pod.memory_mib
        running.append(
            RunningJob(
                job_id,
                VC,
                USER,
                (ReplicaPlacement(slot.node.name, ()),),
                started_at=0.0,
                preemptible=False,
                cpu_milli_per_replica=pod.cpu_milli,
                memory_mib_per_replica=pod.memory_mib,
            )
        )
    return unplaced


def fill(
    nodes: tuple[Node, ...], pods: Sequence[Pod], profile: Profile, demand: float = 1.0, batch: int = 64
) -> dict[str, Any]:
    if not any(not pod.cpu_only for pod in pods):
        raise ValueError("the trace has no GPU pods")
    capacity = sum(1 for node in nodes for gpu in node.gpus if gpu.healthy)
    vcs = (VirtualCluster(VC, (Quota("*", capacity, 0),), tenant="openb"),)
    # A fill needs placements only: no estimates or hints, no clock (every pod starts at 0).
    # As in the paper every node is scored for every pod, of every GPU model (the pods take
    # any model), whatever the profile's limits for a live cluster.
    quiet = replace(
        with_trace_workload(profile, pods),
        cycle=replace(
            profile.cycle,
            estimate_starts=False,
            whatif_max_jobs=0,
            max_candidates=max(len(nodes), 1),
            any_model="best",
        ),
    )
    running: list[RunningJob] = []
    pending_left: list[Pod] = []
    arrived_milli = arrivals = cycles = cpu_arrived = cpu_pending = 0
    target = demand * capacity * WHOLE
    while arrived_milli < target:
        # Pods without GPUs in a row are placed at once, in their turn; GPU pods go to the
        # core's cycle up to `batch` at a time, a batch ending where a pod without GPUs comes.
        cpu_chunk: list[tuple[JobId, Pod]] = []
        while arrived_milli < target and pods[arrivals % len(pods)].cpu_only:
            pod = pods[arrivals % len(pods)]
            cpu_chunk.append((JobId(f"{pod.name}/{arrivals}"), pod))
            arrivals += 1
        if cpu_chunk:
            cpu_arrived += len(cpu_chunk)
            cpu_pending += len(place_cpu_only(nodes, vcs, running, cpu_chunk, quiet))
        chunk: list[tuple[JobId, Pod]] = []
        while len(chunk) < batch and arrived_milli < target and not pods[arrivals % len(pods)].cpu_only:
            pod = pods[arrivals % len(pods)]
            chunk.append((JobId(f"{pod.name}/{arrivals}"), pod))
            arrived_milli += pod.demand_milli
            arrivals += 1
        if not chunk:
            continue
        pending = tuple(
            PendingJob(
                job_id,
                VC,
                USER,
                replicas=1,
                gpus_per_replica=pod.gpus,
                submitted_at=float(arrivals - len(chunk) + k),
                cpu_milli_per_replica=pod.cpu_milli,
                memory_mib_per_replica=pod.memory_mib,
                preemptible=False,
                gpu_share_milli=pod.share_milli,
            )
            for k, (job_id, pod) in enumerate(chunk)
        )
        plan = decide(Snapshot(nodes, vcs, tuple(running), pending), quiet, 0.0)
        cycles += 1
        by_id = dict(chunk)
        for start in plan.starts:
            pod = by_id.pop(start.job_id)
            running.append(
                RunningJob(
                    start.job_id,
                    VC,
                    USER,
                    start.placement,
                    started_at=0.0,
                    preemptible=False,
                    cpu_milli_per_replica=pod.cpu_milli,
                    memory_mib_per_replica=pod.memory_mib,
                    gpu_share_milli=start.gpu_share_milli,
                )
            )
        pending_left.extend(by_id.values())
    allocated_milli = sum(job.gpu_share_milli or job.gpus * WHOLE for job in running)
    cpu_placed = cpu_arrived - cpu_pending
    return {
        "gpus": capacity,
        "nodes": len(nodes),
        "pods_arrived": arrivals,
        "pods_placed": len(running) - cpu_placed,  # GPU pods
        "pods_pending": len(pending_left),  # GPU pods
        "cpu_pods_arrived": cpu_arrived,
        "cpu_pods_placed": cpu_placed,
        "cpu_pods_pending": cpu_pending,
        "arrived_gpu_demand": round(arrived_milli / WHOLE, 1),
        "allocated_gpu_ratio": round(allocated_milli / (capacity * WHOLE), 4),
        "free_gpus": round(capacity - allocated_milli / WHOLE, 1),
        "unallocated_gpus": round(unallocated_milli(nodes, vcs, running, pending_left) / WHOLE, 1),
        "cycles": cycles,
    }


def unallocated_milli(
    nodes: tuple[Node, ...],
    vcs: tuple[VirtualCluster, ...],
    running: Sequence[RunningJob],
    pending: Sequence[Pod],
) -> int:
    """Free GPU capacity (thousandths) that none of the pending pods' shapes could use."""
    state, _ = build_state(Snapshot(nodes, vcs, tuple(running), ()))
    shapes = sorted(
        {
            (0 if p.share_milli else p.gpus, p.share_milli, p.cpu_milli, p.memory_mib)
            for p in pending
            if not p.cpu_only  # a pod without GPUs uses no GPU capacity
        }
    )
    lost = 0
    for slot in state.nodes:
        if not slot.usable:
            continue
        free = node_free_vector(slot)
        whole_free = sum(1 for f in free if f >= WHOLE)
        cpu = slot.cpu_free if slot.cpu_free is not None else float("inf")
        memory = slot.memory_free if slot.memory_free is not None else float("inf")
        fitting = [s for s in shapes if s[2] <= cpu and s[3] <= memory]
        for room in free:
            if room <= 0:
                continue
            usable = any(
                (share and room >= share) or (not share and room >= WHOLE and whole_free >= gpus)
                for gpus, share, _, _ in fitting
            )
            if not usable:
                lost += room
    return lost


def seed_list(text: str) -> list[int]:
    """An argparse `type=` for `--seeds`: whole numbers separated by commas."""
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be whole numbers separated by commas, not {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m scheduler.sim.openb`: the fill on the paper's Monte-Carlo workloads, one
    JSON line per seed and one with the mean over them."""
    parser = argparse.ArgumentParser(prog="python -m scheduler.sim.openb", description=main.__doc__)
    parser.add_argument("--trace", required=True, help="openb pod list CSV")
    parser.add_argument("--nodes", required=True, help="openb node list CSV")
    parser.add_argument("--profile", required=True, help="profile name or JSON file")
    parser.add_argument("--seeds", type=seed_list, default="42", help="comma-separated seeds (default 42)")
    parser.add_argument(
        "--ratio",
        type=number_option(0, above=True),
        default=1.3,
        help="inflation of the workload (default 1.3)",
    )
    parser.add_argument(
        "--demand",
        type=number_option(0, above=True),
        default=1.0,
        help="arrivals stop at this times the GPUs",
    )
    parser.add_argument(
        "--gpu-pods-only", action="store_true", help="leave out the pods without GPUs (replayed by default)"
    )
    args = parser.parse_args(argv)
    with refused_by(parser):
        nodes = load_nodes(args.nodes)
        pods, _ = load_pods(args.trace, cpu_pods=not args.gpu_pods_only)
        profile = with_trace_workload(read_profile(args.profile), pods)
    gpus = sum(1 for node in nodes for gpu in node.gpus if gpu.healthy)
    keys = (
        "unallocated_gpus",
        "free_gpus",
        "allocated_gpu_ratio",
        "pods_placed",
        "pods_pending",
        "cpu_pods_placed",
        "cpu_pods_pending",
    )
    runs = []
    for seed in args.seeds:
        started = time.perf_counter()
        summary = fill(nodes, sample(pods, gpus, seed, args.ratio), profile, args.demand)
        summary.update(seed=seed, profile=args.profile, wall_s=round(time.perf_counter() - started, 2))
        sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
        runs.append(summary)
    mean = {key: round(sum(r[key] for r in runs) / len(runs), 4) for key in keys}
    mean.update(seeds=len(runs), profile=args.profile)
    sys.stdout.write(json.dumps(mean, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Figures of a replay. Percentiles are nearest-rank, as in the traces' README."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scheduler.sim.engine import SimJob, SimResult


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(math.ceil(p / 100.0 * len(ordered)), 1)
    return ordered[rank - 1]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def within_2x(estimate_wait: float | None, actual_wait: float) -> bool:
    if estimate_wait is None:
        return False
    return actual_wait / 2.0 <= estimate_wait <= actual_wait * 2.0


def summarize(result: SimResult) -> dict[str, Any]:
    done = [j for j in result.jobs if j.finished_at is not None]
    jct = [j.finished_at - j.trace.submit for j in done if j.finished_at is not None]
    queue = [_queue_delay(j) for j in done]
    submits = [j.trace.submit for j in result.jobs]
    finishes = [j.finished_at for j in done if j.finished_at is not None]
    waited = [j for j in result.jobs if j.first_start is not None and j.first_start > j.trace.submit]
    est_hits = sum(
        within_2x(
            None if j.estimated_start is None else j.estimated_start - j.trace.submit,
            (j.first_start or 0.0) - j.trace.submit,
        )
        for j in waited
    )
    base_hits = sum(
        within_2x(
            None if j.baseline_start is None else j.baseline_start - j.trace.submit,
            (j.first_start or 0.0) - j.trace.submit,
        )
        for j in waited
    )
    per_vc: dict[str, dict[str, float | int]] = {}
    for vc in sorted({j.trace.vc for j in result.jobs}):
        vc_done = [j for j in done if j.trace.vc == vc]
        per_vc[vc] = {
            "jobs": len([j for j in result.jobs if j.trace.vc == vc]),
            "jobs_completed": len(vc_done),
            "avg_queue_s": round(_mean([_queue_delay(j) for j in vc_done]), 1),
            "avg_jct_s": round(_mean([(j.finished_at or 0.0) - j.trace.submit for j in vc_done]), 1),
        }
        if result.guarantees is not None:
            # For the comparison with the VC replayed alone on its guarantee, where jobs wider
            # than the guarantee cannot run: the same jobs left out here, and counted.
            guarantee = result.guarantees.get(vc, 0)
            fitting = [j for j in vc_done if j.gpus <= guarantee]
            per_vc[vc]["guaranteed_gpus"] = guarantee
            per_vc[vc]["jobs_wider_than_guarantee"] = len(
                [j for j in result.jobs if j.trace.vc == vc and j.gpus > guarantee]
            )
            per_vc[vc]["avg_queue_s_within_guarantee"] = round(_mean([_queue_delay(j) for j in fitting]), 1)
    # Jobs at least one full node wide: the ones fragmentation keeps waiting.
    gangs = [j for j in done if result.node_gpus and j.gpus >= result.node_gpus]
    short = [j for j in done if j.trace.duration < 3600]  # under an hour of run time
    work_gpu_s = sum(j.trace.duration * j.gpus for j in result.jobs)
    allocation = (
        result.busy_gpu_s_while_waiting / result.capacity_gpu_s_while_waiting
        if result.capacity_gpu_s_while_waiting
        else 1.0
    )
    return {
        "jobs": len(result.jobs) + len(result.dropped),
        "jobs_completed": len(done),
        "jobs_dropped": len(result.dropped),
        "avg_jct_s": round(_mean(jct), 1),
        "p50_jct_s": round(percentile(jct, 50), 1),
        "p95_jct_s": round(percentile(jct, 95), 1),
        "p99_jct_s": round(percentile(jct, 99), 1),
        "avg_queue_s": round(_mean(queue), 1),
        "makespan_s": round(max(finishes) - min(submits), 1) if finishes and submits else 0.0,
        "gpu_allocation": round(allocation, 4),
        "preemptions": result.preemptions,
        "per_vc": per_vc,
        "jobs_waited": len(waited),
        "estimate_within_2x": round(est_hits / len(waited), 4) if waited else 1.0,
        "baseline_within_2x": round(base_hits / len(waited), 4) if waited else 1.0,
        "zero_wait_bound_s": round(_mean([j.trace.duration for j in result.jobs]), 1),
        "cycles": result.cycles,
        "capacity_gpus": result.capacity,
        "preemptions_by_reason": result.preemptions_by_reason,
        "preemption_lost_gpu_s": round(result.preemption_lost_gpu_s, 1),
        # Share of all the GPU-time the jobs needed that preemptions cost on top.
        "preemption_lost_share": round(result.preemption_lost_gpu_s / work_gpu_s, 5) if work_gpu_s else 0.0,
        "short_jobs": len(short),
        "short_avg_jct_s": round(_mean([(j.finished_at or 0.0) - j.trace.submit for j in short]), 1),
        "gang_jobs": len(gangs),
        "gang_avg_queue_s": round(_mean([_queue_delay(j) for j in gangs]), 1),
    }


def _queue_delay(job: SimJob) -> float:
    """Time in the system not spent running: first wait plus waits after preemptions (and
    checkpoint time when preemption has an overhead)."""
    assert job.finished_at is not None
    return max(job.finished_at - job.trace.submit - job.trace.duration, 0.0)

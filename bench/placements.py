"""Committed placements per second: a burst of pending jobs drained onto simulated nodes in
PostgreSQL by the real scheduling cycle, against a bare baseline in the same run.

    python -m bench.placements [--jobs 10000] [--nodes 1250] [--json]

The baseline does only the irreducible database work of a placement: read the pending jobs in
order, mark each scheduled, insert its attempt and its allocation rows, in batches, with no
scheduling decision, no events and no agent messages. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench.django_setup import portal_database
from bench.portal_stack import add_a100_gpus
from bench.report import print_result


def build_cluster(nodes: int, jobs: int) -> None:
    """A tenant with a VC whose quota covers the whole cluster, `nodes` x 8 A100, `jobs` pending
    1-GPU jobs (as submitted: spec, resources, one event each)."""
    from django.contrib.auth.models import User
    from django.db import connection

    from portal.accounts.models import Tenant
    from portal.cluster.models import Node, PriorityClass, Quota, VirtualCluster
    from portal.jobs.models import Job, JobAttempt, JobEvent

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_allocation, jobs_jobattempt, jobs_jobevent, jobs_job CASCADE")
    JobAttempt.objects.all().delete()
    Node.objects.all().delete()
    user, _ = User.objects.get_or_create(username="bench")
    tenant, _ = Tenant.objects.get_or_create(name="bench")
    vc, _ = VirtualCluster.objects.get_or_create(name="bench", defaults={"tenant": tenant})
    Quota.objects.update_or_create(
        virtual_cluster=vc, gpu_model="A100", defaults={"guaranteed": nodes * 8, "borrow_limit": 0}
    )
    pc, _ = PriorityClass.objects.get_or_create(name="training", defaults={"value": 500, "is_default": True})
    created = Node.objects.bulk_create(
        [
            Node(name=f"n{i:05d}", rack=f"r{i // 32}", state="ready", cpu=256, memory_gb=2048)
            for i in range(nodes)
        ]
    )
    add_a100_gpus(created, 8)
    spec = {"name": "burst", "vc": "bench", "command": ["true"], "resources": {"gpus": 1}}
    batch = Job.objects.bulk_create(
        [
            Job(
                tenant=tenant,
                virtual_cluster=vc,
                owner=user,
                name=f"burst-{i}",
                spec=spec,
                priority_class=pc,
                priority=500,
                gpu_model="A100",
                gpus_per_replica=1,
                replicas=1,
                cpu_per_replica=4,
                memory_gb_per_replica=16,
                time_limit_s=3600,
                pending_reason="new",
            )
            for i in range(jobs)
        ],
        batch_size=2000,
    )
    JobEvent.objects.bulk_create(
        [JobEvent(job=j, to_state="pending", actor_label="bench", reason="submitted") for j in batch],
        batch_size=2000,
    )


def drain_with_the_scheduler() -> tuple[float, int, int]:
    from portal.jobs.models import Allocation, Job
    from scheduler.tasks import run_cycle

    started = time.perf_counter()
    cycles = 0
    while Job.objects.filter(state="pending").exists():
        result = run_cycle()
        cycles += 1
        if result is None or result["started"] == 0:
            break
    elapsed = time.perf_counter() - started
    return elapsed, Allocation.objects.filter(released_at__isnull=True).count(), cycles


def drain_with_the_baseline() -> tuple[float, int]:
    from django.db import transaction

    from portal.cluster.models import Gpu
    from portal.jobs.models import Allocation, Job, JobAttempt

    started = time.perf_counter()
    with transaction.atomic():
        free = list(Gpu.objects.order_by("node_id", "index").values_list("pk", "node_id"))
        pending = list(
            Job.objects.filter(state="pending").order_by("submitted_at", "id").values_list("pk", flat=True)
        )
        placed = pending[: len(free)]
        Job.objects.filter(pk__in=placed).update(state="scheduled")
        attempts = JobAttempt.objects.bulk_create(
            [JobAttempt(job_id=pk, number=1) for pk in placed], batch_size=2000
        )
        Allocation.objects.bulk_create(
            [
                Allocation(attempt=a, gpu_id=gpu, node_id=node)
                for a, (gpu, node) in zip(attempts, free, strict=False)
            ],
            batch_size=2000,
        )
    return time.perf_counter() - started, len(placed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placements")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_250)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with portal_database():
        build_cluster(args.nodes, args.jobs)
        ours_s, ours_placed, cycles = drain_with_the_scheduler()
        build_cluster(args.nodes, args.jobs)
        base_s, base_placed = drain_with_the_baseline()
    result: dict[str, Any] = {
        "benchmark": "placements",
        "jobs": args.jobs,
        "gpus": args.nodes * 8,
        "placed": ours_placed,
        "cycles": cycles,
        "seconds": round(ours_s, 3),
        "placements_per_s": round(ours_placed / ours_s, 1),
        "baseline_placed": base_placed,
        "baseline_seconds": round(base_s, 3),
        "baseline_placements_per_s": round(base_placed / base_s, 1),
        "ratio_to_baseline": round((ours_placed / ours_s) / (base_placed / base_s), 3),
        "goal_placements_per_s": 1000,
    }
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

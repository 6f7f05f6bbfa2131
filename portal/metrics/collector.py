"""Everything /metrics reports, read fresh from PostgreSQL and Redis on each scrape.

Labels are bounded: nodes, GPUs, VCs, tenants, states and reason codes are finite sets, and a
GPU's job label names only the job holding it now.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from portal.cluster.models import Gpu, Node, Quota
from portal.cluster.services import ALL_MODELS, latest_gpu_samples
from portal.jobs.models import Allocation, Job, JobEvent
from portal.metrics.cycle_timing import cycle_histogram

# Preemption reasons that move a job rather than make room for other work.
MIGRATION_REASONS = ("defrag", "time-slice-move")


class PortalCollector:
    def collect(self) -> Iterator[Metric]:
        yield from self.gpus_per_node()
        yield from self.gpus_per_vc()
        yield from self.jobs()
        yield from self.scheduling()
        yield from self.agents()
        yield from self.gpu_telemetry()
        yield from self.security()

    def gpus_per_node(self) -> Iterator[Metric]:
        total = GaugeMetricFamily("gpuportal_node_gpus", "GPUs per node and model.", labels=["node", "model"])
        healthy = GaugeMetricFamily("gpuportal_node_gpus_healthy", "Healthy GPUs.", labels=["node", "model"])
        allocated = GaugeMetricFamily(
            "gpuportal_node_gpus_allocated", "Allocated GPUs.", labels=["node", "model"]
        )
        counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        live = set(Allocation.objects.holding().values_list("gpu_id", flat=True))
        for gpu_id, node, model, ok in Gpu.objects.values_list("id", "node__name", "model", "healthy"):
            key = (node, model)
            counts[key]["total"] += 1
            counts[key]["healthy"] += ok
            counts[key]["allocated"] += gpu_id in live
        for (node, model), c in sorted(counts.items()):
            total.add_metric([node, model], c["total"])
            healthy.add_metric([node, model], c["healthy"])
            allocated.add_metric([node, model], c["allocated"])
        yield from (total, healthy, allocated)

    def gpus_per_vc(self) -> Iterator[Metric]:
        labels = ["vc", "tenant", "model"]
        allocated = GaugeMetricFamily(
            "gpuportal_vc_gpus_allocated", "GPUs held by a VC's jobs.", labels=labels
        )
        guaranteed = GaugeMetricFamily(
            "gpuportal_vc_gpus_guaranteed", "A VC's guaranteed GPUs.", labels=labels
        )
        borrow = GaugeMetricFamily("gpuportal_vc_gpus_borrow_limit", "A VC's borrow limit.", labels=labels)
        lending = GaugeMetricFamily(
            "gpuportal_vc_gpus_lending_limit",
            "How many of a VC's idle guaranteed GPUs other VCs may borrow; absent when it lends all.",
            labels=labels,
        )
        tenant_allocated = GaugeMetricFamily(
            "gpuportal_tenant_gpus_allocated", "GPUs held by a tenant's jobs.", labels=["tenant", "model"]
        )
        held = Counter(
            Allocation.objects.holding().values_list(
                "attempt__job__virtual_cluster__name", "attempt__job__tenant__name", "gpu__model"
            )
        )
        per_tenant: Counter[tuple[str, str]] = Counter()
        for quota in Quota.objects.select_related("virtual_cluster__tenant"):
            vc, tenant = quota.virtual_cluster.name, quota.virtual_cluster.tenant.name
            guaranteed.add_metric([vc, tenant, quota.gpu_model], quota.guaranteed)
            borrow.add_metric([vc, tenant, quota.gpu_model], quota.borrow_limit)
            if quota.lending_limit is not None:
                lending.add_metric([vc, tenant, quota.gpu_model], quota.lending_limit)
            if quota.gpu_model == ALL_MODELS:  # an all-models row counts every model's GPUs
                in_use = sum(n for (v, _, _), n in held.items() if v == vc)
            else:
                in_use = held.get((vc, tenant, quota.gpu_model), 0)
            allocated.add_metric([vc, tenant, quota.gpu_model], in_use)
        for (_, tenant, model), n in held.items():
            per_tenant[(tenant, model)] += n
        for (tenant, model), n in sorted(per_tenant.items()):
            tenant_allocated.add_metric([tenant, model], n)
        yield from (allocated, guaranteed, borrow, lending, tenant_allocated)

    def jobs(self) -> Iterator[Metric]:
        by_state = GaugeMetricFamily("gpuportal_jobs", "Jobs by state.", labels=["state"])
        for state, n in sorted(
            Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
        ):
            by_state.add_metric([state], n)
        pending = GaugeMetricFamily(
            "gpuportal_pending_jobs", "Pending jobs by reason code.", labels=["reason"]
        )
        rows = Job.objects.filter(state="pending").values_list("pending_reason").annotate(n=Count("id"))
        for reason, n in sorted(rows.values_list("pending_reason", "n")):
            pending.add_metric([reason or "none"], n)
        yield from (by_state, pending)

    def scheduling(self) -> Iterator[Metric]:
        buckets, total = cycle_histogram()
        histogram = HistogramMetricFamily(
            "gpuportal_scheduling_cycle_seconds", "Duration of scheduling cycles."
        )
        histogram.add_metric([], buckets, total)
        yield histogram
        preemptions = CounterMetricFamily(
            "gpuportal_preemptions", "Jobs asked to checkpoint and stop, by why.", labels=["reason"]
        )
        rows = JobEvent.objects.filter(to_state="checkpointing").values_list("data__preemption")
        preemption_counts = Counter(r for (r,) in rows)
        for reason, n in sorted(preemption_counts.items(), key=lambda x: str(x[0])):
            preemptions.add_metric([reason or "other"], n)
        requeues = CounterMetricFamily(
            "gpuportal_requeues", "Jobs put back in the queue after preemption, node loss or GPU failure."
        )
        requeues.add_metric(
            [], JobEvent.objects.filter(to_state="pending", reason__startswith="requeued").count()
        )
        migrations = CounterMetricFamily(
            "gpuportal_migrations",
            "Jobs checkpointed to restart elsewhere: out of a blocked gang's way (defrag), or a "
            "suspended job whose GPUs were taken (time-slice-move). Also counted as preemptions.",
            labels=["reason"],
        )
        for reason in MIGRATION_REASONS:
            migrations.add_metric([reason], preemption_counts.get(reason, 0))
        suspensions = CounterMetricFamily(
            "gpuportal_time_slice_suspensions", "Jobs suspended for another job's turn on their GPUs."
        )
        suspensions.add_metric([], JobEvent.objects.filter(to_state="suspended").count())
        yield from (preemptions, requeues, migrations, suspensions)

    def agents(self) -> Iterator[Metric]:
        connected = GaugeMetricFamily("gpuportal_agents_connected", "Agents heard from recently.")
        cutoff = timezone.now() - timedelta(seconds=settings.NODE_SILENT_AFTER_S)
        connected.add_metric([], Node.objects.filter(last_heartbeat_at__gte=cutoff).count())
        yield connected

    def gpu_telemetry(self) -> Iterator[Metric]:
        labels = ["node", "gpu", "uuid", "job", "vc", "tenant"]
        families = {
            "utilization_pct": GaugeMetricFamily(
                "gpuportal_gpu_utilization_percent", "GPU utilization.", labels=labels
            ),
            "memory_used_mib": GaugeMetricFamily(
                "gpuportal_gpu_memory_used_bytes", "GPU memory in use.", labels=labels
            ),
            "power_w": GaugeMetricFamily("gpuportal_gpu_power_watts", "GPU power draw.", labels=labels),
            "temperature_c": GaugeMetricFamily(
                "gpuportal_gpu_temperature_celsius", "GPU temperature.", labels=labels
            ),
        }
        owners = {
            uuid: (str(job), vc, tenant)
            for uuid, job, vc, tenant in Allocation.objects.holding().values_list(
                "gpu__uuid",
                "attempt__job_id",
                "attempt__job__virtual_cluster__name",
                "attempt__job__tenant__name",
            )
        }
        names = dict(Node.objects.values_list("id", "name"))
        for node_id, samples in latest_gpu_samples(names).items():
            node_name = names[node_id]
            indexes = dict(Gpu.objects.filter(node_id=node_id).values_list("uuid", "index"))
            for uuid, sample in samples.items():
                if uuid not in indexes:
                    continue
                job, vc, tenant = owners.get(uuid, ("", "", ""))
                values = [node_name, str(indexes[uuid]), uuid, job, vc, tenant]
                for field, family in families.items():
                    value = sample.get(field)
                    if value is not None:
                        family.add_metric(
                            values, value * 1024 * 1024 if field == "memory_used_mib" else value
                        )
        yield from families.values()

    def security(self) -> Iterator[Metric]:
        """Refused requests and raised alerts per realm (user, agent): see portal.accounts.security."""
        from portal.accounts.security import REALMS, security_counts

        counts = security_counts()
        refusals = CounterMetricFamily(
            "gpuportal_security_refusals",
            "Requests refused and audited: API writes answered 403/404, agent connections and reports.",
            labels=["realm"],
        )
        alerts = CounterMetricFamily(
            "gpuportal_security_alerts",
            "Alerts raised because one user, node or address was refused repeatedly within the window.",
            labels=["realm"],
        )
        for realm in REALMS:
            refusals.add_metric([realm], counts.get(f"refusals:{realm}", 0))
            alerts.add_metric([realm], counts.get(f"alerts:{realm}", 0))
        yield from (refusals, alerts)

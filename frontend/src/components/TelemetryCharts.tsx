import type { LiveTelemetrySample } from "../api/live";
import type { Allocation, TelemetrySample } from "../api/types";
import { emptyTelemetryText } from "../lib/empty";
import { LineChart, type Series } from "./charts";

/** One GPU reading as the charts use it, the shape live updates bring. A metric the GPU did not
 * report is null, never 0: the chart's line breaks there, and the legend does not read it as idle. */
export type Sample = LiveTelemetrySample;

export function toSample(s: TelemetrySample | LiveTelemetrySample): Sample {
  return {
    gpu_uuid: s.gpu_uuid,
    time: s.time,
    utilization_pct: s.utilization_pct ?? null,
    memory_used_mib: s.memory_used_mib ?? null,
    power_w: s.power_w ?? null,
    temperature_c: s.temperature_c ?? null,
    memory_total_mib: "memory_total_mib" in s ? s.memory_total_mib : undefined,
  };
}

function gpuName(uuid: string, allocations: Allocation[]): string {
  const a = allocations.find((x) => x.gpu_uuid === uuid);
  return a ? `${a.node}/${a.gpu_index}` : uuid.slice(0, 8);
}

/** One series per GPU, a point per sample; a sample without the metric is a point without a
 * value (null), where the line breaks. */
export function telemetrySeries(samples: Sample[], allocations: Allocation[], pick: (s: Sample) => number | null): Series[] {
  const byGpu = new Map<string, Series>();
  for (const s of samples) {
    let entry = byGpu.get(s.gpu_uuid);
    if (!entry) {
      entry = { name: gpuName(s.gpu_uuid, allocations), points: [] };
      byGpu.set(s.gpu_uuid, entry);
    }
    entry.points.push({ t: Date.parse(s.time), v: pick(s) });
  }
  return [...byGpu.values()].sort((a, b) => a.name.localeCompare(b.name));
}

export function TelemetryCharts({
  samples,
  allocations,
  attempt = null,
  ended = false,
}: {
  samples: Sample[];
  allocations: Allocation[];
  attempt?: number | null;
  ended?: boolean;
}) {
  const emptyText = emptyTelemetryText(attempt, ended);
  // The live samples say how much memory a GPU has; the chart then shows use against it.
  const totals = samples.map((s) => s.memory_total_mib ?? 0).filter((m) => m > 0);
  const memoryMax = totals.length ? Math.max(...totals) / 1024 : undefined;
  return (
    <div className="charts">
      <LineChart title="GPU utilization" unit="%" yMax={100} emptyText={emptyText} series={telemetrySeries(samples, allocations, (s) => s.utilization_pct)} />
      <LineChart
        title="GPU memory used"
        unit="GiB"
        yMax={memoryMax}
        emptyText={emptyText}
        series={telemetrySeries(samples, allocations, (s) => (s.memory_used_mib === null ? null : s.memory_used_mib / 1024))}
      />
      <LineChart title="Power" unit="W" emptyText={emptyText} series={telemetrySeries(samples, allocations, (s) => s.power_w)} />
    </div>
  );
}

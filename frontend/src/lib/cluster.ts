// Figures derived from the node list: free GPUs per model and what fits now.
import type { ClusterNode, Flavor, GpuReading } from "../api/types";

export interface ModelUse {
  model: string;
  total: number;
  allocated: number;
  free: number;
  unhealthy: number;
}

function usable(node: ClusterNode): boolean {
  return node.state === undefined || node.state === "ready";
}

export function gpuUseByModel(nodes: ClusterNode[]): ModelUse[] {
  const byModel = new Map<string, ModelUse>();
  for (const node of nodes) {
    for (const gpu of node.gpus) {
      const use = byModel.get(gpu.model) ?? { model: gpu.model, total: 0, allocated: 0, free: 0, unhealthy: 0 };
      use.total += 1;
      if (gpu.allocated) use.allocated += 1;
      else if (gpu.healthy === false || !usable(node)) use.unhealthy += 1;
      else use.free += 1;
      byModel.set(gpu.model, use);
    }
  }
  return [...byModel.values()].sort((a, b) => a.model.localeCompare(b.model));
}

/** How many replicas of a flavor the cluster could start right now (free, healthy GPUs on ready nodes). */
export function replicasThatFitNow(flavor: Flavor, nodes: ClusterNode[]): number {
  if (flavor.gpus <= 0) return 0;
  let fit = 0;
  for (const node of nodes) {
    if (!usable(node)) continue;
    const free = node.gpus.filter((g) => g.model === flavor.gpu_model && !g.allocated && g.healthy !== false).length;
    fit += Math.floor(free / flavor.gpus);
  }
  return fit;
}

export type NodeAction = "cordon" | "drain" | "uncordon";

/** The state changes a cluster admin may make from a node's current state, with labels. */
export function nodeActions(state: ClusterNode["state"]): [NodeAction, string][] {
  if (state === "cordoned" || state === "draining") return [["uncordon", "Make ready"]];
  return [
    ["cordon", "Cordon"],
    ["drain", "Drain"],
  ];
}

/** A GPU's latest reading in words, for its cell's label and tooltip. */
export function gpuReadingText(reading: GpuReading): string {
  const parts: string[] = [];
  if (reading.utilization_pct !== null && reading.utilization_pct !== undefined) parts.push(`${Math.round(reading.utilization_pct)}% busy`);
  if (reading.memory_used_mib != null) {
    const total = reading.memory_total_mib != null ? ` of ${Math.round(reading.memory_total_mib / 1024)}` : "";
    parts.push(`${Math.round(reading.memory_used_mib / 1024)}${total} GB used`);
  }
  if (reading.power_w != null) parts.push(`${Math.round(reading.power_w)} W`);
  if (reading.temperature_c != null) parts.push(`${Math.round(reading.temperature_c)} °C`);
  return parts.join(", ");
}

/** How old a GPU reading may be and still be shown as the GPU's current load. Agents report
 * every few seconds; a node is marked not-ready after 30 s without a heartbeat. */
export const READING_FRESH_MS = 60_000;

/** Whether a GPU's latest reading says what the GPU does now: not when its node's agent went
 * silent (not-ready) or the reading is older than READING_FRESH_MS. A stale reading is shown
 * only in the label, with its age, never as the GPU's current load. */
export function readingIsCurrent(reading: GpuReading | null | undefined, nodeState: ClusterNode["state"], now: number = Date.now()): boolean {
  if (!reading) return false;
  if (nodeState === "not-ready") return false;
  const t = Date.parse(reading.time);
  return Number.isFinite(t) && now - t <= READING_FRESH_MS;
}

// Figures derived from the node list: free GPUs per model and what fits now.
import type { ClusterNode, Flavor, GpuReading } from "../api/types";
import { formatInteger } from "./format";

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
export function gpuReadingText(reading: GpuReading, locale?: string): string {
  const n = (value: number) => formatInteger(value, locale);
  const parts: string[] = [];
  if (reading.utilization_pct !== null && reading.utilization_pct !== undefined) parts.push(`${n(reading.utilization_pct)}% busy`);
  if (reading.memory_used_mib != null) {
    const total = reading.memory_total_mib != null ? ` of ${n(reading.memory_total_mib / 1024)}` : "";
    parts.push(`${n(reading.memory_used_mib / 1024)}${total} GB used`);
  }
  if (reading.power_w != null) parts.push(`${n(reading.power_w)} W`);
  if (reading.temperature_c != null) parts.push(`${n(reading.temperature_c)} °C`);
  return parts.join(", ");
}

/** A node's size and load under its name: "rack r1 · 256 CPU · 2,048 GB · 2/8 GPUs allocated",
 * its numbers grouped as the locale groups digits. */
export function nodeSpecText(node: Pick<ClusterNode, "rack" | "cpu" | "memory_gb" | "gpus">, locale?: string): string {
  const n = (value: number | null | undefined) => formatInteger(value, locale);
  const allocated = node.gpus.filter((g) => g.allocated).length;
  const parts = [`${n(node.cpu)} CPU`, `${n(node.memory_gb)} GB`, `${n(allocated)}/${n(node.gpus.length)} GPUs allocated`];
  return (node.rack ? [`rack ${node.rack}`, ...parts] : parts).join(" · ");
}

/** What draining a node does to the jobs on it, in numbers, for the admin to confirm first. The
 * node list names the job on a GPU only when it is one of the user's tenants' (never whose it is),
 * so other tenants' jobs are counted by the GPUs they hold. */
export function drainQuestion(node: Pick<ClusterNode, "name" | "gpus">, locale?: string): string {
  const n = (value: number) => formatInteger(value, locale);
  const held = node.gpus.filter((g) => g.allocated);
  const jobs = new Set(held.flatMap((g) => (g.job == null ? [] : [g.job]))).size;
  const unnamed = held.filter((g) => g.job == null).length;
  const gpus = `${n(held.length)} of its ${n(node.gpus.length)} GPUs`;
  const after = "It then takes no new jobs until an admin makes it ready.";
  if (held.length === 0) return `Drain ${node.name}? No job holds its GPUs now. ${after}`;
  const move = "checkpointed or stopped and requeued elsewhere";
  if (unnamed === 0) {
    const its = jobs === 1 ? "Its 1 running job" : `Its ${n(jobs)} running jobs`;
    return `Drain ${node.name}? ${its}, on ${gpus}, ${jobs === 1 ? "is" : "are"} ${move}. ${after}`;
  }
  const others = `other tenants' jobs on ${n(unnamed)} ${unnamed === 1 ? "GPU" : "GPUs"}`;
  const which = jobs === 0 ? others : `${n(jobs)} ${jobs === 1 ? "job" : "jobs"} of your tenants and ${others}`;
  return `Drain ${node.name}? The jobs on ${gpus} (${which}) are ${move}. ${after}`;
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

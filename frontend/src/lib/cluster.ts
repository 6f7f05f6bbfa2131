// Figures derived from the node list: free GPUs per model and what fits now.
import type { ClusterNode, Flavor } from "../api/types";

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

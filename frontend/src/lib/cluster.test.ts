import { describe, expect, it } from "vitest";

import type { ClusterNode, Flavor, Gpu } from "../api/types";
import { gpuUseByModel, replicasThatFitNow } from "./cluster";

function gpu(index: number, model: string, allocated = false, healthy = true): Gpu {
  return { index, uuid: `g${index}`, model, memory_mb: 1, nvlink_group: 0, pcie_switch: 0, numa_node: 0, healthy, health_reason: "", allocated } as Gpu;
}

function node(name: string, gpus: Gpu[], state = "ready"): ClusterNode {
  return { id: 1, name, rack: "", labels: {}, state, state_reason: "", cpu: 1, memory_gb: 1, last_heartbeat_at: null, gpus } as unknown as ClusterNode;
}

const flavor = (gpus: number): Flavor => ({ id: 1, name: "f", gpu_model: "A100", gpus, cpu: 1, memory_gb: 1, max_runtime_hours: 1 }) as Flavor;

describe("cluster figures", () => {
  const nodes = [
    node("a", [gpu(0, "A100", true), gpu(1, "A100"), gpu(2, "A100"), gpu(3, "A100", false, false)]),
    node("b", [gpu(0, "A100"), gpu(1, "A100")], "not-ready"),
  ];

  it("counts GPUs per model", () => {
    expect(gpuUseByModel(nodes)).toEqual([{ model: "A100", total: 6, allocated: 1, free: 2, unhealthy: 3 }]);
  });

  it("fits replicas only on ready nodes", () => {
    expect(replicasThatFitNow(flavor(1), nodes)).toBe(2);
    expect(replicasThatFitNow(flavor(2), nodes)).toBe(1);
    expect(replicasThatFitNow(flavor(4), nodes)).toBe(0);
  });
});

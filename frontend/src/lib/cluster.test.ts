import { describe, expect, it } from "vitest";

import type { ClusterNode, Flavor, Gpu } from "../api/types";
import { READING_FRESH_MS, gpuReadingText, gpuUseByModel, nodeActions, readingIsCurrent, replicasThatFitNow } from "./cluster";

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

describe("node actions and GPU readings", () => {
  it("offers cordon and drain on a ready node, and only making it ready otherwise", () => {
    expect(nodeActions("ready").map(([a]) => a)).toEqual(["cordon", "drain"]);
    expect(nodeActions("draining").map(([a]) => a)).toEqual(["uncordon"]);
    expect(nodeActions("cordoned").map(([a]) => a)).toEqual(["uncordon"]);
  });

  it("says a reading in words and leaves out what the GPU did not report", () => {
    const time = "2026-01-01T00:00:00Z";
    expect(
      gpuReadingText({ time, utilization_pct: 87.4, memory_used_mib: 40960, memory_total_mib: 81920, power_w: 312.2, temperature_c: 61 }),
    ).toBe("87% busy, 40 of 80 GB used, 312 W, 61 °C");
    expect(gpuReadingText({ time, utilization_pct: null, memory_used_mib: null, memory_total_mib: null, power_w: 50, temperature_c: null })).toBe("50 W");
  });
});

describe("whether a GPU reading is current", () => {
  const now = Date.parse("2026-01-01T00:10:00Z");
  const at = (msAgo: number) => ({
    time: new Date(now - msAgo).toISOString(),
    utilization_pct: 90,
    memory_used_mib: 1,
    memory_total_mib: 2,
    power_w: 300,
    temperature_c: 60,
  });

  it("shows a recent reading of a node whose agent reports", () => {
    expect(readingIsCurrent(at(3_000), "ready", now)).toBe(true);
    expect(readingIsCurrent(at(3_000), "cordoned", now)).toBe(true);
    expect(readingIsCurrent(at(3_000), "draining", now)).toBe(true);
  });

  it("does not take a silent agent's last reading for the GPU's load now", () => {
    // The node went not-ready: its agent stopped reporting, whatever the reading's age.
    expect(readingIsCurrent(at(3_000), "not-ready", now)).toBe(false);
    expect(readingIsCurrent(at(READING_FRESH_MS + 1_000), "ready", now)).toBe(false);
    expect(readingIsCurrent(null, "ready", now)).toBe(false);
    expect(readingIsCurrent({ ...at(0), time: "garbage" }, "ready", now)).toBe(false);
  });
});

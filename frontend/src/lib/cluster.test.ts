import { describe, expect, it } from "vitest";

import type { ClusterNode, Flavor, Gpu } from "../api/types";
import {
  READING_FRESH_MS,
  drainQuestion,
  gpuReadingText,
  gpuUseByModel,
  nodeActions,
  nodeSpecText,
  readingIsCurrent,
  replicasThatFitNow,
} from "./cluster";

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

describe("what draining a node does, asked before it is done", () => {
  const held = (index: number, job: number | null): Gpu => ({ ...gpu(index, "A100", true), job }) as Gpu;
  const free = (index: number): Gpu => ({ ...gpu(index, "A100"), job: null }) as Gpu;

  it("counts the running jobs and the GPUs they hold", () => {
    const n = node("a100-node-1", [held(0, 7), held(1, 7), held(2, 8), held(3, 9), held(4, 9), free(5), free(6), free(7)]);
    expect(drainQuestion(n, "en-GB")).toBe(
      "Drain a100-node-1? Its 3 running jobs, on 5 of its 8 GPUs, are checkpointed or stopped and requeued elsewhere. " +
        "It then takes no new jobs until an admin makes it ready.",
    );
    const one = node("a100-node-1", [held(0, 7), held(1, 7), free(2), free(3)]);
    expect(drainQuestion(one, "en-GB")).toContain("Its 1 running job, on 2 of its 4 GPUs, is checkpointed or stopped and requeued elsewhere.");
  });

  it("counts other tenants' jobs by their GPUs, naming nothing of them", () => {
    const n = node("a100-node-1", [held(0, 7), held(1, null), held(2, null), free(3)]);
    expect(drainQuestion(n, "en-GB")).toBe(
      "Drain a100-node-1? The jobs on 3 of its 4 GPUs (1 job of your tenants and other tenants' jobs on 2 GPUs) are " +
        "checkpointed or stopped and requeued elsewhere. It then takes no new jobs until an admin makes it ready.",
    );
    const hidden = node("a100-node-1", [held(0, null), free(1)]);
    expect(drainQuestion(hidden, "en-GB")).toContain("The jobs on 1 of its 2 GPUs (other tenants' jobs on 1 GPU) are checkpointed");
  });

  it("says so when no job would move", () => {
    expect(drainQuestion(node("a100-node-2", [free(0), free(1)]), "en-GB")).toBe(
      "Drain a100-node-2? No job holds its GPUs now. It then takes no new jobs until an admin makes it ready.",
    );
  });
});

describe("big numbers on the cluster page", () => {
  it("groups a node's memory, CPUs and GPU counts", () => {
    const big = { ...node("a100-node-1", [gpu(0, "A100", true), gpu(1, "A100")]), cpu: 1024, memory_gb: 2048, rack: "rack-1" } as ClusterNode;
    expect(nodeSpecText(big, "en-GB")).toBe("rack rack-1 · 1,024 CPU · 2,048 GB · 1/2 GPUs allocated");
    expect(nodeSpecText({ ...big, rack: "" }, "de-DE")).toBe("1.024 CPU · 2.048 GB · 1/2 GPUs allocated");
  });

  it("groups a reading's figures", () => {
    const time = "2026-01-01T00:00:00Z";
    const reading = { time, utilization_pct: 50, memory_used_mib: 1_048_576, memory_total_mib: 2_097_152, power_w: 1500, temperature_c: null };
    expect(gpuReadingText(reading, "en-GB")).toBe("50% busy, 1,024 of 2,048 GB used, 1,500 W");
  });
});

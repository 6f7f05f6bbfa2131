import { describe, expect, it } from "vitest";

import type { JobAttempt, ReplicaStatus } from "../api/types";
import { pullProgress, showReplicas } from "./replicas";

function attempt(state: JobAttempt["state"], replicas: Partial<ReplicaStatus>[]): JobAttempt {
  return {
    number: 1,
    state,
    replicas: replicas.length,
    created_at: "2026-01-01T12:00:00Z",
    allocations: [],
    replicas_status: replicas.map((r, replica) => ({
      replica,
      node: "a100-node-1",
      state: "starting",
      message: "",
      exit_code: null,
      ...r,
    })),
  } as JobAttempt;
}

describe("replicas", () => {
  it("reads an image pull's progress from the agent's message", () => {
    expect(pullProgress("pulling registry.example.org/ml/pytorch:24.10: 312 of 1,024 MiB")).toEqual({ done: 312, total: 1024 });
    expect(pullProgress("pulling busybox:latest: 0 of 5 MiB")).toEqual({ done: 0, total: 5 });
    expect(pullProgress("pulling a: 12,345 of 23,456 MiB")).toEqual({ done: 12345, total: 23456 });
    // No sizes yet, or no pull at all: no bar.
    expect(pullProgress("pulling registry.example.org/ml/pytorch:24.10")).toBeNull();
    expect(pullProgress("cannot pull registry.example.org/ml/pytorch:24.10: unauthorized")).toBeNull();
    expect(pullProgress("pulling a: 3 of 0 MiB")).toBeNull();
    // Rounding may put the bytes done past the total's MiB for a moment; the bar stays full.
    expect(pullProgress("pulling a: 6 of 5 MiB")).toEqual({ done: 5, total: 5 });
  });

  it("shows the replicas while the attempt starts or when one has a message", () => {
    expect(showReplicas(undefined)).toBe(false);
    expect(showReplicas(attempt("starting", [{ state: null }]))).toBe(true);
    expect(showReplicas(attempt("running", [{ state: "running" }, { state: "running" }]))).toBe(false);
    expect(showReplicas(attempt("failed", [{ state: "exited", message: "cannot pull x: unauthorized" }]))).toBe(true);
    expect(showReplicas(attempt("lost", [{ state: "vanished", message: "no process or container found" }, {}]))).toBe(true);
  });
});

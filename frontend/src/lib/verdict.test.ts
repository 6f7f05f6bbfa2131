import { describe, expect, it } from "vitest";

import type { DryRun, WhatIfHint } from "../api/types";
import { PAUSED_NOTE, hintBadge, verdictText } from "./verdict";

const NOW = Date.parse("2026-01-01T12:00:00Z");

function verdict(patch: Partial<DryRun>): DryRun {
  return {
    would_start_now: false,
    reason: "vc-quota",
    message: "VC vision: 16 A100 in use, 8 guaranteed and 8 borrowed, borrow limit 8; job needs 8",
    estimated_start: null,
    queue_position: null,
    placement: null,
    borrowed_gpus: 0,
    hints: [],
    scheduling_paused: false,
    ...patch,
  };
}

describe("a dry run's verdict", () => {
  it("says where a job that fits would start, in the portal's words", () => {
    const starts = verdict({ would_start_now: true, reason: null, message: "Would start now on a100-node-1:0,1.", placement: "a100-node-1:0,1" });
    expect(verdictText(starts, NOW)).toEqual({ headline: "Would start now on a100-node-1:0,1.", detail: null });
  });

  it("says why a job would wait, until when and where in the queue", () => {
    const text = verdictText(verdict({ estimated_start: "2026-01-01T14:10:00Z", queue_position: 3 }), NOW);
    expect(text.headline).toBe("Would wait: VC vision: 16 A100 in use, 8 guaranteed and 8 borrowed, borrow limit 8; job needs 8.");
    expect(text.detail).toMatch(/^Estimated start in 2h 10m \(.+\), position 3 in the queue\.$/);
  });

  it("says so when the portal cannot estimate the start, and ends the message once", () => {
    const text = verdictText(verdict({ reason: "dependency", message: "Waiting for job 4 (pending) to succeed." }), NOW);
    expect(text).toEqual({ headline: "Would wait: Waiting for job 4 (pending) to succeed.", detail: "No estimated start." });
  });

  it("adds that nothing starts while an admin has paused scheduling", () => {
    const starts = verdict({ would_start_now: true, reason: null, message: "Would start now on a100-node-1:0,1.", scheduling_paused: true });
    expect(verdictText(starts, NOW)).toEqual({ headline: "Would start now on a100-node-1:0,1.", detail: PAUSED_NOTE });
    const waits = verdictText(verdict({ reason: "dependency", message: "Waiting for job 4.", scheduling_paused: true }), NOW);
    expect(waits.detail).toBe(`No estimated start. ${PAUSED_NOTE}`);
  });

  it("badges each hint with when it would start", () => {
    const hint = (patch: Partial<WhatIfHint>): WhatIfHint => ({
      kind: "gpu-model",
      message: "on V100 instead of A100 (flavor l-V100) it starts now",
      replicas: 1,
      gpus_per_replica: 8,
      gpu_model: "V100",
      flavor: "l-V100",
      time_limit_s: null,
      starts_now: false,
      estimated_start_at: null,
      ...patch,
    });
    expect(hintBadge(hint({ starts_now: true }), NOW)).toBe("starts now");
    expect(hintBadge(hint({ estimated_start_at: "2026-01-01T13:00:00Z" }), NOW)).toBe("starts in 1h");
    expect(hintBadge(hint({}), NOW)).toBe("sooner");
  });
});

import { describe, expect, it } from "vitest";

import type { JobDetail } from "../api/types";
import { holdAction } from "./hold";

function job(fields: Partial<JobDetail>, checkpoint = false): JobDetail {
  return {
    id: 12,
    state: "running",
    on_hold: false,
    paused: false,
    spec: checkpoint ? { checkpoint: { enabled: true } } : {},
    ...fields,
  } as JobDetail;
}

describe("holdAction", () => {
  it("holds and releases a pending job", () => {
    expect(holdAction(job({ state: "pending" }))?.label).toBe("Hold");
    expect(holdAction(job({ state: "pending", on_hold: true }))).toMatchObject({ action: "release", label: "Release" });
  });

  it("pauses a running or suspended job only when it checkpoints", () => {
    expect(holdAction(job({ state: "running" }, true))).toMatchObject({ action: "hold", label: "Pause" });
    expect(holdAction(job({ state: "suspended" }, true))?.label).toBe("Pause");
    expect(holdAction(job({ state: "running" }))).toBeNull();
    expect(holdAction(job({ state: "starting" }, true))).toBeNull();
    expect(holdAction(job({ state: "succeeded" }, true))).toBeNull();
  });

  it("resumes a paused job, also while it still checkpoints", () => {
    const waiting = holdAction(job({ state: "pending", on_hold: true, paused: true }, true));
    expect(waiting).toMatchObject({ action: "release", label: "Resume" });
    expect(waiting?.note).toContain("resumes from its checkpoint");
    const stopping = holdAction(job({ state: "checkpointing", on_hold: true, paused: true }, true));
    expect(stopping).toMatchObject({ action: "release", label: "Resume" });
    expect(stopping?.note).toContain("Pausing");
  });

  it("says a paused job without a checkpoint starts over, as its card does", () => {
    const saved = holdAction(job({ state: "pending", on_hold: true, paused: true, checkpoints: [{}] as JobDetail["checkpoints"] }, true));
    expect(saved?.note).toBe("Paused: it resumes from its checkpoint when resumed.");
    const none = holdAction(job({ state: "pending", on_hold: true, paused: true, checkpoints: [] }, true));
    expect(none?.note).toBe("Paused: it saved no checkpoint, so it starts over when resumed.");
    expect(none?.note).not.toContain("resumes from its checkpoint");
  });
});

import { describe, expect, it } from "vitest";

import type { JobDetail } from "../api/types";
import { cloneSource, replacesWaitingJob } from "./clone";

const job5 = { id: 5, name: "train" } as JobDetail;

describe("cloneSource", () => {
  it("starts from the cloned job once it loaded", () => {
    expect(cloneSource("5", job5, false)).toBe(job5);
    expect(cloneSource("5", undefined, false)).toBe("loading");
  });

  it("starts a new form without clone in the URL, though an earlier clone is still loaded", () => {
    expect(cloneSource(null, job5, false)).toBeNull();
    expect(cloneSource(null, undefined, false)).toBeNull();
  });

  it("waits for another job than the one loaded, and starts empty when it cannot be loaded", () => {
    expect(cloneSource("6", job5, false)).toBe("loading");
    expect(cloneSource("6", job5, true)).toBeNull();
  });
});

describe("replacesWaitingJob", () => {
  it("is a hint's resubmission of a job still pending", () => {
    expect(replacesWaitingJob({ state: "pending" }, true)).toBe(true);
    expect(replacesWaitingJob({ state: "pending" }, false)).toBe(false); // a plain clone is another job
    expect(replacesWaitingJob({ state: "running" }, true)).toBe(false);
    expect(replacesWaitingJob(null, true)).toBe(false);
  });
});

import { describe, expect, it } from "vitest";

import { pollsJob } from "./jobpoll";

describe("the job page's polling", () => {
  it("refreshes a pending job's estimates and a running job's usage, not an ended job", () => {
    expect(pollsJob({ state: "pending" })).toBe(true);
    expect(pollsJob({ state: "running" })).toBe(true);
    expect(pollsJob({ state: "suspended" })).toBe(true);
    expect(pollsJob({ state: "checkpointing" })).toBe(true);
    expect(pollsJob({ state: "succeeded" })).toBe(false);
    expect(pollsJob({ state: "cancelled" })).toBe(false);
  });
});

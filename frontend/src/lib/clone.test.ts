import { describe, expect, it } from "vitest";

import type { JobDetail } from "../api/types";
import { cloneSource } from "./clone";

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

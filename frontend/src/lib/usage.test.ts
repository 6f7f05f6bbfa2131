import { describe, expect, it } from "vitest";

import type { UsageRow } from "../api/types";
import { formatUsage, readUsageFilters, sortUsageRows, usageApiParams, usageBars, usagePageUrl } from "./usage";

const row = (key: string, allocated: number, used: number, energy: number, jobs: number): UsageRow => ({
  key,
  jobs,
  allocated_gpu_hours: allocated,
  used_gpu_hours: used,
  energy_kwh: energy,
});

// As the API sends them: most GPU-hours first.
const rows = [row("bob", 3, 1.5, 0.9, 1), row("Alice", 1, 1, 1.2, 4), row("carol", 1, 0, 0, 2)];

describe("usage filters", () => {
  it("reads the page's URL, falling back to the API's defaults", () => {
    expect(readUsageFilters(new URLSearchParams(""))).toEqual({ group: "vc", from: "", to: "" });
    expect(readUsageFilters(new URLSearchParams("group=user&from=2026-03-01&to=2026-03-31"))).toEqual({
      group: "user",
      from: "2026-03-01",
      to: "2026-03-31",
    });
    expect(readUsageFilters(new URLSearchParams("group=planet&from=yesterday&to=2026-3-1"))).toEqual({ group: "vc", from: "", to: "" });
  });

  it("keeps the defaults out of the page's URL", () => {
    expect(usagePageUrl({ group: "vc", from: "", to: "" })).toBe("/usage");
    expect(usagePageUrl({ group: "job", from: "2026-03-01", to: "" })).toBe("/usage?group=job&from=2026-03-01");
  });

  it("asks the API from the start of the first local day to the end of the last", () => {
    expect(usageApiParams({ group: "tenant", from: "", to: "" })).toEqual({ group: "tenant", since: undefined, until: undefined });
    const params = usageApiParams({ group: "vc", from: "2026-03-01", to: "2026-03-31" });
    expect(params.since).toBe(new Date(2026, 2, 1).toISOString());
    expect(params.until).toBe(new Date(2026, 3, 1).toISOString());
    expect(usageApiParams({ group: "vc", from: "", to: "2026-12-31" }).until).toBe(new Date(2027, 0, 1).toISOString());
  });
});

describe("usage rows", () => {
  it("sorts by a figure, largest first, or by name", () => {
    const keys = (sorted: UsageRow[]) => sorted.map((r) => r.key);
    expect(keys(sortUsageRows(rows, "allocated"))).toEqual(["bob", "Alice", "carol"]);
    expect(keys(sortUsageRows(rows, "used"))).toEqual(["bob", "Alice", "carol"]);
    expect(keys(sortUsageRows(rows, "energy"))).toEqual(["Alice", "bob", "carol"]);
    expect(keys(sortUsageRows(rows, "jobs"))).toEqual(["Alice", "carol", "bob"]);
    expect(keys(sortUsageRows(rows, "name"))).toEqual(["Alice", "bob", "carol"]);
    const jobs = ["9", "10", "100"].map((key) => row(key, 1, 0, 0, 1));
    expect(sortUsageRows(jobs, "name").map((r) => r.key)).toEqual(["9", "10", "100"]);
  });

  it("draws the largest rows on the scale of the longest bar", () => {
    expect(usageBars(rows, 2)).toEqual([
      { key: "bob", allocated: 3, used: 1.5, allocatedPct: 100, usedPct: 50 },
      { key: "Alice", allocated: 1, used: 1, allocatedPct: 100 / 3, usedPct: 100 / 3 },
    ]);
    expect(usageBars([row("idle", 0, 0, 0, 1)], 10)).toEqual([{ key: "idle", allocated: 0, used: 0, allocatedPct: 0, usedPct: 0 }]);
    expect(usageBars([], 10)).toEqual([]);
  });

  it("formats figures with two decimals", () => {
    expect(formatUsage(1234.5, "en-GB")).toBe("1,234.50");
    expect(formatUsage(0.0333, "en-GB")).toBe("0.03");
  });
});

import { describe, expect, it } from "vitest";

import { nextMonthStartUtc, vcBudget } from "./budget";

const NOVEMBER = new Date("2026-11-20T12:00:00Z");

function budgetOf(gpu_hours_per_month: number | null, gpu_hours_this_month: number, budget_spent = false) {
  return vcBudget({ gpu_hours_per_month, gpu_hours_this_month, budget_spent }, NOVEMBER, "en-US");
}

describe("nextMonthStartUtc", () => {
  it("is the first of the next month in UTC, into January after December", () => {
    expect(nextMonthStartUtc(NOVEMBER)).toBe("2026-12-01");
    expect(nextMonthStartUtc(new Date("2026-12-31T23:59:59Z"))).toBe("2027-01-01");
  });

  it("goes by UTC, not the local day", () => {
    // 23:30 on 30 November in New York is already December in UTC.
    expect(nextMonthStartUtc(new Date("2026-11-30T23:30:00-05:00"))).toBe("2027-01-01");
    expect(nextMonthStartUtc(new Date("2026-12-01T00:30:00+01:00"))).toBe("2026-12-01");
  });
});

describe("vcBudget", () => {
  it("is null without a budget", () => {
    expect(budgetOf(null, 312.5)).toBeNull();
  });

  it("says the hours used of the budget this month, with the percent", () => {
    expect(budgetOf(1000, 812.44)).toEqual({
      text: "812.4 of 1,000 GPU-hours used in November (UTC)",
      percent: 81,
      fillPercent: 81,
      level: "warning",
      resetsOn: "2026-12-01",
    });
  });

  it("turns to the warning color from 80 %, and shows 100 % only once it is all used", () => {
    expect(budgetOf(1000, 799.9)?.level).toBe("ok");
    expect(budgetOf(1000, 800)?.level).toBe("warning");
    expect(budgetOf(1000, 999.99)?.percent).toBe(99);
    expect(budgetOf(10, 0)).toMatchObject({ text: "0.0 of 10 GPU-hours used in November (UTC)", percent: 0, level: "ok" });
  });

  it("is spent when the portal says so, with the bar full and the percent past 100", () => {
    expect(budgetOf(1000, 1002.5, true)).toEqual({
      text: "1,002.5 of 1,000 GPU-hours used in November (UTC)",
      percent: 100,
      fillPercent: 100,
      level: "spent",
      resetsOn: "2026-12-01",
    });
    expect(budgetOf(100, 150, true)).toMatchObject({ percent: 150, fillPercent: 100 });
    expect(budgetOf(0, 0, true)).toMatchObject({ percent: 100, level: "spent" });
  });

  it("names the month in UTC", () => {
    const budget = vcBudget(
      { gpu_hours_per_month: 10, gpu_hours_this_month: 1, budget_spent: false },
      new Date("2026-12-01T00:30:00+01:00"),
      "en-US",
    );
    expect(budget).toMatchObject({ text: "1.0 of 10 GPU-hours used in November (UTC)", resetsOn: "2026-12-01" });
  });
});

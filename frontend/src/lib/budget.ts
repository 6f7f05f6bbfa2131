// A virtual cluster's monthly GPU-hour budget as the VC pages show it, apart from React so that
// it can be tested.

import type { VirtualCluster } from "../api/types";

/** From this share of the budget on, the bar turns to the warning color. */
export const BUDGET_WARNING_PERCENT = 80;

/** ok: below the warning share; warning: from it on; spent: the portal says the budget is spent. */
export type BudgetLevel = "ok" | "warning" | "spent";

export interface VcBudget {
  /** "812.4 of 1,000 GPU-hours used in November (UTC)". */
  text: string;
  /** Used of budget in whole percent, rounded down: "100 %" only once it is all used. Past 100
   * when running jobs went on after it was spent. */
  percent: number;
  /** The bar's width in percent: `percent`, at most 100. */
  fillPercent: number;
  level: BudgetLevel;
  /** The first day of the next month in UTC (YYYY-MM-DD): a spent budget's VC starts jobs again
   * then, as the portal's pending message says. */
  resetsOn: string;
}

type BudgetFields = Pick<VirtualCluster, "gpu_hours_per_month" | "gpu_hours_this_month" | "budget_spent">;

/** The first day of the month after `now`'s, in UTC, as YYYY-MM-DD. */
export function nextMonthStartUtc(now: Date): string {
  // Date.UTC rolls month 12 over into January of the next year.
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1)).toISOString().slice(0, 10);
}

/** The VC's budget this month, or null when it has none. Whether it is spent is the portal's
 * word (`budget_spent`), not recomputed here, so the page agrees with what the scheduler does. */
export function vcBudget(vc: BudgetFields, now: Date = new Date(), locale?: string): VcBudget | null {
  const budget = vc.gpu_hours_per_month;
  if (budget === null || budget === undefined) return null;
  const used = vc.gpu_hours_this_month;
  // One decimal for the hours used, as the portal's pending message has them.
  const usedText = used.toLocaleString(locale, { minimumFractionDigits: 1, maximumFractionDigits: 1 });
  const month = now.toLocaleString(locale, { month: "long", timeZone: "UTC" });
  // A budget of 0 is spent from the start of the month.
  const percent = budget > 0 ? Math.floor((100 * used) / budget) : 100;
  const level: BudgetLevel = vc.budget_spent ? "spent" : percent >= BUDGET_WARNING_PERCENT ? "warning" : "ok";
  return {
    text: `${usedText} of ${budget.toLocaleString(locale)} GPU-hours used in ${month} (UTC)`,
    percent,
    fillPercent: Math.min(100, percent),
    level,
    resetsOn: nextMonthStartUtc(now),
  };
}

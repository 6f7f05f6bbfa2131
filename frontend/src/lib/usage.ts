// The usage page's choices (kept in its URL) and the figures it shows, apart from React so
// that they can be tested.

import { query } from "../api/client";
import type { UsageGroup, UsageRow } from "../api/types";

export const USAGE_GROUPS: { value: UsageGroup; label: string }[] = [
  { value: "vc", label: "Virtual cluster" },
  { value: "user", label: "User" },
  { value: "tenant", label: "Tenant" },
  { value: "job", label: "Job" },
];

export interface UsageFilters {
  group: UsageGroup;
  /** The first day (YYYY-MM-DD, local time); "" leaves the API's default, 30 days ago. */
  from: string;
  /** The last day, included; "" leaves the API's default, now. */
  to: string;
}

const DAY = /^\d{4}-\d{2}-\d{2}$/;

/** The start of a local day given as YYYY-MM-DD, or of the day `plusDays` later. */
function localMidnight(day: string, plusDays = 0): Date {
  const [year = Number.NaN, month = Number.NaN, date = Number.NaN] = day.split("-").map(Number);
  return new Date(year, month - 1, date + plusDays);
}

function isDay(value: string): boolean {
  return DAY.test(value) && !Number.isNaN(localMidnight(value).getTime());
}

/** The filters in the page's URL; an unknown group or a malformed day falls back to the default. */
export function readUsageFilters(search: URLSearchParams): UsageFilters {
  const group = USAGE_GROUPS.find((g) => g.value === search.get("group"))?.value ?? "vc";
  const day = (name: string) => {
    const value = search.get(name) ?? "";
    return isDay(value) ? value : "";
  };
  return { group, from: day("from"), to: day("to") };
}

/** The page's URL for these filters; defaults stay out of it. */
export function usagePageUrl(filters: UsageFilters): string {
  return `/usage${query({ group: filters.group === "vc" ? undefined : filters.group, from: filters.from, to: filters.to })}`;
}

/** The API's query for these filters. Days are the user's local days, sent as the instants they
 * start; the API's `until` is not included, so the last day is sent as the start of the next. */
export function usageApiParams(filters: UsageFilters): { group: UsageGroup; since?: string; until?: string } {
  return {
    group: filters.group,
    since: filters.from ? localMidnight(filters.from).toISOString() : undefined,
    until: filters.to ? localMidnight(filters.to, 1).toISOString() : undefined,
  };
}

export type UsageOrder = "allocated" | "used" | "energy" | "jobs" | "name";

export const USAGE_ORDERS: [UsageOrder, string][] = [
  ["allocated", "most GPU-hours first"],
  ["used", "most used GPU-hours first"],
  ["energy", "most energy first"],
  ["jobs", "most jobs first"],
  ["name", "by name or job id"],
];

const FIGURES = {
  allocated: "allocated_gpu_hours",
  used: "used_gpu_hours",
  energy: "energy_kwh",
  jobs: "jobs",
} as const;

/** The rows in another order; figures largest first, names alphabetically (job ids by value).
 * Ties keep the API's order, which is by GPU-hours. */
export function sortUsageRows(rows: UsageRow[], order: UsageOrder): UsageRow[] {
  if (order === "name") {
    return [...rows].sort((a, b) => a.key.localeCompare(b.key, undefined, { numeric: true }));
  }
  const figure = FIGURES[order];
  return [...rows].sort((a, b) => b[figure] - a[figure]);
}

export interface UsageBar {
  key: string;
  allocated: number;
  used: number;
  /** Widths in percent of the longest bar. */
  allocatedPct: number;
  usedPct: number;
}

/** One bar per row, the largest `limit` by GPU-hours, all on the scale of the largest. */
export function usageBars(rows: UsageRow[], limit: number): UsageBar[] {
  const largest = sortUsageRows(rows, "allocated").slice(0, limit);
  const top = Math.max(0, ...largest.map((row) => Math.max(row.allocated_gpu_hours, row.used_gpu_hours)));
  const pct = (value: number) => (top > 0 ? (100 * value) / top : 0);
  return largest.map((row) => ({
    key: row.key,
    allocated: row.allocated_gpu_hours,
    used: row.used_gpu_hours,
    allocatedPct: pct(row.allocated_gpu_hours),
    usedPct: pct(row.used_gpu_hours),
  }));
}

/** GPU-hours and kWh with two decimals: the API's four are more than people compare. */
export function formatUsage(value: number, locale?: string): string {
  return value.toLocaleString(locale, { minimumFractionDigits: 2, maximumFractionDigits: 2 });
}

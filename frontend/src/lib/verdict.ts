// What the submit page's "Check" says: the portal's dry run of the spec (POST /api/v1/jobs/dry-run/).
import type { DryRun, WhatIfHint } from "../api/types";
import { formatRelative, formatTime } from "./format";

export interface VerdictText {
  /** The portal's own words: where it would start, or why it would wait. */
  headline: string;
  /** When it would start and its place in the queue, and whether scheduling is paused; null
   * for a job that starts now while scheduling runs. */
  detail: string | null;
}

/** A dry run's verdict in two lines. The reason's words are the portal's, as on a waiting
 * job's page, so the check says what the job itself would be told. */
export function verdictText(verdict: DryRun, now: number = Date.now()): VerdictText {
  const paused = verdict.scheduling_paused ? PAUSED_NOTE : null;
  if (verdict.would_start_now) return { headline: verdict.message, detail: paused };
  const start = verdict.estimated_start;
  const when = start ? `Estimated start ${formatRelative(start, now)} (${formatTime(start)})` : "No estimated start";
  const place = verdict.queue_position != null ? `, position ${verdict.queue_position} in the queue` : "";
  const detail = `${when}${place}.`;
  return { headline: `Would wait: ${verdict.message.replace(/\.$/, "")}.`, detail: paused ? `${detail} ${paused}` : detail };
}

/** The cycle's verdict holds once scheduling runs again; until then nothing starts. */
export const PAUSED_NOTE = "An admin has paused scheduling: nothing starts until it resumes.";

/** A hint's badge: "starts now", "starts in 2h", or "sooner" when the portal has no time. */
export function hintBadge(hint: WhatIfHint, now: number = Date.now()): string {
  if (hint.starts_now) return "starts now";
  return hint.estimated_start_at ? `starts ${formatRelative(hint.estimated_start_at, now)}` : "sooner";
}

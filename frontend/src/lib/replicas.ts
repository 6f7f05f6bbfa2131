// What the agents report of an attempt's replicas while they start (docs/agent.md, "What happens
// at start"): the job page shows it, with a bar for an image pull's progress.
import type { JobAttempt } from "../api/types";

export interface PullProgress {
  done: number;
  total: number;
}

/** How far an image pull got, read from the agent's message ("pulling IMAGE: 312 of 1,024 MiB");
 * null for a message without sizes (a pull before the engine knows them, anything else). */
export function pullProgress(message: string): PullProgress | null {
  const matches = [...message.matchAll(/(\d[\d,]*) of (\d[\d,]*) MiB/g)];
  const last = matches[matches.length - 1];
  if (!last) return null;
  const [, doneText = "", totalText = ""] = last;
  const done = Number(doneText.replaceAll(",", ""));
  const total = Number(totalText.replaceAll(",", ""));
  if (!Number.isFinite(done) || !Number.isFinite(total) || total <= 0) return null;
  return { done: Math.min(done, total), total };
}

/** An attempt's replicas are worth a look while it starts (a pull can take minutes), and
 * whenever one of them has something to say, such as why it could not start. */
export function showReplicas(attempt: JobAttempt | undefined): boolean {
  if (!attempt) return false;
  return attempt.state === "starting" || attempt.replicas_status.some((r) => r.message);
}

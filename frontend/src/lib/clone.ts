// The submit page's `/submit?clone=ID`: the form starts from job ID's spec.
import type { JobDetail } from "../api/types";

/**
 * The job the submit form starts from: null without `clone` in the URL (a new form, even while the
 * job of an earlier `?clone=` is still loaded) or when job ID could not be loaded; the job once the
 * job loaded is job ID; "loading" until then.
 */
export function cloneSource(
  cloneId: string | null,
  loaded: JobDetail | null | undefined,
  failed: boolean,
): JobDetail | null | "loading" {
  if (!cloneId) return null;
  if (loaded && String(loaded.id) === cloneId) return loaded;
  return failed ? null : "loading";
}

/** Whether the form replaces a job still waiting in the queue: "Resubmit like this" (a what-if
 * hint) from a pending job, which stays queued under the same name unless it is cancelled. */
export function replacesWaitingJob(cloneOf: Pick<JobDetail, "state"> | null, fromHint: boolean): boolean {
  return fromHint && cloneOf !== null && cloneOf.state === "pending";
}

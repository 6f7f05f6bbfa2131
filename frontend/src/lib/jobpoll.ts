// What the job page refreshes by polling, because no live message carries it: a pending job's
// reason, queue position, estimated start and hints, and the GPU-hours and energy of a job that
// holds GPUs (its usage grows while it runs; the socket says only when its state changes).
import type { Job } from "../api/types";

export const JOB_POLL_MS = 30_000;

/** States in which a job holds GPUs, so that its usage grows. */
const HOLDING = ["scheduled", "starting", "running", "suspended", "checkpointing"];

export function pollsJob(job: Pick<Job, "state">): boolean {
  return job.state === "pending" || (job.state !== undefined && HOLDING.includes(job.state));
}

// Hold and release on the job page (docs/api.md): a pending job is held and released; a running
// (or suspended) job with checkpointing is paused, which checkpoints and stops it, and resumed.
import type { Job } from "../api/types";

export interface HoldAction {
  action: "hold" | "release";
  label: "Hold" | "Pause" | "Release" | "Resume";
  /** What it does, or what the job now waits for, beside the button. */
  note: string;
}

/** Whether the job saves checkpoints: only then can it be paused without losing its work. */
export function checkpointable(job: Job & { spec?: unknown }): boolean {
  const spec = (job.spec ?? {}) as { checkpoint?: { enabled?: boolean } };
  return spec.checkpoint?.enabled === true;
}

/** The hold or release the job's page offers, or null: none for a running job without
 * checkpointing (pausing it would lose its work: the portal refuses), nor once it ended. A paused
 * job that saved no checkpoint (its detail's `checkpoints` empty) starts over when resumed. */
export function holdAction(job: Job & { spec?: unknown; checkpoints?: unknown[] }): HoldAction | null {
  if (job.on_hold) {
    if (!job.paused) return { action: "release", label: "Release", note: "Held: it does not start until released." };
    const saved = job.checkpoints === undefined || job.checkpoints.length > 0;
    const note =
      job.state !== "pending"
        ? "Pausing: it checkpoints and stops, then waits until resumed."
        : saved
          ? "Paused: it resumes from its checkpoint when resumed."
          : "Paused: it saved no checkpoint, so it starts over when resumed.";
    return { action: "release", label: "Resume", note };
  }
  if (job.state === "pending") {
    return { action: "hold", label: "Hold", note: "Hold it: it keeps its place but does not start until released." };
  }
  if ((job.state === "running" || job.state === "suspended") && checkpointable(job)) {
    return {
      action: "hold",
      label: "Pause",
      note: "Pause it: it checkpoints and stops, freeing its GPUs, and resumes from its checkpoint when resumed.",
    };
  }
  return null;
}

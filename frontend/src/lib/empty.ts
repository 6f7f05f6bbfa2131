// What the job page says where it has nothing to show: a job that has not started yet is not
// one that never ran, nor one that ended without output or telemetry.

export function emptyOutputText(attempt: number | null, ended: boolean, hasLines: boolean): string {
  if (attempt === null) return ended ? "The job never ran." : "The job has not started yet.";
  if (hasLines) return "No line matches.";
  return ended ? "The job printed nothing." : "No output yet.";
}

export function emptyTelemetryText(attempt: number | null, ended: boolean): string {
  if (attempt === null && ended) return "The job never ran.";
  return ended ? "No telemetry was recorded." : "No samples yet.";
}

import type { ReactNode } from "react";

import type { Job } from "../api/types";
import { Link } from "../router";
import { Relative, StateBadge } from "./common";

export interface JobTableProps {
  jobs: Job[];
  caption: string;
  /** Extra leading column (e.g. a selection checkbox). */
  lead?: (job: Job) => ReactNode;
  leadHeader?: ReactNode;
  showQueue?: boolean;
}

/** Jobs as a table on wide screens; each row becomes a card on a phone (see styles.css). */
export function JobTable({ jobs, caption, lead, leadHeader, showQueue }: JobTableProps) {
  return (
    <div className="table-wrap">
      <table className="jobs">
        <caption className="visually-hidden">{caption}</caption>
        <thead>
          <tr>
            {lead && <th scope="col">{leadHeader}</th>}
            {showQueue && <th scope="col">#</th>}
            <th scope="col">Job</th>
            <th scope="col">State</th>
            <th scope="col">VC</th>
            <th scope="col">Owner</th>
            <th scope="col">GPUs</th>
            <th scope="col">{showQueue ? "Why waiting" : "Submitted"}</th>
          </tr>
        </thead>
        <tbody>
          {jobs.map((job) => (
            <tr key={job.id} data-job-id={job.id}>
              {lead && <td className="lead">{lead(job)}</td>}
              {showQueue && <td data-label="Position">{job.queue_position ?? "–"}</td>}
              <td data-label="Job">
                <Link href={`/jobs/${job.id}`} className="job-link">
                  {job.name}
                </Link>{" "}
                <span className="muted">#{job.id}</span>
              </td>
              <td data-label="State">
                <StateBadge state={job.state} />
                {!showQueue && job.state === "pending" && job.pending_reason && (
                  <span className="muted small reason-code" title={job.pending_message || undefined}>
                    {" "}
                    {job.pending_reason}
                  </span>
                )}
              </td>
              <td data-label="VC">{job.vc}</td>
              <td data-label="Owner">{job.owner}</td>
              <td data-label="GPUs">
                {job.total_gpus} × {job.gpu_model}
              </td>
              {showQueue ? (
                <td data-label="Why waiting" className="reason">
                  {job.pending_message || job.pending_reason || "–"}
                  {job.estimated_start_at && (
                    <span className="muted"> · start <Relative iso={job.estimated_start_at} /></span>
                  )}
                </td>
              ) : (
                <td data-label="Submitted">
                  <Relative iso={job.submitted_at} />
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

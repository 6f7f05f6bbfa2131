import type { Allocation, JobAttempt } from "../api/types";
import { elapsedSeconds, formatDuration, formatTime } from "../lib/format";
import { StateBadge } from "./common";

/** "node-1: GPUs 0,1 · node-2: GPUs 0,1" per replica. */
export function placementText(allocations: Allocation[]): string {
  const byReplica = new Map<number, Map<string, number[]>>();
  for (const a of allocations) {
    const replica = a.replica ?? 0;
    const nodes = byReplica.get(replica) ?? new Map<string, number[]>();
    nodes.set(a.node, [...(nodes.get(a.node) ?? []), a.gpu_index]);
    byReplica.set(replica, nodes);
  }
  return [...byReplica.entries()]
    .sort(([a], [b]) => a - b)
    .map(([replica, nodes]) => {
      const where = [...nodes.entries()].map(([node, gpus]) => `${node} GPU ${gpus.sort((x, y) => x - y).join(",")}`).join("; ");
      return byReplica.size > 1 ? `replica ${replica}: ${where}` : where;
    })
    .join(" · ");
}

export function AttemptsTable({ attempts }: { attempts: JobAttempt[] }) {
  return (
    <div className="table-wrap">
      <table className="attempts">
        <caption className="visually-hidden">Attempts</caption>
        <thead>
          <tr>
            <th scope="col">#</th>
            <th scope="col">State</th>
            <th scope="col">Placement</th>
            <th scope="col">Started</th>
            <th scope="col">Ran</th>
            <th scope="col">Exit</th>
          </tr>
        </thead>
        <tbody>
          {attempts.map((a) => (
            <tr key={a.number}>
              <td data-label="Attempt">
                {a.number}
                {a.resume && <span className="muted"> (resumed)</span>}
              </td>
              <td data-label="State">
                <StateBadge state={a.state} />
              </td>
              <td data-label="Placement">{a.allocations.length ? placementText(a.allocations) : "–"}</td>
              <td data-label="Started">{formatTime(a.started_at)}</td>
              <td data-label="Ran">{a.started_at ? formatDuration(elapsedSeconds(a.started_at, a.ended_at)) : "–"}</td>
              <td data-label="Exit">
                {a.exit_code ?? "–"}
                {a.end_reason && <span className="muted"> {a.end_reason}</span>}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

import type { ReplicaStatus } from "../api/types";
import { pullProgress } from "../lib/replicas";
import { StateBadge } from "./common";

/** "replica 0 on a100-node-1: starting — pulling IMAGE: 312 of 1,024 MiB", with a bar for a pull. */
export function ReplicaStatusList({ replicas }: { replicas: ReplicaStatus[] }) {
  return (
    <ul className="replica-status" aria-label="Replicas">
      {replicas.map((r) => {
        const progress = pullProgress(r.message);
        return (
          <li key={r.replica}>
            <span className="replica-where">
              replica {r.replica} on {r.node || "–"}:
            </span>{" "}
            {r.state ? <StateBadge state={r.state} /> : <span className="badge">not reported yet</span>}
            {r.exit_code !== null && <span className="muted"> exit {r.exit_code}</span>}
            {r.message && <span className="replica-message"> — {r.message}</span>}
            {progress && (
              <progress
                max={progress.total}
                value={progress.done}
                aria-label={`Image pull of replica ${r.replica}`}
                title={`${Math.floor((100 * progress.done) / progress.total)}%`}
              />
            )}
          </li>
        );
      })}
    </ul>
  );
}

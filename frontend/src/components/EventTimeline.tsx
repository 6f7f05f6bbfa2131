import type { JobEvent } from "../api/types";
import { formatTime } from "../lib/format";
import { StateBadge } from "./common";

export function EventTimeline({ events }: { events: JobEvent[] }) {
  return (
    <ol className="timeline">
      {events.map((e) => (
        <li key={e.id}>
          <time dateTime={e.created_at}>{formatTime(e.created_at)}</time>
          <div>
            <div className="transition">
              {e.from_state ? <StateBadge state={e.from_state} /> : <span className="muted">new</span>}
              <span aria-hidden="true"> → </span>
              <span className="visually-hidden"> to </span>
              {e.to_state ? <StateBadge state={e.to_state} /> : <span className="muted">–</span>}
              {e.actor_label && <span className="muted"> by {e.actor_label}</span>}
            </div>
            {e.reason && <p className="event-reason">{e.reason}</p>}
          </div>
        </li>
      ))}
    </ol>
  );
}

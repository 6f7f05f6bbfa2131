import { useLayoutEffect, useRef } from "react";
import type { JobEvent } from "../api/types";
import { formatTime } from "../lib/format";
import { StateBadge } from "./common";

/** Pixels from the bottom that still count as "reading the latest". */
const AT_END_PX = 8;

export function EventTimeline({ events }: { events: JobEvent[] }) {
  // The list scrolls inside its card, oldest first. The latest events are what a reader came
  // for, so it opens at the end and follows new events, unless the reader scrolled up.
  const list = useRef<HTMLOListElement>(null);
  const following = useRef(true);
  useLayoutEffect(() => {
    const el = list.current;
    if (el && following.current) el.scrollTop = el.scrollHeight;
  }, [events.length]);
  return (
    <ol
      className="timeline"
      ref={list}
      aria-label="Events"
      tabIndex={0}
      onScroll={(e) => {
        const el = e.currentTarget;
        following.current = el.scrollTop + el.clientHeight >= el.scrollHeight - AT_END_PX;
      }}
    >
      {events.map((e) => (
        <li key={e.id}>
          <time dateTime={e.created_at}>{formatTime(e.created_at)}</time>
          <div>
            <div className="transition">
              {e.to_state ? (
                <>
                  {e.from_state ? <StateBadge state={e.from_state} /> : <span className="muted">new</span>}
                  <span aria-hidden="true"> → </span>
                  <span className="visually-hidden"> to </span>
                  <StateBadge state={e.to_state} />
                </>
              ) : (
                // An event without a transition (a hold, a move in the queue, a warning).
                <span className="muted">note</span>
              )}
              {e.actor_label && <span className="muted"> by {e.actor_label}</span>}
            </div>
            {e.reason && <p className="event-reason">{e.reason}</p>}
          </div>
        </li>
      ))}
    </ol>
  );
}

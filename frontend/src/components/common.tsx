import { type ReactNode, useEffect } from "react";

import type { JobState } from "../api/types";
import type { LiveStatus } from "../api/live";
import { useNow } from "../lib/clock";
import { formatRelative, formatTime } from "../lib/format";

export function StateBadge({ state }: { state: JobState | string | undefined }) {
  const s = state ?? "unknown";
  return <span className={`badge state-${s}`}>{s}</span>;
}

export function ErrorBanner({ error, onRetry }: { error: Error | null | string; onRetry?: () => void }) {
  if (!error) return null;
  const message = typeof error === "string" ? error : error.message;
  return (
    <div className="error-banner" role="alert">
      <span>{message}</span>
      {onRetry && (
        <button type="button" className="button small" onClick={onRetry}>
          Try again
        </button>
      )}
    </div>
  );
}

export function Spinner({ label = "Loading" }: { label?: string }) {
  return (
    <span className="spinner" role="status">
      <span className="spinner-dot" aria-hidden="true" />
      {label}…
    </span>
  );
}

export function LiveIndicator({ status }: { status: LiveStatus }) {
  const text = status === "live" ? "Live" : status === "connecting" ? "Connecting" : "Offline, reconnecting";
  return (
    <span className={`live-indicator live-${status}`} role="status" title="Live updates">
      <span className="dot" aria-hidden="true" />
      {text}
    </span>
  );
}

export function PageHeader({ title, docTitle, children }: { title: ReactNode; docTitle?: string; children?: ReactNode }) {
  const text = docTitle ?? (typeof title === "string" ? title : undefined);
  useEffect(() => {
    if (text) document.title = `${text} · GPU Portal`;
  }, [text]);
  return (
    <div className="page-header">
      <h1>{title}</h1>
      {children && <div className="page-actions">{children}</div>}
    </div>
  );
}

export function Section({ title, children, actions }: { title: string; children: ReactNode; actions?: ReactNode }) {
  const id = `section-${title.toLowerCase().replace(/[^a-z0-9]+/g, "-")}`;
  return (
    <section className="card" aria-labelledby={id}>
      <div className="card-header">
        <h2 id={id}>{title}</h2>
        {actions}
      </div>
      {children}
    </section>
  );
}

/** A relative time ("7s ago", "in 3m") that moves on with the shared clock; its absolute time,
 * with the zone, in a tooltip. */
export function Relative({ iso, empty }: { iso: string | null | undefined; empty?: string }) {
  const now = useNow();
  if (!iso) return <>{empty ?? "–"}</>;
  return (
    <time dateTime={iso} title={formatTime(iso, now)}>
      {formatRelative(iso, now)}
    </time>
  );
}

export function Empty({ children }: { children: ReactNode }) {
  return <p className="empty">{children}</p>;
}

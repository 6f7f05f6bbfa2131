import { useCallback, useEffect, useRef, useState } from "react";

import { api, query } from "../api/client";
import type { LiveLogLine } from "../api/live";
import type { LogLine, Page } from "../api/types";
import { emptyOutputText } from "../lib/empty";
import { lastRedraw, pluralize } from "../lib/format";
import { fetchTail } from "../lib/tail";
import { ErrorBanner, Spinner } from "./common";

export interface ShownLine {
  key: string;
  replica: number;
  stream: string;
  text: string;
}

const MAX_LINES = 5000;
const PAGE = 1000;

function keyOf(attempt: number, l: { replica: number; stream: string; seq: number }): string {
  return `${attempt}:${l.replica}:${l.stream}:${l.seq}`;
}

/** Every line of the attempt, oldest first (for the download). */
async function fetchLines(jobId: number, attempt: number, onPage?: (n: number) => void): Promise<LogLine[]> {
  const out: LogLine[] = [];
  let after: number | undefined;
  for (;;) {
    const page = await api<Page<LogLine>>(`/api/v1/jobs/${jobId}/logs/${query({ attempt, after, limit: PAGE })}`);
    out.push(...page.results);
    onPage?.(out.length);
    const last = page.results[page.results.length - 1];
    if (!page.next || !last) return out;
    after = last.id;
  }
}

/**
 * The output of one attempt: its last MAX_LINES lines loaded over REST, then followed live. `liveLines` is fed by the
 * page's socket handler; `resyncToken` changes after a reconnect to reload what was missed.
 */
export function useLogLines(jobId: number, attempt: number | null, resyncToken: number) {
  const [lines, setLines] = useState<ShownLine[]>([]);
  const seen = useRef(new Set<string>());
  const [loading, setLoading] = useState(false);
  const [error, setError] = useState<Error | null>(null);

  const add = useCallback((incoming: ShownLine[]) => {
    const fresh = incoming.filter((l) => !seen.current.has(l.key));
    if (!fresh.length) return;
    fresh.forEach((l) => seen.current.add(l.key));
    setLines((old) => {
      const next = old.concat(fresh);
      return next.length > MAX_LINES ? next.slice(next.length - MAX_LINES) : next;
    });
  }, []);

  useEffect(() => {
    seen.current = new Set();
    setLines([]);
  }, [jobId, attempt]);

  useEffect(() => {
    if (attempt === null) return;
    let stop = false;
    setLoading(true);
    fetchTail((offset, limit) => api<Page<LogLine>>(`/api/v1/jobs/${jobId}/logs/${query({ attempt, offset, limit })}`), MAX_LINES, PAGE)
      .then((rows) => {
        if (!stop) add(rows.map((r) => ({ key: keyOf(attempt, { ...r, replica: r.replica ?? 0 }), replica: r.replica ?? 0, stream: r.stream, text: r.text })));
        if (!stop) setError(null);
      })
      .catch((err: unknown) => !stop && setError(err instanceof Error ? err : new Error(String(err))))
      .finally(() => !stop && setLoading(false));
    return () => {
      stop = true;
    };
  }, [jobId, attempt, resyncToken, add]);

  const addLive = useCallback(
    (liveAttempt: number, incoming: LiveLogLine[]) => {
      if (liveAttempt !== attempt) return;
      add(incoming.map((l) => ({ key: keyOf(liveAttempt, l), replica: l.replica, stream: l.stream, text: l.text })));
    },
    [attempt, add],
  );

  return { lines, loading, error, addLive };
}

export function LogView({
  jobId,
  attempts,
  attempt,
  setAttempt,
  lines,
  loading,
  error,
  ended = false,
}: {
  jobId: number;
  attempts: number[];
  attempt: number | null;
  setAttempt: (n: number) => void;
  lines: ShownLine[];
  loading: boolean;
  error: Error | null;
  /** The job has ended: nothing more will come. */
  ended?: boolean;
}) {
  const [follow, setFollow] = useState(true);
  const [stream, setStream] = useState<"all" | "stdout" | "stderr">("all");
  const [find, setFind] = useState("");
  const [download, setDownload] = useState<string | null>(null);
  const [downloadError, setDownloadError] = useState<Error | null>(null);
  const box = useRef<HTMLPreElement>(null);
  const replicas = new Set(lines.map((l) => l.replica));
  const needle = find.trim().toLowerCase();
  const shown = lines.filter(
    (l) => (stream === "all" || l.stream === stream) && (!needle || l.text.toLowerCase().includes(needle)),
  );

  useEffect(() => {
    if (follow && box.current) box.current.scrollTop = box.current.scrollHeight;
  }, [shown.length, follow]);

  const save = async () => {
    if (attempt === null) return;
    setDownload("Preparing…");
    setDownloadError(null);
    try {
      const rows = await fetchLines(jobId, attempt, (n) => setDownload(`Preparing… ${n} lines`));
      const text = rows.map((r) => (replicas.size > 1 ? `[${r.replica}] ${r.text}` : r.text)).join("\n");
      const url = URL.createObjectURL(new Blob([text + "\n"], { type: "text/plain" }));
      const a = document.createElement("a");
      a.href = url;
      a.download = `job-${jobId}-attempt-${attempt}.log`;
      a.click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (err) {
      setDownloadError(err instanceof Error ? err : new Error(String(err)));
    } finally {
      setDownload(null);
    }
  };

  return (
    <div className="log-view">
      <div className="toolbar wrap">
        {attempts.length > 1 && (
          <label>
            Attempt{" "}
            <select value={attempt ?? ""} onChange={(e) => setAttempt(Number(e.target.value))}>
              {attempts.map((n) => (
                <option key={n} value={n}>
                  {n}
                </option>
              ))}
            </select>
          </label>
        )}
        <label>
          Stream{" "}
          <select value={stream} onChange={(e) => setStream(e.target.value as typeof stream)}>
            <option value="all">all</option>
            <option value="stdout">stdout</option>
            <option value="stderr">stderr</option>
          </select>
        </label>
        <label>
          Find{" "}
          <input type="search" className="log-find" value={find} placeholder="text in the output" onChange={(e) => setFind(e.target.value)} />
        </label>
        <label className="checkbox">
          <input type="checkbox" checked={follow} onChange={(e) => setFollow(e.target.checked)} /> Follow
        </label>
        <button type="button" className="button small" onClick={save} disabled={attempt === null || download !== null}>
          {download ?? "Download"}
        </button>
        <span className="muted small">
          {needle || stream !== "all" ? `${shown.length} of ${pluralize(lines.length, "line")}` : pluralize(lines.length, "line")}
          {lines.length >= MAX_LINES && ` (the last ${MAX_LINES}; Download has all)`}
        </span>
        {loading && <Spinner label="Loading output" />}
      </div>
      <ErrorBanner error={error ?? downloadError} />
      <pre ref={box} className="log" tabIndex={0} aria-label="Job output" aria-live="off" data-testid="log">
        {shown.length === 0 ? (
          <span className="muted">
            {emptyOutputText(attempt, ended, lines.length > 0)}
          </span>
        ) : (
          shown.map((l) => (
            <div key={l.key} className={l.stream === "stderr" ? "log-line stderr" : "log-line"}>
              {replicas.size > 1 && <span className="replica">[{l.replica}] </span>}
              {lastRedraw(l.text)}
            </div>
          ))
        )}
      </pre>
    </div>
  );
}

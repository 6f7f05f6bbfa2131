import { useCallback, useEffect, useRef, useState } from "react";

import { type ShellEnd, ShellSession, describeEnd } from "../api/shell";
import { DEFAULT_COLS, DEFAULT_ROWS, Screen } from "../lib/terminal";
import { ErrorBanner, Spinner } from "./common";
import { Terminal, type TerminalHandle } from "./Terminal";

type Status = { phase: "connecting" } | { phase: "open"; node: string } | { phase: "ended"; end: ShellEnd };

/**
 * A shell in one replica of a running job (its owner's), in a terminal. It connects when shown,
 * says where it is connected and, once the shell ended, why, with a Reconnect button. Jobs with
 * several replicas get a replica choice; choosing another one connects to it.
 */
export function ShellPanel({ jobId, replicas }: { jobId: number; replicas: number }) {
  const [replica, setReplica] = useState(0);
  const [attempt, setAttempt] = useState(0); // changes on Reconnect
  const [status, setStatus] = useState<Status>({ phase: "connecting" });
  const [notice, setNotice] = useState<string | null>(null);
  const [screen, setScreen] = useState(() => new Screen());
  const [version, setVersion] = useState(0);
  const size = useRef({ cols: DEFAULT_COLS, rows: DEFAULT_ROWS });
  const session = useRef<ShellSession | null>(null);
  const terminal = useRef<TerminalHandle>(null);

  useEffect(() => {
    const fresh = new Screen(size.current.cols, size.current.rows);
    // Output goes into the screen as it comes (its scrollback is bounded, and queries are answered
    // at once, even in a background tab, where animation frames wait); a burst of output frames is
    // drawn once, at the next animation frame.
    let frame: number | null = null;
    const draw = () => {
      frame = null;
      setVersion((v) => v + 1);
    };
    setScreen(fresh);
    setStatus({ phase: "connecting" });
    setNotice(null);
    const current = new ShellSession(jobId, replica, size.current, {
      onOpened: ({ node }) => {
        setStatus({ phase: "open", node });
        terminal.current?.focus();
      },
      onOutput: (data) => {
        fresh.write(data);
        for (const reply of fresh.takeReplies()) current.send(reply);
        if (frame === null) frame = window.requestAnimationFrame(draw);
      },
      onEnded: (end) => {
        if (frame !== null) window.cancelAnimationFrame(frame);
        draw();
        setStatus({ phase: "ended", end });
      },
      onError: (message) => setNotice(message),
    });
    session.current = current;
    return () => {
      if (frame !== null) window.cancelAnimationFrame(frame);
      current.close();
      if (session.current === current) session.current = null;
    };
  }, [jobId, replica, attempt]);

  const onInput = useCallback((data: string) => session.current?.send(data), []);
  const onResize = useCallback(
    (cols: number, rows: number) => {
      size.current = { cols, rows };
      screen.resize(cols, rows);
      session.current?.resize(cols, rows);
      setVersion((v) => v + 1);
    },
    [screen],
  );

  const open = status.phase === "open";
  const replicaLabel = replicas > 1 ? `, replica ${replica}` : "";
  return (
    <div className="shell-panel">
      <div className="toolbar wrap">
        {replicas > 1 && (
          <label>
            Replica{" "}
            <select value={replica} onChange={(e) => setReplica(Number(e.target.value))}>
              {Array.from({ length: replicas }, (_, n) => (
                <option key={n} value={n}>
                  {n}
                </option>
              ))}
            </select>
          </label>
        )}
        <ShellStatus status={status} replica={replicas > 1 ? replica : null} />
        {status.phase === "ended" && (
          <button type="button" className="button small" onClick={() => setAttempt((n) => n + 1)}>
            Reconnect
          </button>
        )}
      </div>
      <ErrorBanner error={notice} />
      <Terminal
        screen={screen}
        version={version}
        label={`Shell in job ${jobId}${replicaLabel}`}
        active={open}
        onInput={onInput}
        onResize={onResize}
        handle={terminal}
      />
      <p className="hint">
        Keys go to the shell while the terminal has the focus; Shift+Tab leaves it. Select text and press Ctrl+C to copy it;
        Ctrl+V pastes.
      </p>
    </div>
  );
}

function ShellStatus({ status, replica }: { status: Status; replica: number | null }) {
  const where = replica === null ? "" : ` replica ${replica}`;
  if (status.phase === "connecting") return <Spinner label={`Connecting${where ? ` to${where}` : ""}`} />;
  if (status.phase === "open") {
    return (
      <span className="shell-status" role="status">
        <span className="badge ok">connected</span>
        {where ? ` to${where} on node ` : " to node "}
        <code>{status.node || "?"}</code>
      </span>
    );
  }
  const { message, detail } = describeEnd(status.end);
  return (
    <span className="shell-status" role="status">
      <span className="badge">ended</span> {message}
      {detail && <span className="muted"> ({detail})</span>}
    </span>
  );
}

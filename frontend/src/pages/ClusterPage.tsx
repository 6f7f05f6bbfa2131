import { useEffect, useId, useRef, useState } from "react";

import { api, fetchAll } from "../api/client";
import { useLive } from "../api/live";
import type { ClusterNode, Gpu } from "../api/types";
import { GpuModelUse } from "../components/charts";
import { Empty, ErrorBanner, PageHeader, Relative, Section, Spinner } from "../components/common";
import { type NodeAction, drainQuestion, gpuReadingText, gpuUseByModel, nodeActions, nodeSpecText, readingIsCurrent } from "../lib/cluster";
import { useNow } from "../lib/clock";
import { formatInteger, formatRelative } from "../lib/format";
import { useResource } from "../lib/useResource";
import { useEvery, useSoon } from "../lib/useSoon";
import { Link } from "../router";
import { useSession } from "../session";

function gpuStatus(gpu: Gpu, node: ClusterNode): "allocated" | "free" | "unhealthy" | "unavailable" {
  if (gpu.healthy === false) return "unhealthy";
  if (gpu.allocated) return "allocated";
  if (node.state && node.state !== "ready") return "unavailable";
  return "free";
}

export function ClusterPage() {
  const { me } = useSession();
  const nodes = useResource((signal) => fetchAll<ClusterNode>("/api/v1/nodes/", signal), "nodes");
  const soon = useSoon(nodes.reload, 1000);
  // Allocation changes come with job changes; node health is refreshed by the fallback poll.
  useLive("jobs", (m) => m.kind === "job" && soon(), nodes.reload, 15_000);
  // GPU readings change every second; the grid shows them fresh within a few.
  useEvery(5_000, nodes.reload);

  return (
    <>
      <PageHeader title="Cluster" />
      <ErrorBanner error={nodes.error} onRetry={nodes.reload} />
      {nodes.loading && !nodes.data && <Spinner />}
      {nodes.data && (
        <>
          <Section title="GPUs by model">
            <div className="grid-2 tight">
              {gpuUseByModel(nodes.data).map((use) => (
                <GpuModelUse key={use.model} use={use} />
              ))}
            </div>
          </Section>
          <Section title="Nodes">
            <GpuLegend />
            {nodes.data.length === 0 && <Empty>No nodes are registered.</Empty>}
            <div className="node-grid">
              {nodes.data.map((node) => (
                <NodeCard key={node.id} node={node} canManage={me.is_staff} onChanged={nodes.reload} />
              ))}
            </div>
          </Section>
        </>
      )}
    </>
  );
}

function GpuLegend() {
  return (
    <ul className="legend">
      {(["allocated", "free", "unavailable", "unhealthy"] as const).map((s) => (
        <li key={s}>
          <span className={`swatch gpu-${s}`} aria-hidden="true" /> {s}
        </li>
      ))}
    </ul>
  );
}

function NodeCard({ node, canManage, onChanged }: { node: ClusterNode; canManage: boolean; onChanged: () => void }) {
  const groups = new Map<string, Gpu[]>();
  for (const gpu of [...node.gpus].sort((a, b) => a.index - b.index)) {
    const key = `NUMA ${gpu.numa_node ?? 0}`;
    groups.set(key, [...(groups.get(key) ?? []), gpu]);
  }
  return (
    <article className="node-card" aria-label={`Node ${node.name}`}>
      <header>
        <h3>{node.name}</h3>
        <span className={`badge node-${node.state ?? "unknown"}`}>{node.state}</span>
      </header>
      <p className="muted small">
        {nodeSpecText(node)} · heartbeat{" "}
        <Relative iso={node.last_heartbeat_at} />
      </p>
      {node.state_reason && <p className="small">{node.state_reason}</p>}
      {[...groups.entries()].map(([group, gpus]) => (
        <div key={group} className="gpu-group">
          <span className="muted small">{group}</span>
          <ul className="gpu-cells">
            {gpus.map((gpu) => (
              <GpuCell key={gpu.uuid} gpu={gpu} node={node} />
            ))}
          </ul>
        </div>
      ))}
      {canManage && <NodeActions node={node} onChanged={onChanged} />}
    </article>
  );
}

function GpuCell({ gpu, node }: { gpu: Gpu; node: ClusterNode }) {
  const now = useNow();
  const s = gpuStatus(gpu, node);
  const reading = gpu.latest;
  // A silent agent's last reading is not the GPU's load now: only its label keeps it, with its age.
  const current = readingIsCurrent(reading, node.state, now);
  const utilization = current ? (reading?.utilization_pct ?? null) : null;
  const readingText = reading ? gpuReadingText(reading) : "";
  const parts = [
    `GPU ${gpu.index} ${gpu.model}, ${formatInteger(gpu.memory_mb / 1024)} GB, ${s}${gpu.health_reason ? `: ${gpu.health_reason}` : ""}`,
    gpu.job ? `job ${gpu.job}` : null,
    reading && readingText ? (current ? readingText : `no current reading (last ${formatRelative(reading.time, now)}: ${readingText})`) : null,
    `NVLink group ${gpu.nvlink_group ?? "–"}, PCIe switch ${gpu.pcie_switch ?? "–"}`,
  ];
  const text = parts.filter(Boolean).join("; ");
  const body = (
    <>
      <span className="gpu-index">{gpu.index}</span>
      {utilization !== null && <span className="gpu-util">{Math.round(utilization)}%</span>}
      {utilization !== null && (
        <span className="gpu-util-bar" aria-hidden="true" style={{ width: `${Math.min(100, Math.max(0, utilization))}%` }} />
      )}
    </>
  );
  return (
    <li className={`gpu-cell gpu-${s}`} title={text} aria-label={text} tabIndex={gpu.job ? undefined : 0}>
      {gpu.job ? (
        <Link href={`/jobs/${gpu.job}`} className="gpu-job-link">
          {body}
        </Link>
      ) : (
        body
      )}
    </li>
  );
}

function NodeActions({ node, onChanged }: { node: ClusterNode; onChanged: () => void }) {
  const [busy, setBusy] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  // Why the node is cordoned or drained, for the other admins and the node's card (optional).
  const [reason, setReason] = useState("");
  // Drain moves every job on the node away, so it is asked once more, with what it would move
  // (as a job's cancel is); the question follows the node's jobs while it is open.
  const [confirmingDrain, setConfirmingDrain] = useState(false);
  const questionId = useId();
  const box = useRef<HTMLDivElement>(null);
  const drainButton = useRef<HTMLButtonElement>(null);
  // Where the focus goes once the question's buttons are gone: back to Drain (kept, or refused),
  // or, once drained, to what replaces it (Make ready) when the node's new state arrives.
  const focusAfter = useRef<"drain" | "next" | null>(null);
  const actions = nodeActions(node.state);
  const takesReason = actions.some(([action]) => action !== "uncordon");
  const asking = confirmingDrain && actions.some(([action]) => action === "drain");
  useEffect(() => {
    if (asking || focusAfter.current === null) return;
    if (drainButton.current) {
      drainButton.current.focus();
      if (focusAfter.current === "drain") focusAfter.current = null;
    } else {
      box.current?.querySelector("button")?.focus();
      focusAfter.current = null;
    }
  }, [asking, node.state]);
  const keep = () => {
    focusAfter.current = "drain";
    setConfirmingDrain(false);
  };
  const run = async (action: NodeAction) => {
    setBusy(action);
    setError(null);
    try {
      const body = action === "uncordon" ? { action } : { action, reason: reason.trim() };
      await api(`/api/v1/nodes/${encodeURIComponent(node.name)}/state/`, { method: "POST", body });
      setReason("");
      if (action === "drain") focusAfter.current = "next";
      onChanged();
    } catch (err) {
      if (action === "drain") focusAfter.current = "drain";
      setError(err instanceof Error ? err.message : String(err));
    } finally {
      setBusy(null);
      setConfirmingDrain(false);
    }
  };
  return (
    <div className="node-actions" ref={box}>
      {takesReason && (
        <input
          type="text"
          className="node-reason"
          maxLength={200}
          placeholder="Reason (optional)"
          aria-label={`Reason to cordon or drain ${node.name}`}
          value={reason}
          onChange={(e) => setReason(e.target.value)}
        />
      )}
      {asking ? (
        <span
          className="confirm"
          role="group"
          aria-label={`Confirm drain of ${node.name}`}
          onKeyDown={(e) => {
            if (e.key === "Escape" && busy === null) keep();
          }}
        >
          <span id={questionId}>{drainQuestion(node)}</span>
          {/* Focused when asked; a screen reader reads the question with it. Escape keeps the node as it is. */}
          <button
            type="button"
            className="button small danger"
            aria-describedby={questionId}
            onClick={() => run("drain")}
            disabled={busy !== null}
            autoFocus
          >
            {busy === "drain" ? "Draining…" : "Yes, drain"}
          </button>
          <button type="button" className="button small ghost" onClick={keep} disabled={busy !== null}>
            Keep
          </button>
        </span>
      ) : (
        actions.map(([action, label]) => (
          <button
            key={action}
            ref={action === "drain" ? drainButton : undefined}
            type="button"
            className="button small"
            disabled={busy !== null}
            onClick={() => {
              if (action === "drain") {
                setError(null);
                setConfirmingDrain(true);
              } else void run(action);
            }}
          >
            {busy === action ? `${label}…` : label}
          </button>
        ))
      )}
      {error && (
        <span className="field-error" role="alert">
          {error}
        </span>
      )}
    </div>
  );
}

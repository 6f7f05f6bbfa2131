import { fetchAll } from "../api/client";
import { useLive } from "../api/live";
import type { ClusterNode, Gpu } from "../api/types";
import { StackedBar } from "../components/charts";
import { Empty, ErrorBanner, PageHeader, Section, Spinner } from "../components/common";
import { gpuUseByModel } from "../lib/cluster";
import { formatRelative } from "../lib/format";
import { useResource } from "../lib/useResource";
import { useEvery, useSoon } from "../lib/useSoon";

function gpuStatus(gpu: Gpu, node: ClusterNode): "allocated" | "free" | "unhealthy" | "unavailable" {
  if (gpu.healthy === false) return "unhealthy";
  if (gpu.allocated) return "allocated";
  if (node.state && node.state !== "ready") return "unavailable";
  return "free";
}

export function ClusterPage() {
  const nodes = useResource((signal) => fetchAll<ClusterNode>("/api/v1/nodes/", signal), "nodes");
  const soon = useSoon(nodes.reload, 1000);
  // Allocation changes come with job changes; node health is refreshed by the fallback poll.
  useLive("jobs", (m) => m.kind === "job" && soon(), nodes.reload, 15_000);
  useEvery(30_000, nodes.reload);

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
                <div key={use.model}>
                  <h3>
                    {use.model} <span className="muted">{use.total} GPUs</span>
                  </h3>
                  <StackedBar
                    label={`${use.model} GPUs`}
                    parts={[
                      { label: "allocated", value: use.allocated, className: "part-allocated" },
                      { label: "free", value: use.free, className: "part-free" },
                      { label: "unavailable", value: use.unhealthy, className: "part-unavailable" },
                    ]}
                  />
                </div>
              ))}
            </div>
          </Section>
          <Section title="Nodes">
            <GpuLegend />
            {nodes.data.length === 0 && <Empty>No nodes are registered.</Empty>}
            <div className="node-grid">
              {nodes.data.map((node) => (
                <NodeCard key={node.id} node={node} />
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

function NodeCard({ node }: { node: ClusterNode }) {
  const groups = new Map<string, Gpu[]>();
  for (const gpu of [...node.gpus].sort((a, b) => a.index - b.index)) {
    const key = `NUMA ${gpu.numa_node ?? 0}`;
    groups.set(key, [...(groups.get(key) ?? []), gpu]);
  }
  const allocated = node.gpus.filter((g) => g.allocated).length;
  return (
    <article className="node-card" aria-label={`Node ${node.name}`}>
      <header>
        <h3>{node.name}</h3>
        <span className={`badge node-${node.state ?? "unknown"}`}>{node.state}</span>
      </header>
      <p className="muted small">
        {node.rack && `rack ${node.rack} · `}
        {node.cpu} CPU · {node.memory_gb} GB · {allocated}/{node.gpus.length} GPUs allocated · heartbeat{" "}
        {formatRelative(node.last_heartbeat_at)}
      </p>
      {node.state_reason && <p className="small">{node.state_reason}</p>}
      {[...groups.entries()].map(([group, gpus]) => (
        <div key={group} className="gpu-group">
          <span className="muted small">{group}</span>
          <ul className="gpu-cells">
            {gpus.map((gpu) => {
              const s = gpuStatus(gpu, node);
              const text = `GPU ${gpu.index} ${gpu.model}, ${Math.round(gpu.memory_mb / 1024)} GB, ${s}${gpu.health_reason ? `: ${gpu.health_reason}` : ""}; NVLink group ${gpu.nvlink_group ?? "–"}, PCIe switch ${gpu.pcie_switch ?? "–"}`;
              return (
                <li key={gpu.uuid} className={`gpu-cell gpu-${s}`} title={text} aria-label={text} tabIndex={0}>
                  {gpu.index}
                </li>
              );
            })}
          </ul>
        </div>
      ))}
    </article>
  );
}

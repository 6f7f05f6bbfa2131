import { api, fetchAll, query } from "../api/client";
import { useLive } from "../api/live";
import { ACTIVE_STATES, type ClusterNode, type Job, type Page, type VirtualCluster } from "../api/types";
import { GpuModelUse, QuotaBar } from "../components/charts";
import { Empty, ErrorBanner, PageHeader, Section, Spinner } from "../components/common";
import { JobTable } from "../components/JobTable";
import { gpuUseByModel } from "../lib/cluster";
import { useResource } from "../lib/useResource";
import { useEvery, useSoon } from "../lib/useSoon";
import { Link } from "../router";
import { canSubmit, useSession } from "../session";

export function DashboardPage() {
  const { me } = useSession();
  const jobs = useResource(
    (signal) => api<Page<Job>>(`/api/v1/jobs/${query({ owner: "me", state: ACTIVE_STATES, limit: 50 })}`, { signal }),
    "my-jobs",
  );
  const vcs = useResource((signal) => fetchAll<VirtualCluster>("/api/v1/virtual-clusters/", signal), "vcs");
  const nodes = useResource((signal) => fetchAll<ClusterNode>("/api/v1/nodes/", signal), "nodes");
  const refresh = () => {
    jobs.reload();
    vcs.reload();
    nodes.reload();
  };
  const soon = useSoon(refresh, 2000);
  useLive("jobs", (m) => m.kind === "job" && soon(), refresh);
  useEvery(30_000, refresh);

  const running = jobs.data?.results.filter((j) => j.state !== "pending") ?? [];
  const pending = jobs.data?.results.filter((j) => j.state === "pending") ?? [];

  return (
    <>
      <PageHeader title="Dashboard">
        {canSubmit(me) ? (
          <Link href="/submit" className="button primary">
            Submit a job
          </Link>
        ) : (
          <span className="muted">You are a viewer in your tenants: you can follow jobs but not submit them.</span>
        )}
      </PageHeader>
      <div className="grid-2">
        <Section title="My running jobs">
          <ErrorBanner error={jobs.error} onRetry={jobs.reload} />
          {jobs.loading && !jobs.data ? (
            <Spinner />
          ) : running.length ? (
            <JobTable jobs={running} caption="My running jobs" />
          ) : (
            <Empty>Nothing running.</Empty>
          )}
        </Section>
        <Section title="My pending jobs">
          {jobs.loading && !jobs.data ? (
            <Spinner />
          ) : pending.length ? (
            <JobTable jobs={pending} caption="My pending jobs" showQueue />
          ) : (
            <Empty>Nothing waiting.</Empty>
          )}
        </Section>
        <Section title="My virtual clusters">
          <ErrorBanner error={vcs.error} onRetry={vcs.reload} />
          {vcs.loading && !vcs.data && <Spinner />}
          {vcs.data?.length === 0 && <Empty>You belong to no virtual cluster.</Empty>}
          {vcs.data?.map((vc) => (
            <div key={vc.id} className="vc-summary">
              <h3>
                <Link href={`/vcs/${encodeURIComponent(vc.name)}`}>{vc.name}</Link>{" "}
                <span className="muted">tenant {vc.tenant}</span>
              </h3>
              {vc.quotas.map((q) => (
                <div key={q.gpu_model} className="quota-row">
                  <span className="quota-label">{q.gpu_model}</span>
                  <QuotaBar inUse={q.in_use} guaranteed={q.guaranteed ?? 0} borrowLimit={q.borrow_limit ?? 0} lendingLimit={q.lending_limit} label={`${vc.name} ${q.gpu_model}`} />
                  <span className="quota-figures">
                    {q.in_use} / {q.guaranteed} <span className="muted">+{q.borrow_limit}</span>
                  </span>
                </div>
              ))}
            </div>
          ))}
          <QuotaLegend />
        </Section>
        <Section title="Cluster utilization" actions={<Link href="/cluster">All nodes</Link>}>
          <ErrorBanner error={nodes.error} onRetry={nodes.reload} />
          {nodes.loading && !nodes.data && <Spinner />}
          {nodes.data &&
            gpuUseByModel(nodes.data).map((use) => (
              <GpuModelUse key={use.model} use={use} className="model-use" />
            ))}
        </Section>
      </div>
    </>
  );
}

export function QuotaLegend() {
  return (
    <ul className="legend">
      <li>
        <span className="swatch quota-fill" aria-hidden="true" /> in use within guarantee
      </li>
      <li>
        <span className="swatch quota-borrowed" aria-hidden="true" /> borrowed
      </li>
      <li>
        <span className="swatch quota-guarantee" aria-hidden="true" /> guaranteed
      </li>
      <li>
        <span className="swatch quota-track" aria-hidden="true" /> borrow limit
      </li>
    </ul>
  );
}

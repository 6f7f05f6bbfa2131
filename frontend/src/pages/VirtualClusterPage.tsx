import { ApiError, api, fetchAll, query } from "../api/client";
import { useLive } from "../api/live";
import type { Job, Page, VirtualCluster } from "../api/types";
import { BudgetBar, QuotaBar } from "../components/charts";
import { Empty, ErrorBanner, PageHeader, Section, Spinner } from "../components/common";
import { JobTable } from "../components/JobTable";
import { vcBudget } from "../lib/budget";
import { useResource } from "../lib/useResource";
import { useEvery, useSoon } from "../lib/useSoon";
import { Link } from "../router";
import { QuotaLegend } from "./DashboardPage";

const RUNNING = ["scheduled", "starting", "running", "suspended", "checkpointing"];

export function VirtualClustersPage() {
  const vcs = useResource((signal) => fetchAll<VirtualCluster>("/api/v1/virtual-clusters/", signal), "vcs");
  const soonVcs = useSoon(vcs.reload, 1000);
  useLive("jobs", (m) => m.kind === "job" && soonVcs(), vcs.reload, 15_000);
  return (
    <>
      <PageHeader title="Virtual clusters" />
      <ErrorBanner error={vcs.error} onRetry={vcs.reload} />
      {vcs.loading && !vcs.data && <Spinner />}
      {vcs.data?.length === 0 && <Empty>You belong to no virtual cluster.</Empty>}
      <div className="grid-2">
        {vcs.data?.map((vc) => (
          <Section key={vc.id} title={vc.name} actions={<Link href={`/vcs/${encodeURIComponent(vc.name)}`}>Queue and details</Link>}>
            <VcQuotas vc={vc} />
          </Section>
        ))}
      </div>
    </>
  );
}

function VcQuotas({ vc }: { vc: VirtualCluster }) {
  const budget = vcBudget(vc);
  return (
    <>
      <p className="muted small">
        Tenant {vc.tenant} · Queue order: {vc.queueing_policy_label}
        {vc.max_gpus_per_user ? ` · at most ${vc.max_gpus_per_user} GPUs per user` : ""}
        {vc.max_cpus_per_user ? ` · at most ${vc.max_cpus_per_user} CPUs per user` : ""}
        {vc.max_memory_gb_per_user ? ` · at most ${vc.max_memory_gb_per_user} GB of memory per user` : ""}
        {vc.max_pending_jobs_per_user != null ? ` · at most ${vc.max_pending_jobs_per_user} pending jobs per user` : ""}
      </p>
      {vc.stop_policy && (
        <p className="notice" role="status">
          {vc.stop_policy === "hold-and-drain"
            ? "Stopped and drained by an admin: no job of it starts, and its running jobs were checkpointed and requeued."
            : "Stopped by an admin: no job of it starts until it is open again; running jobs go on."}
        </p>
      )}
      {budget?.level === "spent" && (
        <p className="notice" role="status">
          Budget spent: its jobs start again on {budget.resetsOn} (UTC), or sooner if an admin raises its monthly GPU-hour
          budget; running jobs go on.
        </p>
      )}
      {budget && (
        <div className="budget">
          <div className="budget-figures">
            <span>Monthly GPU-hour budget</span>
            <span>
              {budget.text} · {budget.percent} %
            </span>
          </div>
          <BudgetBar budget={budget} label={`${vc.name} monthly budget`} />
        </div>
      )}
      {vc.description && <p>{vc.description}</p>}
      <div className="table-wrap">
        <table className="quotas">
          <caption className="visually-hidden">Quota of {vc.name}</caption>
          <thead>
            <tr>
              <th scope="col">GPU model</th>
              <th scope="col">Use</th>
              <th scope="col">In use</th>
              <th scope="col">Guaranteed</th>
              <th scope="col">Borrow limit</th>
              <th scope="col" title="How many of its idle guaranteed GPUs other VCs may borrow; the rest stay free for its own jobs">
                Lends
              </th>
            </tr>
          </thead>
          <tbody>
            {vc.quotas.map((q) => (
              <tr key={q.gpu_model}>
                <th scope="row">{q.gpu_model}</th>
                <td className="bar-cell">
                  <QuotaBar
                    inUse={q.in_use}
                    guaranteed={q.guaranteed ?? 0}
                    borrowLimit={q.borrow_limit ?? 0}
                    lendingLimit={q.lending_limit}
                    label={`${vc.name} ${q.gpu_model}`}
                  />
                </td>
                <td>{q.in_use}</td>
                <td>{q.guaranteed}</td>
                <td>+{q.borrow_limit}</td>
                <td>{q.lending_limit == null ? "all" : `up to ${q.lending_limit}`}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      <QuotaLegend />
    </>
  );
}

export function VirtualClusterPage({ name }: { name: string }) {
  const vc = useResource((signal) => api<VirtualCluster>(`/api/v1/virtual-clusters/${encodeURIComponent(name)}/`, { signal }), `vc-${name}`);
  const queue = useResource(
    (signal) =>
      api<Page<Job>>(`/api/v1/jobs/${query({ vc: name, state: "pending", ordering: "queue_position", limit: 200 })}`, { signal }),
    `queue-${name}`,
  );
  const running = useResource(
    (signal) => api<Page<Job>>(`/api/v1/jobs/${query({ vc: name, state: RUNNING, limit: 100 })}`, { signal }),
    `running-${name}`,
  );
  const refresh = () => {
    vc.reload();
    queue.reload();
    running.reload();
  };
  const soon = useSoon(refresh, 2000);
  useLive("jobs", (m) => m.kind === "job" && soon(), refresh);
  useEvery(30_000, queue.reload);

  const ordered = queue.data?.results ?? []; // in queue order, as the API sorts them

  // A VC of another tenant answers as one that does not exist: one card, and no queue or running
  // list (which would read as empty, not as unknown).
  if (vc.error instanceof ApiError && vc.error.status === 404) {
    return (
      <div className="card">
        <PageHeader title="Virtual cluster not found" />
        <p role="alert">No such virtual cluster among yours: there is no virtual cluster {name} in your tenants.</p>
        <p>
          <Link href="/vcs">Back to your virtual clusters</Link>
        </p>
      </div>
    );
  }

  return (
    <>
      <PageHeader title={`Virtual cluster ${name}`} />
      <ErrorBanner error={vc.error} onRetry={vc.reload} />
      {vc.loading && !vc.data && !vc.error && <Spinner />}
      {vc.data && (
        <Section title="Quota and use">
          <VcQuotas vc={vc.data} />
        </Section>
      )}
      {/* Its jobs once the VC is known to be one of the user's: else "No job is waiting" would mislead. */}
      {vc.data && (
        <>
          <Section title="Queue">
            <ErrorBanner error={queue.error} onRetry={queue.reload} />
            {queue.loading && !queue.data && <Spinner />}
            {queue.data && ordered.length === 0 && <Empty>No job is waiting.</Empty>}
            {ordered.length > 0 && <JobTable jobs={ordered} caption={`Queue of ${name}, in order`} showQueue />}
            {queue.data && queue.data.count > ordered.length && <p className="hint">Showing the first {ordered.length} of {queue.data.count}.</p>}
          </Section>
          <Section title="Running">
            <ErrorBanner error={running.error} onRetry={running.reload} />
            {running.data && running.data.results.length === 0 && <Empty>Nothing running.</Empty>}
            {running.data && running.data.results.length > 0 && <JobTable jobs={running.data.results} caption={`Running in ${name}`} />}
          </Section>
        </>
      )}
    </>
  );
}

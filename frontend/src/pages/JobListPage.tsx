import { type FormEvent, useEffect, useState } from "react";

import { ApiError, api, fetchAll, query } from "../api/client";
import { useLive } from "../api/live";
import { ALL_STATES, type Job, type JobState, type Page, type VirtualCluster, isEnded } from "../api/types";
import { Empty, ErrorBanner, PageHeader, Spinner } from "../components/common";
import { JobTable } from "../components/JobTable";
import { mayManage } from "../lib/access";
import { clampPage, pageCount, selectedText } from "../lib/pages";
import { useResource } from "../lib/useResource";
import { useSoon } from "../lib/useSoon";
import { navigate, useLocation } from "../router";
import { useSession } from "../session";

const PAGE_SIZE = 25;

interface Filters {
  state: JobState[];
  vc: string;
  owner: string;
  q: string;
  ordering: string;
  page: number;
}

const ORDERINGS: [string, string][] = [
  ["", "newest first"],
  ["submitted_at", "oldest first"],
  ["-priority", "highest priority first"],
  ["queue_position", "queue position"],
];

function readFilters(search: URLSearchParams): Filters {
  return {
    state: search.getAll("state").filter((s): s is JobState => (ALL_STATES as string[]).includes(s)),
    vc: search.get("vc") ?? "",
    owner: search.get("owner") ?? "",
    q: search.get("q") ?? "",
    ordering: search.get("ordering") ?? "",
    page: Math.max(1, Number(search.get("page") ?? "1") || 1),
  };
}

function filtersUrl(f: Filters): string {
  return `/jobs${query({ state: f.state, vc: f.vc, owner: f.owner, q: f.q, ordering: f.ordering, page: f.page > 1 ? f.page : undefined })}`;
}

interface BulkProgress {
  done: number;
  total: number;
  failures: string[];
}

export function JobListPage() {
  const { search } = useLocation();
  const { me } = useSession();
  const filters = readFilters(search);
  const apiQuery = query({
    state: filters.state,
    vc: filters.vc,
    owner: filters.owner,
    q: filters.q,
    ordering: filters.ordering,
    limit: PAGE_SIZE,
    offset: (filters.page - 1) * PAGE_SIZE,
  });
  // Each page with the query it answers: until the new query's page comes, the old one stays shown.
  const jobs = useResource(
    async (signal) => ({ apiQuery, page: await api<Page<Job>>(`/api/v1/jobs/${apiQuery}`, { signal }) }),
    apiQuery,
  );
  const shown = jobs.data?.page;
  const vcs = useResource((signal) => fetchAll<VirtualCluster>("/api/v1/virtual-clusters/", signal), "vcs");
  const soon = useSoon(jobs.reload, 1000);
  useLive("jobs", (m) => m.kind === "job" && soon(), jobs.reload);

  const [selected, setSelected] = useState<Set<number>>(new Set());
  const [progress, setProgress] = useState<BulkProgress | null>(null);
  const [qText, setQText] = useState(filters.q);
  const [ownerText, setOwnerText] = useState(filters.owner);
  // The Search and Owner fields follow the URL's filters when they change (a link, Back, Forward).
  const [typedFor, setTypedFor] = useState({ q: filters.q, owner: filters.owner });
  if (typedFor.q !== filters.q || typedFor.owner !== filters.owner) {
    setTypedFor({ q: filters.q, owner: filters.owner });
    setQText(filters.q);
    setOwnerText(filters.owner);
  }
  const [confirming, setConfirming] = useState(false);

  const setFilters = (patch: Partial<Filters>) => {
    navigate(filtersUrl({ ...filters, page: 1, ...patch }), { replace: true });
    setSelected(new Set());
  };

  const results = shown?.results ?? [];
  // Only jobs the user may cancel (their own as a member, any of a tenant they administer).
  const cancellable = results.filter((j) => !isEnded(j.state) && mayManage(j, me));
  const chosen = cancellable.filter((j) => selected.has(j.id));
  const count = jobs.data?.apiQuery === apiQuery ? jobs.data.page.count : undefined;
  const pages = pageCount(shown?.count ?? 0, PAGE_SIZE);

  // A page past the last (its jobs all cancelled, or gone in a live reload) moves to the last one.
  useEffect(() => {
    if (count === undefined) return;
    const page = clampPage(filters.page, count, PAGE_SIZE);
    if (page !== filters.page) navigate(filtersUrl({ ...filters, page }), { replace: true });
  });

  const toggle = (id: number, on: boolean) => {
    const next = new Set(selected);
    if (on) next.add(id);
    else next.delete(id);
    setSelected(next);
  };

  const cancelSelected = async () => {
    if (!chosen.length) return;
    setConfirming(false);
    const state: BulkProgress = { done: 0, total: chosen.length, failures: [] };
    setProgress({ ...state });
    for (const job of chosen) {
      try {
        await api(`/api/v1/jobs/${job.id}/cancel/`, { method: "POST" });
      } catch (err) {
        state.failures.push(`${job.name} #${job.id}: ${err instanceof ApiError || err instanceof Error ? err.message : String(err)}`);
      }
      state.done += 1;
      setProgress({ ...state });
    }
    setSelected(new Set());
    jobs.reload();
  };

  const submitSearch = (event: FormEvent) => {
    event.preventDefault();
    setFilters({ q: qText.trim(), owner: ownerText.trim() });
  };

  return (
    <>
      <PageHeader title="Jobs" />
      <form className="card filters" onSubmit={submitSearch} role="search" aria-label="Filter jobs">
        <div className="field">
          <label htmlFor="filter-q">Search</label>
          <div className="inline">
            <input id="filter-q" type="search" placeholder="name or id" value={qText} onChange={(e) => setQText(e.target.value)} />
            <button type="submit" className="button">
              Search
            </button>
          </div>
        </div>
        <div className="field">
          <label htmlFor="filter-vc">Virtual cluster</label>
          <select id="filter-vc" value={filters.vc} onChange={(e) => setFilters({ vc: e.target.value })}>
            <option value="">all</option>
            {vcs.data?.map((vc) => (
              <option key={vc.id} value={vc.name}>
                {vc.name}
              </option>
            ))}
          </select>
        </div>
        <div className="field">
          <label htmlFor="filter-owner">Owner</label>
          <input
            id="filter-owner"
            list="owner-choices"
            placeholder="anyone, me, a name"
            value={ownerText}
            onChange={(e) => setOwnerText(e.target.value)}
          />
          <datalist id="owner-choices">
            <option value="me" />
          </datalist>
        </div>
        <div className="field">
          <label htmlFor="filter-ordering">Order</label>
          <select id="filter-ordering" value={filters.ordering} onChange={(e) => setFilters({ ordering: e.target.value })}>
            {ORDERINGS.map(([value, label]) => (
              <option key={value} value={value}>
                {label}
              </option>
            ))}
          </select>
        </div>
        <fieldset className="state-filter">
          <legend>State</legend>
          <div className="chips">
            {ALL_STATES.map((s) => (
              <label key={s} className={filters.state.includes(s) ? "chip on" : "chip"}>
                <input
                  type="checkbox"
                  checked={filters.state.includes(s)}
                  onChange={(e) => setFilters({ state: e.target.checked ? [...filters.state, s] : filters.state.filter((x) => x !== s) })}
                />
                {s}
              </label>
            ))}
          </div>
        </fieldset>
      </form>

      <div className="card">
        <div className="toolbar">
          <span>
            {shown ? `${shown.count} ${shown.count === 1 ? "job" : "jobs"}` : ""}
            {chosen.length > 0 && ` · ${selectedText(chosen.length, pages > 1)}`}
          </span>
          {confirming && chosen.length > 0 ? (
            <span className="confirm" role="group" aria-label="Confirm cancel">
              Cancel {chosen.length === 1 ? "1 job" : `${chosen.length} jobs`}?{" "}
              <button type="button" className="button danger" onClick={cancelSelected} autoFocus>
                Yes, cancel
              </button>{" "}
              <button type="button" className="button ghost" onClick={() => setConfirming(false)}>
                Keep
              </button>
            </span>
          ) : (
            <button
              type="button"
              className="button danger"
              disabled={chosen.length === 0 || (progress !== null && progress.done < progress.total)}
              onClick={() => setConfirming(true)}
            >
              Cancel selected
            </button>
          )}
        </div>
        {progress && (
          <div className="progress-note" role="status">
            {progress.done < progress.total ? (
              <>
                <progress max={progress.total} value={progress.done} aria-label="Cancelling jobs" /> Cancelling {progress.done + 1} of {progress.total}…
              </>
            ) : (
              <>
                Cancelled {progress.total - progress.failures.length} of {progress.total}.{" "}
                <button type="button" className="button small ghost" onClick={() => setProgress(null)}>
                  Dismiss
                </button>
              </>
            )}
            {progress.failures.length > 0 && (
              <ul className="error-list" role="alert">
                {progress.failures.map((f) => (
                  <li key={f}>{f}</li>
                ))}
              </ul>
            )}
          </div>
        )}
        <ErrorBanner error={jobs.error} onRetry={jobs.reload} />
        {jobs.loading && !shown && <Spinner />}
        {shown && results.length === 0 && <Empty>No jobs match.</Empty>}
        {results.length > 0 && (
          <JobTable
            jobs={results}
            caption="Jobs"
            leadHeader={
              <input
                type="checkbox"
                aria-label="Select all jobs that can be cancelled on this page"
                checked={cancellable.length > 0 && chosen.length === cancellable.length}
                onChange={(e) => setSelected(new Set(e.target.checked ? cancellable.map((j) => j.id) : []))}
              />
            }
            lead={(job) => (
              <input
                type="checkbox"
                aria-label={`Select ${job.name} #${job.id}`}
                disabled={!cancellable.includes(job)}
                checked={selected.has(job.id)}
                onChange={(e) => toggle(job.id, e.target.checked)}
              />
            )}
          />
        )}
        {(pages > 1 || filters.page > 1) && (
          <nav className="pagination" aria-label="Pages">
            <button type="button" className="button small" disabled={filters.page <= 1} onClick={() => navigate(filtersUrl({ ...filters, page: filters.page - 1 }))}>
              Previous
            </button>
            <span>
              Page {filters.page} of {pages}
            </span>
            <button type="button" className="button small" disabled={filters.page >= pages} onClick={() => navigate(filtersUrl({ ...filters, page: filters.page + 1 }))}>
              Next
            </button>
          </nav>
        )}
      </div>
    </>
  );
}

import { useState } from "react";

import { api, query } from "../api/client";
import type { UsageGroup, UsageReport, UsageRow } from "../api/types";
import { Empty, ErrorBanner, PageHeader, Section, Spinner } from "../components/common";
import { formatTime } from "../lib/format";
import {
  USAGE_GROUPS,
  USAGE_ORDERS,
  type UsageFilters,
  type UsageOrder,
  formatUsage,
  readUsageFilters,
  sortUsageRows,
  usageApiParams,
  usageBars,
  usagePageUrl,
} from "../lib/usage";
import { useResource } from "../lib/useResource";
import { Link, navigate, useLocation } from "../router";

// More bars than this would not fit a screen; the table has every row.
const MAX_BARS = 25;

export function UsagePage() {
  const { search } = useLocation();
  const filters = readUsageFilters(search);
  const params = usageApiParams(filters);
  const apiQuery = query(params);
  const report = useResource((signal) => api<UsageReport>(`/api/v1/usage/${apiQuery}`, { signal }), apiQuery);
  const [order, setOrder] = useState<UsageOrder>("allocated");

  const setFilters = (patch: Partial<UsageFilters>) => navigate(usagePageUrl({ ...filters, ...patch }), { replace: true });
  const csvUrl = `/api/v1/usage/${query({ ...params, format: "csv" })}`;
  // The rows are read with the group they were asked for, which lags the choice while a new report loads.
  const data = report.data;
  const groupLabel = (group: UsageGroup) => USAGE_GROUPS.find((g) => g.value === group)?.label ?? group;

  return (
    <>
      <PageHeader title="GPU usage">
        <a className="button" href={csvUrl} download>
          Download CSV
        </a>
      </PageHeader>
      <form className="card filters" aria-label="Usage report" onSubmit={(event) => event.preventDefault()}>
        <div className="field">
          <label htmlFor="usage-group">Group by</label>
          <select id="usage-group" value={filters.group} onChange={(e) => setFilters({ group: e.target.value as UsageGroup })}>
            {USAGE_GROUPS.map((g) => (
              <option key={g.value} value={g.value}>
                {g.label}
              </option>
            ))}
          </select>
        </div>
        <div className="field">
          <label htmlFor="usage-from">From</label>
          <input id="usage-from" type="date" value={filters.from} max={filters.to || undefined} onChange={(e) => setFilters({ from: e.target.value })} />
        </div>
        <div className="field">
          <label htmlFor="usage-to">To (included)</label>
          <input id="usage-to" type="date" value={filters.to} min={filters.from || undefined} onChange={(e) => setFilters({ to: e.target.value })} />
        </div>
        <div className="field" style={{ alignSelf: "end" }}>
          <button type="button" className="button" disabled={!filters.from && !filters.to} onClick={() => setFilters({ from: "", to: "" })}>
            Last 30 days
          </button>
        </div>
        <p className="hint" style={{ gridColumn: "1 / -1" }}>
          {data
            ? `The jobs that held GPUs between ${formatTime(data.since)} and ${formatTime(data.until)}, each for its GPU time in that period only.`
            : "Without dates: the last 30 days."}{" "}
          Used GPU-hours weigh each hour by the GPU's measured utilization.
        </p>
      </form>

      <ErrorBanner error={report.error} onRetry={report.reload} />
      {report.loading && !data && <Spinner />}
      {data && data.results.length === 0 && (
        <div className="card">
          <Empty>No GPU usage in this period.</Empty>
        </div>
      )}
      {data && data.results.length > 0 && (
        <>
          <Section title="GPU-hours">
            <UsageBars rows={data.results} />
          </Section>
          <Section
            title={`Per ${groupLabel(data.group).toLowerCase()}`}
            actions={
              <div className="toolbar">
                <label>
                  Order
                  <select value={order} onChange={(e) => setOrder(e.target.value as UsageOrder)}>
                    {USAGE_ORDERS.map(([value, label]) => (
                      <option key={value} value={value}>
                        {label}
                      </option>
                    ))}
                  </select>
                </label>
              </div>
            }
          >
            <UsageTable rows={sortUsageRows(data.results, order)} group={data.group} label={groupLabel(data.group)} />
          </Section>
        </>
      )}
    </>
  );
}

function UsageBars({ rows }: { rows: UsageRow[] }) {
  const bars = usageBars(rows, MAX_BARS);
  return (
    <>
      <ul style={{ listStyle: "none", padding: 0, margin: 0 }}>
        {bars.map((bar) => {
          const text = `${bar.key}: ${formatUsage(bar.allocated)} GPU-hours, ${formatUsage(bar.used)} used`;
          return (
            <li key={bar.key} className="quota-row" style={{ gridTemplateColumns: "minmax(4rem, 10rem) 1fr 6rem" }}>
              <span className="quota-label" style={{ overflow: "hidden", textOverflow: "ellipsis", whiteSpace: "nowrap" }} title={bar.key}>
                {bar.key}
              </span>
              <div className="quota-bar" role="img" aria-label={text} title={text}>
                <div className="quota-track">
                  <div className="quota-guarantee" style={{ width: `${bar.allocatedPct}%` }} />
                  <div className="quota-fill" style={{ width: `${bar.usedPct}%` }} />
                </div>
              </div>
              <span className="quota-figures">{formatUsage(bar.allocated)} h</span>
            </li>
          );
        })}
      </ul>
      <ul className="legend">
        <li>
          <span className="swatch quota-guarantee" aria-hidden="true" />
          GPU-hours allocated
        </li>
        <li>
          <span className="swatch quota-fill" aria-hidden="true" />
          used (weighted by utilization)
        </li>
      </ul>
      {rows.length > bars.length && (
        <p className="hint">
          The {bars.length} largest of {rows.length}; the table below has them all.
        </p>
      )}
    </>
  );
}

function UsageTable({ rows, group, label }: { rows: UsageRow[]; group: UsageGroup; label: string }) {
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">GPU usage per {label.toLowerCase()}</caption>
        <thead>
          <tr>
            <th scope="col">{label}</th>
            <th scope="col">Jobs</th>
            <th scope="col">GPU-hours</th>
            <th scope="col">Used GPU-hours</th>
            <th scope="col">Energy (kWh)</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((row) => {
            const key = row.key;
            return (
              <tr key={key}>
                <th scope="row">{group === "job" ? <Link href={`/jobs/${encodeURIComponent(key)}`}>{key}</Link> : key}</th>
                <td>{row.jobs}</td>
                <td>{formatUsage(row.allocated_gpu_hours)}</td>
                <td>{formatUsage(row.used_gpu_hours)}</td>
                <td>{formatUsage(row.energy_kwh)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

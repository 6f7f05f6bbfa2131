// Small SVG charts: a quota bar, a stacked bar and a multi-series line chart.

import type { VcBudget } from "../lib/budget";
import type { ModelUse } from "../lib/cluster";
import { formatClock, formatDuration, formatInteger, timeZoneName } from "../lib/format";

export function QuotaBar({ inUse, guaranteed, borrowLimit, lendingLimit, label }: {
  inUse: number;
  guaranteed: number;
  borrowLimit: number;
  /** How many idle guaranteed GPUs other VCs may borrow; null or absent lends them all. */
  lendingLimit?: number | null;
  label: string;
}) {
  const max = Math.max(guaranteed + borrowLimit, inUse, 1);
  const pct = (n: number) => `${(100 * n) / max}%`;
  const borrowed = Math.max(0, inUse - guaranteed);
  const within = Math.min(inUse, guaranteed);
  const lends = lendingLimit == null ? "" : `, lends up to ${lendingLimit} of its guarantee`;
  const text = `${label}: ${inUse} in use, ${guaranteed} guaranteed, up to ${borrowLimit} more borrowed${lends}`;
  return (
    <div className="quota-bar" role="img" aria-label={text} title={text}>
      <div className="quota-track">
        <div className="quota-guarantee" style={{ width: pct(guaranteed) }} />
        <div className="quota-fill" style={{ width: pct(within) }} />
        <div className="quota-borrowed" style={{ left: pct(within), width: pct(borrowed) }} />
        <div className="quota-mark" style={{ left: pct(guaranteed) }} />
      </div>
    </div>
  );
}

/** A monthly GPU-hour budget: the share used, in the warning color from 80 % and the danger
 * color once spent. */
export function BudgetBar({ budget, label }: { budget: VcBudget; label: string }) {
  const text = `${label}: ${budget.text}, ${budget.percent} %`;
  return (
    <div className="budget-bar" role="img" aria-label={text} title={text}>
      <div className="quota-track">
        <div className={`budget-fill budget-${budget.level}`} style={{ width: `${budget.fillPercent}%` }} />
      </div>
    </div>
  );
}

export interface StackPart {
  label: string;
  value: number;
  className: string;
}

export function StackedBar({ parts, label }: { parts: StackPart[]; label: string }) {
  const total = Math.max(1, parts.reduce((s, p) => s + p.value, 0));
  const text = `${label}: ${parts.map((p) => `${formatInteger(p.value)} ${p.label}`).join(", ")}`;
  return (
    <div>
      <div className="stacked-bar" role="img" aria-label={text} title={text}>
        {parts.map((p) =>
          p.value > 0 ? (
            <div key={p.label} className={p.className} style={{ width: `${(100 * p.value) / total}%` }} />
          ) : null,
        )}
      </div>
      <ul className="legend">
        {parts.map((p) => (
          <li key={p.label}>
            <span className={`swatch ${p.className}`} aria-hidden="true" />
            {formatInteger(p.value)} {p.label}
          </li>
        ))}
      </ul>
    </div>
  );
}

export interface Series {
  name: string;
  /** A point without a value (null: no reading then) breaks the line; it is never drawn as 0. */
  points: { t: number; v: number | null }[];
}

interface Point {
  t: number;
  v: number;
}

/** The value of a point that has one: a reading, not null (no reading then) nor NaN. */
function valueOf(p: Series["points"][number]): number | null {
  return p.v !== null && Number.isFinite(p.v) ? p.v : null;
}

/** The runs of a series between its points without a value: each is drawn as a line (or a dot,
 * a run of one), with a gap where a reading is missing. */
export function lineRuns(points: Series["points"]): Point[][] {
  const runs: Point[][] = [];
  let run: Point[] = [];
  for (const p of points) {
    const v = valueOf(p);
    if (v === null) {
      if (run.length) runs.push(run);
      run = [];
    } else run.push({ t: p.t, v });
  }
  if (run.length) runs.push(run);
  return runs;
}

/** A series' latest reading for the legend and the chart's label: "no reading" when its latest
 * point has no value (not 0, which would read as idle), "–" without points. */
function latestText(points: Series["points"], unit: string): string {
  const last = points[points.length - 1];
  if (!last) return "–";
  const v = valueOf(last);
  return v === null ? "no reading" : `${formatInteger(v)} ${unit}`;
}

const PALETTE = ["#2f6fdf", "#d9822b", "#2e9e6b", "#9b59b6", "#c0392b", "#16a2b8", "#7f8c8d", "#b8860b"];

export function seriesColor(i: number): string {
  return PALETTE[i % PALETTE.length] ?? "#2f6fdf";
}

/** Lines over time, one per series; y from 0 to `yMax` (or the largest value). */
export function LineChart({
  title,
  unit,
  series,
  yMax,
  emptyText = "No samples yet.",
}: {
  title: string;
  unit: string;
  series: Series[];
  yMax?: number;
  emptyText?: string;
}) {
  const W = 320;
  const H = 120;
  const PAD_L = 34;
  const PAD_B = 16;
  const all = series.flatMap((s) => s.points);
  const values = all.flatMap((p) => valueOf(p) ?? []);
  const latest = series.map((s) => latestText(s.points, unit));
  const summary = series
    .map((s, i) => (s.points.length === 0 ? null : `${s.name} ${latest[i]}`))
    .filter(Boolean)
    .join(", ");
  if (all.length === 0) {
    return (
      <figure className="chart">
        <figcaption>{title}</figcaption>
        <p className="empty">{emptyText}</p>
      </figure>
    );
  }
  const t0 = Math.min(...all.map((p) => p.t));
  const t1 = Math.max(...all.map((p) => p.t), t0 + 1);
  const top = yMax ?? Math.max(1, ...values) * 1.1;
  const x = (t: number) => PAD_L + ((t - t0) / (t1 - t0)) * (W - PAD_L - 4);
  const y = (v: number) => 4 + (1 - Math.min(v, top) / top) * (H - PAD_B - 8);
  return (
    <figure className="chart">
      <figcaption>
        {title} <span className="muted">({unit})</span>
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={`${title}, latest: ${summary}`}>
        <line className="axis" x1={PAD_L} x2={W - 4} y1={y(0)} y2={y(0)} />
        <line className="grid" x1={PAD_L} x2={W - 4} y1={y(top / 2)} y2={y(top / 2)} />
        <text className="tick" x={PAD_L - 4} y={y(top) + 8} textAnchor="end">
          {Math.round(top)}
        </text>
        <text className="tick" x={PAD_L - 4} y={y(0)} textAnchor="end">
          0
        </text>
        {/* The axis spans the first to the last sample, which for a finished job is not now. */}
        <text className="tick" x={PAD_L} y={H - 2}>
          {formatClock(t0)}
        </text>
        <text className="tick" x={(PAD_L + W - 4) / 2} y={H - 2} textAnchor="middle">
          {formatDuration((t1 - t0) / 1000)}
        </text>
        <text className="tick" x={W - 4} y={H - 2} textAnchor="end">
          {/* The last tick names the browser's time zone, as absolute times do elsewhere. */}
          {`${formatClock(t1)} ${timeZoneName(t1)}`.trim()}
        </text>
        {series.map((s, i) =>
          lineRuns(s.points).map((run, k) =>
            // One sample (a GPU just placed, or one between gaps) has no line to draw: a dot shows it.
            run.length === 1 && run[0] ? (
              <circle key={`${s.name}#${k}`} className="chart-dot" cx={x(run[0].t).toFixed(1)} cy={y(run[0].v).toFixed(1)} r={2.5} fill={seriesColor(i)} />
            ) : (
              <polyline
                key={`${s.name}#${k}`}
                fill="none"
                stroke={seriesColor(i)}
                strokeWidth={1.8}
                strokeLinejoin="round"
                points={run.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ")}
              />
            ),
          ),
        )}
      </svg>
      <ul className="legend">
        {series.map((s, i) => (
          <li key={s.name}>
            <span className="swatch" style={{ background: seriesColor(i) }} aria-hidden="true" />
            {s.name}: {latest[i]}
          </li>
        ))}
      </ul>
    </figure>
  );
}

/** One GPU model's GPUs in use, free and unavailable, under its name and total. */
export function GpuModelUse({ use, className }: { use: ModelUse; className?: string }) {
  return (
    <div className={className}>
      <h3>
        {use.model} <span className="muted">{formatInteger(use.total)} GPUs</span>
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
  );
}

import { createElement } from "react";
import { renderToStaticMarkup } from "react-dom/server";
import { describe, expect, it } from "vitest";

import type { Allocation } from "../api/types";
import { formatClock, timeZoneName } from "../lib/format";
import { TelemetryCharts, toSample } from "./TelemetryCharts";
import { LineChart } from "./charts";

describe("the line chart", () => {
  it("draws a series of one sample as a dot, not an invisible one-point line", () => {
    const t = Date.parse("2026-01-01T00:00:00Z");
    const html = renderToStaticMarkup(
      createElement(LineChart, {
        title: "GPU utilization",
        unit: "%",
        yMax: 100,
        series: [
          { name: "a100-node-2/0", points: [{ t, v: 40 }] },
          { name: "a100-node-2/1", points: [{ t, v: 10 }, { t: t + 1000, v: 20 }] },
        ],
      }),
    );
    expect(html.match(/<circle[^>]*class="chart-dot"/g)).toHaveLength(1);
    expect(html.match(/<polyline/g)).toHaveLength(1);
  });

  it("names the time zone of its time axis", () => {
    const t = Date.parse("2026-01-01T00:00:00Z");
    const html = renderToStaticMarkup(
      createElement(LineChart, { title: "Power", unit: "W", series: [{ name: "g", points: [{ t, v: 1 }, { t: t + 60_000, v: 2 }] }] }),
    );
    expect(timeZoneName(t + 60_000)).not.toBe("");
    expect(html).toContain(`${formatClock(t + 60_000)} ${timeZoneName(t + 60_000)}`);
  });
});

describe("a missing reading", () => {
  const t = Date.parse("2026-01-01T00:00:00Z");
  const uuid = "GPU-aaaaaaaa-0000";
  const allocations = [{ gpu_uuid: uuid, node: "a100-node-2", gpu_index: 0 }] as unknown as Allocation[];
  // The API's samples: the second has no utilization nor power (the device did not report them).
  const rows = [
    { attempt: 1, gpu_uuid: uuid, time: new Date(t).toISOString(), utilization_pct: 80, memory_used_mib: 2048, power_w: 300, temperature_c: 60 },
    { attempt: 1, gpu_uuid: uuid, time: new Date(t + 1000).toISOString(), utilization_pct: 90, memory_used_mib: 2048, power_w: 310, temperature_c: 60 },
    { attempt: 1, gpu_uuid: uuid, time: new Date(t + 2000).toISOString(), utilization_pct: null, memory_used_mib: 2048, power_w: null, temperature_c: null },
    { attempt: 1, gpu_uuid: uuid, time: new Date(t + 3000).toISOString(), utilization_pct: 70, memory_used_mib: 2048, power_w: 305, temperature_c: 61 },
    { attempt: 1, gpu_uuid: uuid, time: new Date(t + 4000).toISOString(), utilization_pct: 75, memory_used_mib: 2048, power_w: 302, temperature_c: 61 },
  ];
  const chart = (html: string, title: string) => {
    const start = html.indexOf(`<figcaption>${title} `);
    return html.slice(start, html.indexOf("</figure>", start));
  };
  const ys = (polyline: string) => [...polyline.matchAll(/[\d.]+,([\d.]+)/g)].map((m) => Number(m[1]));

  it("breaks the line instead of drawing the GPU idle", () => {
    const html = renderToStaticMarkup(createElement(TelemetryCharts, { samples: rows.map(toSample), allocations }));
    for (const title of ["GPU utilization", "Power"]) {
      const lines = chart(html, title).match(/<polyline[^>]*>/g) ?? [];
      // Two runs around the gap, of two samples each: no point dropped to the axis in between.
      expect(lines, title).toHaveLength(2);
      for (const line of lines) expect(ys(line), title).toHaveLength(2);
    }
    // Memory was reported throughout: one line.
    expect(chart(html, "GPU memory used").match(/<polyline/g)).toHaveLength(1);
  });

  it("is no 0 in the legend or the chart's label when it is the latest", () => {
    const latestMissing = rows.slice(0, 3).map(toSample);
    const html = renderToStaticMarkup(createElement(TelemetryCharts, { samples: latestMissing, allocations }));
    const utilization = chart(html, "GPU utilization");
    expect(utilization).toContain("a100-node-2/0: no reading");
    expect(utilization).toContain('aria-label="GPU utilization, latest: a100-node-2/0 no reading"');
    expect(utilization).not.toMatch(/\b0 %/);
    expect(chart(html, "Power")).toContain("a100-node-2/0: no reading");
    expect(chart(html, "Power")).not.toMatch(/\b0 W/);
  });

  it("leaves a lone reading between gaps as a dot", () => {
    const html = renderToStaticMarkup(
      createElement(LineChart, {
        title: "Power",
        unit: "W",
        series: [{ name: "g", points: [{ t, v: 100 }, { t: t + 1000, v: null }, { t: t + 2000, v: 120 }, { t: t + 3000, v: null }] }],
      }),
    );
    expect(html.match(/<circle[^>]*class="chart-dot"/g)).toHaveLength(2);
    expect(html).not.toContain("<polyline");
    expect(html).toContain("g: no reading");
  });
});

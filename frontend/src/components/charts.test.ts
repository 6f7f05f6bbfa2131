import { createElement } from "react";
import { renderToStaticMarkup } from "react-dom/server";
import { describe, expect, it } from "vitest";

import { formatClock, timeZoneName } from "../lib/format";
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

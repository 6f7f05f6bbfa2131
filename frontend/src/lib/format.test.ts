import { describe, expect, it } from "vitest";

import { reconnectDelayMs } from "./backoff";
import { formatClock, formatDuration, formatInteger, formatRelative, formatTime, lastRedraw, timeZoneName } from "./format";

describe("format", () => {
  it("groups the digits of big numbers as the locale does", () => {
    expect(formatInteger(2048, "en-GB")).toBe("2,048");
    expect(formatInteger(1_234_567.6, "en-GB")).toBe("1,234,568");
    expect(formatInteger(999, "en-GB")).toBe("999");
    expect(formatInteger(2048, "de-DE")).toBe("2.048");
    expect(formatInteger(null)).toBe("–");
    expect(formatInteger(Number.NaN)).toBe("–");
  });

  it("formats durations", () => {
    expect(formatDuration(42)).toBe("42s");
    expect(formatDuration(90)).toBe("1m 30s");
    expect(formatDuration(3600 * 36)).toBe("1d 12h");
    expect(formatDuration(-1)).toBe("–");
  });

  it("formats relative times", () => {
    const now = Date.parse("2026-01-01T12:00:00Z");
    expect(formatRelative("2026-01-01T11:58:00Z", now)).toBe("2m ago");
    expect(formatRelative("2026-01-01T13:00:00Z", now)).toBe("in 1h");
    expect(formatRelative(null, now)).toBe("–");
  });

  it("shows a line redrawn with carriage returns as a terminal would", () => {
    expect(lastRedraw("epoch 1:  10%\repoch 1:  20%\repoch 1:  30%")).toBe("epoch 1:  30%");
    expect(lastRedraw("done\r")).toBe("done");
    expect(lastRedraw("plain line")).toBe("plain line");
    expect(lastRedraw("")).toBe("");
  });

  it("names the day of a moment that is not today", () => {
    const now = new Date(2026, 10, 28, 15, 0, 0).getTime();
    const earlierToday = new Date(2026, 10, 28, 3, 8, 50).getTime();
    const twoDaysAgo = new Date(2026, 10, 26, 3, 8, 50).getTime();
    const time = new Date(earlierToday).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
    expect(formatClock(earlierToday, now)).toBe(time);
    expect(formatClock(twoDaysAgo, now)).not.toBe(time);
    expect(formatClock(twoDaysAgo, now).endsWith(time)).toBe(true);
    expect(formatClock(Number.NaN, now)).toBe("–");
  });
});

describe("reconnect backoff", () => {
  it("grows and stays bounded", () => {
    expect(reconnectDelayMs(0, () => 1)).toBe(500);
    expect(reconnectDelayMs(3, () => 1)).toBe(4000);
    expect(reconnectDelayMs(50, () => 1)).toBe(15000);
    expect(reconnectDelayMs(50, () => 0)).toBe(7500);
  });
});

describe("absolute times", () => {
  it("give the year when it is not this year, and the time zone", () => {
    const now = new Date(2026, 10, 28, 15, 0, 0).getTime();
    const nextYear = new Date(2027, 1, 27, 1, 5, 55).toISOString();
    const thisYear = new Date(2026, 1, 27, 1, 5, 55).toISOString();
    expect(formatTime(nextYear, now)).toContain("2027");
    expect(formatTime(thisYear, now)).not.toContain("2026");
    expect(formatTime(thisYear, now)).toContain(timeZoneName(Date.parse(thisYear)));
    expect(formatTime(null, now)).toBe("–");
  });

  it("name the year of a chart's moment in another year", () => {
    const now = new Date(2026, 0, 2, 15, 0, 0).getTime();
    expect(formatClock(new Date(2025, 11, 30, 3, 0, 0).getTime(), now)).toContain("2025");
  });
});

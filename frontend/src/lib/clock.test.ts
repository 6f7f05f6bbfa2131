import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

import { createClock } from "./clock";
import { formatRelative } from "./format";

describe("the shared clock", () => {
  beforeEach(() => {
    vi.useFakeTimers();
    vi.setSystemTime(Date.parse("2026-01-01T12:00:00Z"));
  });
  afterEach(() => vi.useRealTimers());

  it("ticks every subscriber from one interval, and stops when none is left", () => {
    const clock = createClock(10_000);
    const a = vi.fn();
    const b = vi.fn();
    const stopA = clock.subscribe(a);
    const stopB = clock.subscribe(b);
    expect(vi.getTimerCount()).toBe(1);
    vi.advanceTimersByTime(10_000);
    expect(a).toHaveBeenCalledTimes(1);
    expect(b).toHaveBeenCalledTimes(1);
    stopA();
    stopB();
    expect(vi.getTimerCount()).toBe(0);
  });

  it("moves a relative time on without a reload", () => {
    const clock = createClock(10_000);
    const stop = clock.subscribe(() => undefined);
    const seen = "2026-01-01T11:59:53Z";
    expect(formatRelative(seen, clock.now())).toBe("7s ago");
    vi.advanceTimersByTime(30_000);
    expect(formatRelative(seen, clock.now())).toBe("37s ago");
    stop();
  });
});

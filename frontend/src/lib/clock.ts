// One clock for the whole app, so that relative times ("7s ago", "in 3m") and running figures
// move on their own: components that show them read `useNow()` and re-render on its tick. One
// interval serves every subscriber, and it runs only while something shows such a time.
import { useSyncExternalStore } from "react";

/** How often relative times are redrawn. */
export const TICK_MS = 15_000;

export interface Clock {
  subscribe: (listener: () => void) => () => void;
  now: () => number;
}

export function createClock(periodMs: number = TICK_MS): Clock {
  const listeners = new Set<() => void>();
  let current = Date.now();
  let timer: ReturnType<typeof setInterval> | null = null;
  const tick = () => {
    current = Date.now();
    listeners.forEach((listener) => listener());
  };
  return {
    subscribe(listener) {
      listeners.add(listener);
      if (timer === null) {
        current = Date.now();
        timer = setInterval(tick, periodMs);
      }
      return () => {
        listeners.delete(listener);
        if (listeners.size === 0 && timer !== null) {
          clearInterval(timer);
          timer = null;
        }
      };
    },
    now: () => current,
  };
}

const shared = createClock();

/** The time now, as of the shared clock's last tick: a component that reads it re-renders on
 * every tick. */
export function useNow(): number {
  return useSyncExternalStore(shared.subscribe, shared.now, shared.now);
}

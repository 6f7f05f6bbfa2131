import { useCallback, useEffect, useRef } from "react";

/** Returns a function that runs `fn` once, `delayMs` after the first of a burst of calls. */
export function useSoon(fn: () => void, delayMs = 400): () => void {
  const fnRef = useRef(fn);
  fnRef.current = fn;
  const timer = useRef<ReturnType<typeof setTimeout> | null>(null);
  useEffect(
    () => () => {
      if (timer.current) clearTimeout(timer.current);
    },
    [],
  );
  return useCallback(() => {
    if (timer.current) return;
    timer.current = setTimeout(() => {
      timer.current = null;
      fnRef.current();
    }, delayMs);
  }, [delayMs]);
}

/**
 * Runs `fn` every `ms` while `enabled`: only for figures the live socket does not carry yet
 * (node health, a pending job's reason, queue position and estimated start).
 */
export function useEvery(ms: number, fn: () => void, enabled = true): void {
  const fnRef = useRef(fn);
  fnRef.current = fn;
  useEffect(() => {
    if (!enabled) return;
    const id = setInterval(() => fnRef.current(), ms);
    return () => clearInterval(id);
  }, [ms, enabled]);
}

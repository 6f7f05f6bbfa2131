/** Delay before reconnect attempt `n` (0-based): 0.5 s doubling up to 15 s, with jitter in [0.5, 1). */
export function reconnectDelayMs(attempt: number, random: () => number = Math.random): number {
  const base = Math.min(15_000, 500 * 2 ** Math.min(attempt, 10));
  return Math.round(base * (0.5 + random() / 2));
}

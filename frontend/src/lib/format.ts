// Formatting for people: durations, relative times, sizes.

export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  const s = Math.round(seconds);
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  if (d > 0) return h ? `${d}d ${h}h` : `${d}d`;
  if (h > 0) return m ? `${h}h ${m}m` : `${h}h`;
  if (m > 0) return rest ? `${m}m ${rest}s` : `${m}m`;
  return `${rest}s`;
}

export function formatRelative(iso: string | null | undefined, now: number = Date.now()): string {
  if (!iso) return "–";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "–";
  const diff = (t - now) / 1000;
  const span = formatDuration(Math.abs(diff));
  if (Math.abs(diff) < 5) return "just now";
  return diff < 0 ? `${span} ago` : `in ${span}`;
}

/** An absolute time for people: day and month (and the year when it is not this year), the time
 * of day and the time zone ("27 Feb 2027, 01:05:55 GMT+1"), so that a time read on another
 * machine or next year still says when. */
export function formatTime(iso: string | null | undefined, now: number = Date.now()): string {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "–";
  return d.toLocaleString(undefined, {
    year: d.getFullYear() !== new Date(now).getFullYear() ? "numeric" : undefined,
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    timeZoneName: "short",
  });
}

/** What a terminal shows of a line redrawn with carriage returns (a progress bar): the text
 * after the last one. A browser would show every redraw side by side. A CR that ends the line
 * (CRLF output) is dropped. */
export function lastRedraw(text: string): string {
  const line = text.endsWith("\r") ? text.slice(0, -1) : text;
  return line.slice(line.lastIndexOf("\r") + 1);
}

/** A moment on a time axis: the time of day, with the date when it is not today. */
export function formatClock(t: number, now: number = Date.now()): string {
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return "–";
  const time = { hour: "2-digit", minute: "2-digit", second: "2-digit" } as const;
  if (d.toDateString() === new Date(now).toDateString()) return d.toLocaleTimeString(undefined, time);
  const year = d.getFullYear() !== new Date(now).getFullYear() ? "numeric" : undefined;
  return d.toLocaleString(undefined, { year, month: "short", day: "numeric", ...time });
}

export function elapsedSeconds(fromIso: string | null | undefined, toIso?: string | null, now = Date.now()): number {
  if (!fromIso) return NaN;
  const end = toIso ? Date.parse(toIso) : now;
  return (end - Date.parse(fromIso)) / 1000;
}

/** The local time zone's short name, as absolute times show it ("UTC", "GMT+1"). */
export function timeZoneName(at: number = Date.now()): string {
  const part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(at).find((p) => p.type === "timeZoneName");
  return part?.value ?? "";
}

/** A number for people, rounded to a whole one and grouped as the locale groups digits
 * ("2,048" in English, "2.048" in German), as node memory, CPUs and GPU counts are shown. */
export function formatInteger(n: number | null | undefined, locale?: string): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  return Math.round(n).toLocaleString(locale, { maximumFractionDigits: 0 });
}

export function pluralize(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

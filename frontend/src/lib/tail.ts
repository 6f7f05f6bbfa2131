// The newest rows of a long list, such as a job's output or its GPU samples (docs/api.md: lists
// page oldest first by `limit` and `offset`). The first page says how many rows there are, and
// the rest is read from the tail, so a long job shows its latest rows rather than its first.
import type { Page } from "../api/types";

/** One page of the list: `limit` rows from `offset`. */
export type PageFetcher<T> = (offset: number, limit: number) => Promise<Page<T>>;

/** Where reading starts to get the last `want` of `count` rows. */
export function tailOffset(count: number, want: number): number {
  return Math.max(0, count - want);
}

/**
 * The last `want` rows, oldest first, read `pageSize` at a time by offset (not after a time,
 * which would skip rows that share it). A list of one page takes one request; a longer one that
 * first request for its count, then the pages of its tail. Rows added while it reads are read too,
 * and then only the last `want` are kept.
 */
export async function fetchTail<T>(fetchPage: PageFetcher<T>, want: number, pageSize: number): Promise<T[]> {
  const first = await fetchPage(0, pageSize);
  const start = tailOffset(first.count, want);
  let rows = start === 0 ? first.results.slice() : [];
  let offset = start === 0 ? first.results.length : start;
  let more = start === 0 ? Boolean(first.next) : offset < first.count;
  while (more) {
    const page = await fetchPage(offset, pageSize);
    rows = rows.concat(page.results).slice(-want);
    offset += page.results.length;
    more = Boolean(page.next) && page.results.length > 0;
  }
  return rows.slice(-want);
}

import { describe, expect, it } from "vitest";

import type { Page } from "../api/types";
import { fetchTail, tailOffset } from "./tail";

/** A list API over `rows` (as the portal pages it: `next` while rows follow), recording each request. */
function list<T>(rows: T[]) {
  const requests: [number, number][] = [];
  const fetchPage = async (offset: number, limit: number): Promise<Page<T>> => {
    requests.push([offset, limit]);
    const results = rows.slice(offset, offset + limit);
    return { count: rows.length, next: offset + limit < rows.length ? "more" : null, results };
  };
  return { fetchPage, requests };
}

const numbers = (n: number) => Array.from({ length: n }, (_, i) => i);

describe("tailOffset", () => {
  it("starts at the last `want` rows, or at the first when there are fewer", () => {
    expect(tailOffset(12_345, 5000)).toBe(7345);
    expect(tailOffset(5000, 5000)).toBe(0);
    expect(tailOffset(30, 5000)).toBe(0);
  });
});

describe("fetchTail", () => {
  it("reads a short list in one request", async () => {
    const api = list(numbers(30));
    expect(await fetchTail(api.fetchPage, 5000, 1000)).toEqual(numbers(30));
    expect(api.requests).toEqual([[0, 1000]]);
  });

  it("reads the last rows of a long list, not its first", async () => {
    const api = list(numbers(12_345));
    const rows = await fetchTail(api.fetchPage, 5000, 1000);
    expect(rows).toHaveLength(5000);
    expect(rows[0]).toBe(7345);
    expect(rows.at(-1)).toBe(12_344);
    expect(api.requests).toEqual([
      [0, 1000],
      [7345, 1000],
      [8345, 1000],
      [9345, 1000],
      [10_345, 1000],
      [11_345, 1000],
    ]);
  });

  it("keeps every row of a list up to `want` long over several pages", async () => {
    const api = list(numbers(2500));
    expect(await fetchTail(api.fetchPage, 5000, 1000)).toEqual(numbers(2500));
  });

  it("pages by offset, so rows that share a time are all kept", async () => {
    // GPU samples of four GPUs: four rows per timestamp, a page boundary between them.
    const samples = numbers(3000).map((i) => ({ gpu: i % 4, time: Math.floor(i / 4) }));
    const rows = await fetchTail(list(samples).fetchPage, 2000, 1000);
    expect(rows).toEqual(samples.slice(1000));
  });

  it("reads rows added while it reads, and keeps the last `want`", async () => {
    const rows = numbers(6000);
    const api = list(rows);
    const grow = async (offset: number, limit: number) => {
      const page = await api.fetchPage(offset, limit);
      if (rows.length < 6500) rows.push(...numbers(250).map((i) => rows.length + i));
      return page;
    };
    const tail = await fetchTail(grow, 5000, 1000);
    expect(tail).toHaveLength(5000);
    expect(tail.at(-1)).toBe(rows.at(-1));
  });
});

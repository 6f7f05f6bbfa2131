// Pagination of a list page (the jobs list): pages of a fixed size, numbered from 1.

/** How many pages of `size` rows hold `count` rows: at least one, empty when there are none. */
export function pageCount(count: number, size: number): number {
  return Math.max(1, Math.ceil(count / size));
}

/** The page to show for `page` of a list of `count` rows: the last page when `page` is past it
 * (its rows went, say all cancelled from the last page), else `page`. */
export function clampPage(page: number, count: number, size: number): number {
  return Math.min(page, pageCount(count, size));
}

/** The selection beside a list's count: "3 selected", or with more than one page "25 on this page
 * selected", as selecting covers the page shown only (the API cancels one job at a time). */
export function selectedText(selected: number, paged: boolean): string {
  return paged ? `${selected} on this page selected` : `${selected} selected`;
}

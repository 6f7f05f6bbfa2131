import { describe, expect, it } from "vitest";

import { clampPage, pageCount, selectedText } from "./pages";

describe("pageCount", () => {
  it("counts pages, one for an empty list", () => {
    expect(pageCount(0, 25)).toBe(1);
    expect(pageCount(25, 25)).toBe(1);
    expect(pageCount(26, 25)).toBe(2);
  });
});

describe("clampPage", () => {
  it("keeps a page that exists", () => {
    expect(clampPage(1, 0, 25)).toBe(1);
    expect(clampPage(2, 26, 25)).toBe(2);
  });

  it("moves to the last page once the page shown emptied", () => {
    expect(clampPage(3, 50, 25)).toBe(2); // page 3's jobs all cancelled
    expect(clampPage(3, 0, 25)).toBe(1);
  });
});

describe("selectedText", () => {
  it("says the selection is the page's when there are more pages", () => {
    expect(selectedText(25, true)).toBe("25 on this page selected");
    expect(selectedText(3, false)).toBe("3 selected");
  });
});

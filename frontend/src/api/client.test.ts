import { describe, expect, it } from "vitest";

import { errorMessage, flattenErrors, query } from "./client";

describe("API errors", () => {
  it("flattens DRF field errors into dotted names", () => {
    expect(
      flattenErrors({
        replicas: ["Ensure this value is less than or equal to 64."],
        retries: { limit: ["too big"] },
        mounts: [{}, { path: ["must be absolute"] }],
        non_field_errors: ["bad spec"],
      }),
    ).toEqual({
      replicas: ["Ensure this value is less than or equal to 64."],
      "retries.limit": ["too big"],
      "mounts.1.path": ["must be absolute"],
      detail: ["bad spec"],
    });
  });

  it("keeps a plain detail message", () => {
    expect(flattenErrors({ detail: "Not found." })).toEqual({ detail: ["Not found."] });
  });
});

describe("query strings", () => {
  it("repeats lists and drops empty values", () => {
    expect(query({ state: ["pending", "running"], vc: "", q: undefined, limit: 25 })).toBe(
      "?state=pending&state=running&limit=25",
    );
    expect(query({})).toBe("");
  });
});

describe("errorMessage", () => {
  it("gives a field's messages without the internal field name", () => {
    const fields = flattenErrors({ time_limit: ["Only an admin of tenant vision may raise the time limit."] });
    expect(errorMessage(400, fields)).toBe("Only an admin of tenant vision may raise the time limit.");
    expect(errorMessage(404, { detail: ["Not found."] })).toBe("Not found.");
  });
});

// Job arrays from the submit page: one spec queued N times through POST /api/v1/jobs/bulk/,
// copy i named NAME-i with ARRAY_INDEX=i in its environment.
import { parseDocument } from "yaml";

import type { FieldErrors } from "../api/client";
import type { SpecObject } from "./spec";

/** The most copies one request may queue: the API's MAX_BULK_JOBS. */
export const MAX_COPIES = 1000;

/** The Copies field as the API gets it: a whole number as a number, anything else as typed, so
 * that the API says what is wrong with it, as the spec's own fields do. */
export function parseCopies(text: string): number | string {
  const t = text.trim();
  return /^\d+$/.test(t) ? Number(t) : t;
}

/** Whether the Copies field asks for an array; 1 submits the one job as before. */
export function isArray(copies: number | string): boolean {
  return copies !== 1;
}

/** The body of an array request for a spec from the form. */
export function arrayBody(spec: SpecObject, copies: number | string): SpecObject {
  return { job: spec, array: copies };
}

/** The body of an array request for a spec typed as YAML: the spec's text itself, indented
 * under `job:`. Re-serializing a parsed spec could change what the portal reads: its YAML
 * parser is not this one (`1.5e3` is a string there), and a single submission sends the text
 * as typed. Throws on a document that is not one mapping (the editor refuses those first). */
export function arrayYaml(source: string, copies: number | string): string {
  const doc = parseDocument(source);
  const range = doc.contents?.range;
  if (doc.errors.length || !range) throw new Error(doc.errors[0]?.message ?? "A job spec is a YAML mapping.");
  // Only the spec's node: the document's directives and markers ("---", "...") may not be indented.
  const lineStart = source.lastIndexOf("\n", range[0] - 1) + 1;
  const column = range[0] - lineStart;
  const lines = source.slice(range[0], range[1]).replace(/\n$/, "").split("\n");
  // Every line two spaces further in keeps the spec's own indentation, block scalars included.
  const first = " ".repeat(column + 2) + lines[0];
  const rest = lines.slice(1).map((line) => `  ${line}`);
  return `array: ${JSON.stringify(copies)}\njob:\n${[first, ...rest].join("\n")}\n`;
}

/** The API's errors for an array, named as for a single job: the spec's fields come under
 * `job` ({"job": {"flavor": [...]}}), and every copy has the same spec, so no copy is named.
 * `array` (the Copies field) keeps its name. */
export function arrayErrors(fields: FieldErrors): FieldErrors {
  const out: FieldErrors = {};
  for (const [key, messages] of Object.entries(fields)) {
    const name = key === "job" ? "detail" : key.startsWith("job.") ? key.slice("job.".length) : key;
    (out[name] ??= []).push(...messages);
  }
  return out;
}

/** Ids as ranges, in the order given: [41, 42, 43, 47] → "41–43, 47". */
export function idRanges(ids: number[]): string {
  const parts: string[] = [];
  let start = 0;
  for (let i = 1; i <= ids.length; i++) {
    if (i === ids.length || ids[i] !== (ids[i - 1] ?? 0) + 1) {
      const first = ids[start];
      const last = ids[i - 1];
      parts.push(first === last ? String(first) : `${first}–${last}`);
      start = i;
    }
  }
  return parts.join(", ");
}

/** The hint under the Copies field: what each copy gets, for the number chosen when it is one. */
export function copiesHint(copies: number | string): string {
  const check = "Check tries one copy.";
  if (typeof copies === "number" && copies > 1 && copies <= MAX_COPIES) {
    const last = copies - 1;
    return `Each copy gets ARRAY_INDEX 0 to ${last} in its environment and a name ending -0 to -${last}. ${check}`;
  }
  return `1 to ${MAX_COPIES}. Each copy gets ARRAY_INDEX 0 to N-1 in its environment and a name ending -0 to -(N-1). ${check}`;
}

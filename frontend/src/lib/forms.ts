/** A form's share of a refused request: the API's messages for the form's own fields go under
 * those fields; everything else (a refusal of the request as a whole, a 403, a 404, no answer)
 * is one message for above the form. */

import { ApiError, type FieldErrors } from "../api/client";

export interface FormErrors {
  /** Messages per field of the form, for the fields the API named. */
  fields: FieldErrors;
  /** What belongs to no field of the form; null when every message has its field. */
  message: string | null;
}

export function formErrors(err: unknown, fieldNames: readonly string[]): FormErrors {
  if (!(err instanceof ApiError)) return { fields: {}, message: err instanceof Error ? err.message : String(err) };
  if (err.status !== 400) return { fields: {}, message: err.message };
  const fields: FieldErrors = {};
  const others: string[] = [];
  for (const [name, messages] of Object.entries(err.fields)) {
    if (fieldNames.includes(name)) fields[name] = messages;
    else others.push(...(name === "detail" ? messages : messages.map((m) => `${name}: ${m}`)));
  }
  if (Object.keys(fields).length === 0 && others.length === 0) return { fields, message: err.message };
  return { fields, message: others.length > 0 ? others.join(" ") : null };
}

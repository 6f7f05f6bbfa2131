/** Job templates on the submit page: how one is named in the picker, and which of the API's
 * errors belong to the form (those of the template's `spec`) and which to the save dialog. */

import type { FieldErrors } from "../api/client";

export interface TemplateChoice {
  id: number;
  name: string;
  owner: string;
  shared?: boolean;
  description?: string;
}

/** A template as the picker names it: someone else's (shared) carries its owner, so that two
 * templates of the same name can be told apart. */
export function templateLabel(template: TemplateChoice, username: string): string {
  const name = template.owner === username ? template.name : `${template.name} (shared by ${template.owner})`;
  return template.description ? `${name}: ${template.description}` : name;
}

/** Your own templates first, then the shared ones of others, each by name. */
export function sortTemplates<T extends TemplateChoice>(templates: T[], username: string): T[] {
  const rank = (t: T) => (t.owner === username ? 0 : 1);
  return [...templates].sort((a, b) => rank(a) - rank(b) || a.name.localeCompare(b.name) || a.owner.localeCompare(b.owner));
}

/** Splits a refused save: `spec.*` errors go to the form's fields, under the keys a submission's
 * errors have (the same words, too); the rest (name, description, detail) to the dialog. */
export function splitTemplateErrors(fields: FieldErrors): { spec: FieldErrors; own: FieldErrors } {
  const spec: FieldErrors = {};
  const own: FieldErrors = {};
  for (const [key, messages] of Object.entries(fields)) {
    if (key === "spec") spec["detail"] = messages;
    else if (key.startsWith("spec.")) spec[key.slice(5)] = messages;
    else own[key] = messages;
  }
  return { spec, own };
}

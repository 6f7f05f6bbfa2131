// The submit form's state, and its conversion to and from a job spec (and so to and from YAML).
// Keys the form does not show (e.g. `resources`) are kept aside and sent unchanged.
import { parse, stringify } from "yaml";

export interface EnvVar {
  key: string;
  value: string;
}
export interface MountRow {
  name: string;
  path: string;
  read_only: boolean;
}
export type CommandMode = "shell" | "args";

export interface SpecForm {
  name: string;
  vc: string;
  flavor: string;
  image: string;
  commandMode: CommandMode;
  /** In shell mode one string for `sh -c`; in args mode one argument per line. */
  command: string;
  env: EnvVar[];
  mounts: MountRow[];
  replicas: string;
  priority: string;
  retryLimit: string;
  retryBackoff: string;
  permanentExitCodes: string;
  checkpointEnabled: boolean;
  checkpointSignal: string;
  checkpointGrace: string;
  timeLimit: string;
  timeSliceable: boolean;
  /** States to be mailed about (the spec's `notify`), in the API's names. */
  notify: string[];
  /** Ids of jobs to wait for, comma- or space-separated. */
  after: string;
  /** When they let the job start (the spec's `after_type`): ok, any or notok. */
  afterType: string;
}

export type SpecObject = Record<string, unknown>;

export const FORM_KEYS = [
  "name",
  "vc",
  "flavor",
  "image",
  "command",
  "env",
  "mounts",
  "replicas",
  "priority",
  "retries",
  "checkpoint",
  "time_limit",
  "time_sliceable",
  "after",
  "after_type",
  "notify",
];

/** The spec's `after_type` values, with what each means, in the order the form offers them. */
export const AFTER_TYPES: [string, string][] = [
  ["ok", "all succeeded (else it is cancelled)"],
  ["any", "all ended, however"],
  ["notok", "all ended, one of them without success (else it is cancelled)"],
];

/** What a job's `after` jobs must have done for it to start, said after their list ("Starts once
 * #41, #42 have succeeded"): a condition, not a report of what they did. A type this page does not
 * know is shown as named. */
export function afterText(afterType: string | undefined, count: number): string {
  const have = count === 1 ? "has" : "have";
  if (afterType === undefined || afterType === "ok") return `${have} succeeded`;
  if (afterType === "any") return `${have} ended`;
  if (afterType === "notok") return count === 1 ? "has ended without succeeding" : "have all ended, one of them without succeeding";
  return `(after_type ${afterType})`;
}

/** A number of seconds as duration text the portal reads back as the same number: "1h" for 3600,
 * "90m" for 5400 (minutes that are not whole hours, under a day), "1d12h", "45s", "1h0m30s" as
 * "1h30s". Anything but a positive whole number is left as it is. */
export function durationText(seconds: number): string {
  if (!Number.isInteger(seconds) || seconds <= 0) return String(seconds);
  const days = Math.floor(seconds / 86400);
  const hours = Math.floor((seconds % 86400) / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  const secs = seconds % 60;
  if (minutes && !secs && !days) return `${hours * 60 + minutes}m`;
  const parts: [number, string][] = [
    [days, "d"],
    [hours, "h"],
    [minutes, "m"],
    [secs, "s"],
  ];
  return parts.map(([n, unit]) => (n ? `${n}${unit}` : "")).join("");
}

/** A command the portal stored as `["sh", "-c", LINE]` (as it stores a shell line) is that line. */
function shellLine(command: unknown[]): string | null {
  return command.length === 3 && command[0] === "sh" && command[1] === "-c" && typeof command[2] === "string" ? command[2] : null;
}

/** The states a spec's `notify` may name, in the order the form offers them. */
export const NOTIFY_STATES = ["running", "succeeded", "failed", "cancelled", "timed-out", "preempted"];

export function emptyForm(): SpecForm {
  return {
    name: "",
    vc: "",
    flavor: "",
    image: "",
    commandMode: "shell",
    command: "",
    env: [],
    mounts: [],
    replicas: "1",
    priority: "",
    retryLimit: "0",
    retryBackoff: "60",
    permanentExitCodes: "",
    checkpointEnabled: false,
    checkpointSignal: "SIGUSR1",
    checkpointGrace: "120",
    timeLimit: "",
    timeSliceable: false,
    after: "",
    afterType: "ok",
    notify: [],
  };
}

/** A whole number stays a number; anything else is sent as typed, so the API can say what is wrong. */
function numberOrText(text: string): number | string {
  const t = text.trim();
  return /^-?\d+$/.test(t) ? Number(t) : t;
}

export function formToSpec(form: SpecForm, extra: SpecObject = {}): SpecObject {
  const spec: SpecObject = {};
  spec.name = form.name.trim();
  spec.vc = form.vc;
  if (form.flavor) spec.flavor = form.flavor;
  if (form.image.trim()) spec.image = form.image.trim();
  if (form.commandMode === "args") {
    spec.command = form.command.split("\n").filter((line) => line.length > 0);
  } else {
    spec.command = form.command;
  }
  const env = form.env.filter((e) => e.key.trim() !== "");
  if (env.length) spec.env = Object.fromEntries(env.map((e) => [e.key.trim(), e.value]));
  const mounts = form.mounts.filter((m) => m.name.trim() !== "" || m.path.trim() !== "");
  if (mounts.length) {
    spec.mounts = mounts.map((m) => ({ name: m.name.trim(), path: m.path.trim(), read_only: m.read_only }));
  }
  if (form.replicas.trim() !== "" && form.replicas.trim() !== "1") spec.replicas = numberOrText(form.replicas);
  if (form.priority) spec.priority = form.priority;
  const limit = numberOrText(form.retryLimit || "0");
  if (limit !== 0) {
    const retries: SpecObject = { limit };
    if (form.retryBackoff.trim() !== "") retries.backoff_seconds = numberOrText(form.retryBackoff);
    const codes = form.permanentExitCodes
      .split(/[\s,]+/)
      .filter(Boolean)
      .map(numberOrText);
    if (codes.length) retries.permanent_exit_codes = codes;
    spec.retries = retries;
  }
  if (form.checkpointEnabled) {
    spec.checkpoint = {
      enabled: true,
      signal: form.checkpointSignal,
      grace_seconds: numberOrText(form.checkpointGrace || "120"),
    };
  }
  if (form.timeLimit.trim()) spec.time_limit = numberOrText(form.timeLimit);
  if (form.timeSliceable) spec.time_sliceable = true;
  const after = form.after.split(/[\s,]+/).filter(Boolean).map(numberOrText);
  if (after.length) spec.after = after;
  // ok is the default; a type without jobs is still sent, for the API to say what is missing.
  if (form.afterType !== "ok") spec.after_type = form.afterType;
  if (form.notify.length) {
    // In the form's order; a state it does not offer (typed in YAML) is kept for the API to refuse.
    spec.notify = [...NOTIFY_STATES.filter((s) => form.notify.includes(s)), ...form.notify.filter((s) => !NOTIFY_STATES.includes(s))];
  }
  for (const [key, value] of Object.entries(extra)) {
    if (!FORM_KEYS.includes(key)) spec[key] = value;
  }
  return spec;
}

const text = (v: unknown): string => (v === undefined || v === null ? "" : String(v));

/** Reads a spec (from YAML or a job to clone) into the form; keys the form lacks go to `extra`. */
export function specToForm(spec: SpecObject): { form: SpecForm; extra: SpecObject } {
  const form = emptyForm();
  const extra: SpecObject = {};
  for (const [key, value] of Object.entries(spec)) {
    if (!FORM_KEYS.includes(key)) extra[key] = value;
  }
  form.name = text(spec.name);
  form.vc = text(spec.vc);
  form.flavor = text(spec.flavor);
  form.image = text(spec.image);
  const line = Array.isArray(spec.command) ? shellLine(spec.command) : null;
  if (line !== null) {
    form.command = line;
  } else if (Array.isArray(spec.command)) {
    form.commandMode = "args";
    form.command = spec.command.map(text).join("\n");
  } else {
    form.command = text(spec.command);
  }
  if (spec.env && typeof spec.env === "object" && !Array.isArray(spec.env)) {
    form.env = Object.entries(spec.env as Record<string, unknown>).map(([key, value]) => ({ key, value: text(value) }));
  }
  if (Array.isArray(spec.mounts)) {
    form.mounts = spec.mounts.map((m) => {
      const row = (m ?? {}) as Record<string, unknown>;
      return { name: text(row.name), path: text(row.path), read_only: row.read_only !== false };
    });
  }
  if (spec.replicas !== undefined) form.replicas = text(spec.replicas);
  form.priority = text(spec.priority);
  if (typeof spec.retries === "number" || typeof spec.retries === "string") {
    form.retryLimit = text(spec.retries);
  } else if (spec.retries && typeof spec.retries === "object") {
    const r = spec.retries as Record<string, unknown>;
    form.retryLimit = text(r.limit ?? 0);
    if (r.backoff_seconds !== undefined) form.retryBackoff = text(r.backoff_seconds);
    if (Array.isArray(r.permanent_exit_codes)) form.permanentExitCodes = r.permanent_exit_codes.map(text).join(", ");
  }
  if (spec.checkpoint && typeof spec.checkpoint === "object") {
    const c = spec.checkpoint as Record<string, unknown>;
    form.checkpointEnabled = c.enabled === true;
    if (c.signal !== undefined) form.checkpointSignal = text(c.signal);
    if (c.grace_seconds !== undefined) form.checkpointGrace = text(c.grace_seconds);
  }
  if (typeof spec.time_limit === "number") form.timeLimit = durationText(spec.time_limit);
  else if (spec.time_limit !== undefined && spec.time_limit !== null) form.timeLimit = text(spec.time_limit);
  form.timeSliceable = spec.time_sliceable === true;
  if (Array.isArray(spec.after)) form.after = spec.after.map(text).join(", ");
  if (spec.after_type !== undefined) form.afterType = text(spec.after_type);
  if (Array.isArray(spec.notify)) form.notify = spec.notify.map(text);
  return { form, extra };
}

/** The shape a what-if hint proposes, as a change to a spec. */
export interface HintShape {
  replicas: number;
  gpus_per_replica: number;
  gpu_model: string;
  flavor?: string | null;
  time_limit_s?: number | null;
}

/** A copy of `spec` with a what-if hint's changes: its flavor (or, for a spec that gives
 * resources, its GPUs and model), its replicas and its time limit. Everything else stays, but
 * a time limit (in seconds) above what the new flavor allows (`flavorLimitS`) is dropped, so the
 * job takes the new flavor's limit. */
export function applyHint(spec: SpecObject, hint: HintShape, flavorLimitS?: number): SpecObject {
  const next: SpecObject = { ...spec };
  const resources = spec.resources;
  if (hint.flavor) {
    next.flavor = hint.flavor;
    delete next.resources;
  } else if (resources && typeof resources === "object" && !Array.isArray(resources)) {
    const given = resources as SpecObject;
    const gpus = Number(given.gpus) || hint.gpus_per_replica;
    const share = hint.gpus_per_replica / gpus;
    next.resources = {
      ...given,
      gpus: hint.gpus_per_replica,
      gpu_model: hint.gpu_model || given.gpu_model,
      cpu: Math.max(1, Math.round((Number(given.cpu) || 1) * share)),
      memory_gb: Math.max(1, Math.round((Number(given.memory_gb) || 1) * share)),
    };
  }
  if (hint.replicas === 1) delete next.replicas;
  else next.replicas = hint.replicas;
  if (hint.time_limit_s) next.time_limit = hint.time_limit_s;
  else if (flavorLimitS !== undefined && typeof next.time_limit === "number" && next.time_limit > flavorLimitS) {
    delete next.time_limit;
  }
  return next;
}

/** The spec as YAML 1.1, which the portal reads (PyYAML): text such as `yes`, `12:30` or
 * `2026-01-01` is quoted, so the portal reads it back as the same text, not as a boolean, a
 * number or a date (YAML 1.2 would leave them bare). */
export function specToYaml(spec: SpecObject): string {
  return stringify(spec, { lineWidth: 0, version: "1.1" });
}

export type YamlResult = { ok: true; spec: SpecObject } | { ok: false; error: string };

export function parseSpecYaml(source: string): YamlResult {
  let value: unknown;
  try {
    value = parse(source);
  } catch (err) {
    return { ok: false, error: err instanceof Error ? err.message.split("\n")[0] ?? "Invalid YAML." : "Invalid YAML." };
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    return { ok: false, error: "A job spec is a YAML mapping (name: …, vc: …, command: …)." };
  }
  return { ok: true, spec: value as SpecObject };
}

const ORDINALS = ["first", "second", "third", "fourth", "fifth"];
const ordinal = (index: number): string => ORDINALS[index] ?? `${index + 1}th`;

/** The words for a nested key under one of the form's fields (`rest` of `retries.limit` is
 * `limit`), as the form names what it shows; "" when the field itself is meant. */
export function nestedLabel(key: string, rest: string): string {
  const [head = "", ...tail] = rest.split(".");
  const index = /^\d+$/.test(head) ? Number(head) : null;
  switch (key) {
    case "after":
      return index !== null ? `The ${ordinal(index)} job id` : "";
    case "retries":
      if (head === "limit") return "";
      if (head === "backoff_seconds") return "Backoff";
      if (head === "permanent_exit_codes") return tail.length ? `The ${ordinal(Number(tail[0]))} exit code` : "Exit codes";
      break;
    case "checkpoint":
      if (head === "grace_seconds") return "Grace";
      if (head === "signal") return "Signal";
      if (head === "enabled") return "";
      break;
    case "mounts":
      if (index !== null) return `Mount ${index + 1}${tail[0] === "path" ? " path" : tail[0] === "name" ? " volume" : ""}`;
      break;
    case "env":
      return `Variable ${rest}`;
    case "notify":
      return "";
  }
  const words = rest.replace(/[._]+/g, " ").trim();
  return words ? words.charAt(0).toUpperCase() + words.slice(1) : "";
}

/** Errors for one form field: its own key and any nested key under it (`retries.limit`), the
 * nested ones named in the form's words ("The first job id: …"), never by internal keys. */
export function errorsFor(errors: Record<string, string[]>, key: string): string[] {
  return Object.entries(errors)
    .filter(([k]) => k === key || k.startsWith(`${key}.`))
    .flatMap(([k, msgs]) => {
      const label = k === key ? "" : nestedLabel(key, k.slice(key.length + 1));
      return label ? msgs.map((m) => `${label}: ${m}`) : msgs;
    });
}

/** What the form can tell before sending: job ids to start after that are not whole numbers, and
 * retries that are not a whole number of 0 or more. Keyed as the API keys its errors. */
export function checkForm(form: SpecForm): Record<string, string[]> {
  const errors: Record<string, string[]> = {};
  const ids = form.after.split(/[\s,]+/).filter(Boolean);
  const bad = ids.filter((id) => !/^\d+$/.test(id));
  if (bad.length) {
    const named = bad.map((id) => `"${id}"`).join(", ");
    errors.after = [`${named} ${bad.length === 1 ? "is not a job id" : "are not job ids"}: give job numbers, such as 41, 42.`];
  }
  if (form.retryLimit.trim() !== "" && !/^\d+$/.test(form.retryLimit.trim())) {
    errors.retries = ["Give a whole number of retries, 0 or more."];
  }
  return errors;
}

/** The API's key (a spec field) that each of the form's fields fills, to clear its messages
 * when it is edited. */
const SPEC_KEY: Partial<Record<keyof SpecForm, string>> = {
  commandMode: "command",
  retryLimit: "retries",
  retryBackoff: "retries",
  permanentExitCodes: "retries",
  checkpointEnabled: "checkpoint",
  checkpointSignal: "checkpoint",
  checkpointGrace: "checkpoint",
  timeLimit: "time_limit",
  timeSliceable: "time_sliceable",
  afterType: "after_type",
};

/** `errors` without those of the fields an edit (`patch`) changed: a fixed field loses its message. */
export function withoutEdited(errors: Record<string, string[]>, patch: Partial<SpecForm>): Record<string, string[]> {
  const edited = Object.keys(patch).map((field) => SPEC_KEY[field as keyof SpecForm] ?? field);
  return Object.fromEntries(Object.entries(errors).filter(([k]) => !edited.includes(k.split(".")[0] ?? "")));
}

/** Errors whose key no form field shows. */
export function unplacedErrors(errors: Record<string, string[]>): [string, string[]][] {
  return Object.entries(errors).filter(([k]) => !FORM_KEYS.includes(k.split(".")[0] ?? ""));
}

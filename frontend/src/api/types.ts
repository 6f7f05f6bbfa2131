// Names for the API's shapes. Every shape comes from the generated OpenAPI types (schema.d.ts).
import type { components, operations } from "./schema";

type Schemas = components["schemas"];

export type Me = Schemas["Me"];
export type Sso = Schemas["Sso"];
export type Job = Schemas["Job"];
export type JobDetail = Schemas["JobDetail"];
export type JobAttempt = Schemas["JobAttempt"];
export type Allocation = Schemas["Allocation"];
export type ReplicaStatus = Schemas["ReplicaStatus"];
export type JobEvent = Schemas["JobEvent"];
export type WhatIfHint = Schemas["WhatIfHint"];
export type DryRun = Schemas["DryRun"];
export type BulkSubmitResult = Schemas["BulkSubmitResult"];
export type JobSpec = Schemas["JobSpec"];
export type JobState = Schemas["JobStateEnum"];
export type LogLine = Schemas["LogLine"];
export type TelemetrySample = Schemas["TelemetrySample"];
export type VirtualCluster = Schemas["VirtualCluster"];
export type Quota = Schemas["Quota"];
export type Flavor = Schemas["Flavor"];
export type PriorityClass = Schemas["PriorityClass"];
export type ClusterNode = Schemas["Node"];
export type Gpu = Schemas["Gpu"];
export type GpuReading = Schemas["GpuReading"];

export interface Page<T> {
  count: number;
  next?: string | null;
  previous?: string | null;
  results: T[];
}

export const ACTIVE_STATES: JobState[] = [
  "pending",
  "scheduled",
  "starting",
  "running",
  "suspended",
  "checkpointing",
  "preempted",
  "lost",
];
export const ENDED_STATES: JobState[] = ["succeeded", "failed", "cancelled", "timed-out"];
export const ALL_STATES: JobState[] = [...ACTIVE_STATES, ...ENDED_STATES];

export function isEnded(state: JobState | undefined): boolean {
  return state !== undefined && ENDED_STATES.includes(state);
}

export type ApiToken = Schemas["ApiToken"];
export type CreatedApiToken = Schemas["CreatedApiToken"];
export type Webhook = Schemas["Webhook"];
export type WebhookFormat = Schemas["WebhookFormatEnum"];
export type JobTemplate = Schemas["JobTemplate"];

export type UsageGroup = NonNullable<NonNullable<operations["usage_retrieve"]["parameters"]["query"]>["group"]>;
export type UsageRow = Schemas["UsageRow"];
export type UsageReport = Omit<Schemas["UsageReport"], "group"> & { group: UsageGroup };

export type Role = Schemas["RoleEnum"];
/** A tenant the user belongs to, with their own role in it. */
export type Tenant = Schemas["Tenant"];
/** A member of one of the user's tenants, by user name, with their role (no address, for anyone). */
export type Member = Schemas["Member"];

/** A tenant's members page: the roles, the API's addresses, and which tenant to open. */

import type { Role, Tenant } from "../api/types";

/** In the order of how much they may do, labelled as the portal labels them. */
export const ROLES: readonly { value: Role; label: string }[] = [
  { value: "admin", label: "Tenant admin" },
  { value: "member", label: "Member" },
  { value: "viewer", label: "Viewer" },
];

export function roleLabel(role: Role | string): string {
  return ROLES.find((r) => r.value === role)?.label ?? role;
}

/** `/api/v1/tenants/NAME/members/`, or a member's `.../USERNAME/`; a user name may hold `@` or `+`. */
export function membersApiPath(tenant: string, username?: string): string {
  const path = `/api/v1/tenants/${encodeURIComponent(tenant)}/members/`;
  return username === undefined ? path : `${path}${encodeURIComponent(username)}/`;
}

/** The page of a tenant's members in the app. */
export function membersPagePath(tenant: string): string {
  return `/tenants/${encodeURIComponent(tenant)}/members`;
}

/** Which tenant `/members` opens: the first the user administers (where there is something to
 * do), else the first of theirs; null when they belong to none. The API lists them by name. */
export function tenantToOpen(tenants: readonly Tenant[]): Tenant | null {
  return tenants.find((t) => t.role === "admin") ?? tenants[0] ?? null;
}

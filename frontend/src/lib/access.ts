// Who may act on a job (docs/api.md): the pages offer an action only to those the portal lets do it.
import type { Job, Me, Role } from "../api/types";

/** The user's role in a tenant (by name), or null when they are not its member. */
export function roleIn(me: Me, tenant: string): Role | null {
  const membership = me.memberships.find((m) => m.tenant === tenant);
  return membership ? (membership.role ?? "member") : null;
}

/** Whether the user may cancel, hold, release, pause, move or change the time limit of the job:
 * a cluster admin, an admin of the job's tenant, or its owner while a member there (not a viewer). */
export function mayManage(job: Pick<Job, "tenant" | "owner">, me: Me): boolean {
  if (me.is_staff) return true;
  const role = roleIn(me, job.tenant);
  return role === "admin" || (role === "member" && job.owner === me.username);
}

/** Whether the user may open a shell in the job: only while it runs, only its owner, and only while
 * a member or admin of its tenant (a cluster admin too needs that role). */
export function mayOpenShell(job: Pick<Job, "tenant" | "owner" | "state">, me: Me): boolean {
  const role = roleIn(me, job.tenant);
  return job.state === "running" && job.owner === me.username && (role === "member" || role === "admin");
}

/** Why the user may not submit a job of this priority class to a VC of `tenant`, or null when
 * they may: a class marked `tenant_admins_only` is for the tenant's admins and cluster admins. */
export function priorityRefusal(priority: { tenant_admins_only?: boolean }, me: Me, tenant: string | undefined): string | null {
  if (!priority.tenant_admins_only || me.is_staff) return null;
  if (tenant !== undefined && roleIn(me, tenant) === "admin") return null;
  return tenant ? `only admins of ${tenant} may use it` : "only tenant admins may use it";
}

/** Whether the user may delete a job template: its owner, or for a shared one an admin of its
 * tenant or a cluster admin. */
export function mayDeleteTemplate(template: { owner: string; tenant: string; shared?: boolean }, me: Me): boolean {
  if (template.owner === me.username) return true;
  return template.shared === true && (me.is_staff || roleIn(me, template.tenant) === "admin");
}

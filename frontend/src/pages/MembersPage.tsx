import { type FormEvent, useEffect, useState } from "react";

import { type FieldErrors, api, fetchAll } from "../api/client";
import type { Member, Role, Tenant } from "../api/types";
import { Empty, ErrorBanner, PageHeader, Section, Spinner } from "../components/common";
import { ResourceTable } from "../components/ResourceTable";
import { formErrors } from "../lib/forms";
import { ROLES, membersApiPath, membersPagePath, tenantToOpen } from "../lib/members";
import { type Resource, useResource } from "../lib/useResource";
import { navigate } from "../router";
import { useSession } from "../session";

function useTenants(): Resource<Tenant[]> {
  return useResource((signal) => fetchAll<Tenant>("/api/v1/tenants/", signal), "tenants");
}

/** `/members`: opens the members page of one of the user's tenants (tenantToOpen). */
export function MembersIndexPage() {
  const tenants = useTenants();
  const open = tenants.data ? tenantToOpen(tenants.data) : null;
  useEffect(() => {
    if (open) navigate(membersPagePath(open.name), { replace: true });
  }, [open]);
  return (
    <>
      <PageHeader title="Members" />
      <ErrorBanner error={tenants.error} onRetry={tenants.reload} />
      {tenants.loading && !tenants.data && <Spinner />}
      {tenants.data?.length === 0 && <Empty>You belong to no tenant.</Empty>}
    </>
  );
}

/** The members of one of the user's tenants (`/tenants/NAME/members`). Every member sees them;
 * the tenant's admins also add members, change roles (saved on change) and remove members. */
export function MembersPage({ tenant }: { tenant: string }) {
  const { me } = useSession();
  const tenants = useTenants();
  const members = useResource((signal) => fetchAll<Member>(membersApiPath(tenant), signal), `members:${tenant}`);
  const current = tenants.data?.find((t) => t.name === tenant);
  const isAdmin = current?.role === "admin";

  const [username, setUsername] = useState("");
  const [role, setRole] = useState<Role>("member");
  const [addErrors, setAddErrors] = useState<FieldErrors>({});
  const [addFailure, setAddFailure] = useState<string | null>(null);
  const [added, setAdded] = useState<string | null>(null);
  // A role being saved shows in its row's select until the list is loaded again.
  const [saving, setSaving] = useState<{ username: string; role: Role } | null>(null);
  const [roleErrors, setRoleErrors] = useState<{ username: string; messages: string[] } | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [busy, setBusy] = useState<string | null>(null); // "add" or the user name of the row at work

  // A change to one's own membership (stepping down, leaving) changes what the page offers.
  const reloadAll = () => {
    members.reload();
    tenants.reload();
  };

  const add = async (event: FormEvent) => {
    event.preventDefault();
    clearOutcomes();
    setBusy("add");
    try {
      const member = await api<Member>(membersApiPath(tenant), { method: "POST", body: { username: username.trim(), role } });
      setAdded(`Added ${member.username} as ${member.role_label}.`);
      setUsername("");
      setRole("member");
      members.reload();
    } catch (err) {
      const refused = formErrors(err, ["username", "role"]);
      setAddErrors(refused.fields);
      setAddFailure(refused.message);
    } finally {
      setBusy(null);
    }
  };

  // Each action's outcome replaces the last one's: no "Added …" beside a later refusal.
  const clearOutcomes = () => {
    setAdded(null);
    setAddErrors({});
    setAddFailure(null);
    setRoleErrors(null);
    setFailure(null);
  };

  const changeRole = async (member: Member, newRole: Role) => {
    clearOutcomes();
    setBusy(member.username);
    setSaving({ username: member.username, role: newRole });
    setRoleErrors(null);
    setFailure(null);
    try {
      await api<Member>(membersApiPath(tenant, member.username), { method: "PATCH", body: { role: newRole } });
    } catch (err) {
      const refused = formErrors(err, ["role"]);
      if (refused.fields["role"]) setRoleErrors({ username: member.username, messages: refused.fields["role"] });
      setFailure(refused.message);
    } finally {
      setBusy(null);
      setSaving(null);
      reloadAll();
    }
  };

  const remove = async (member: Member) => {
    clearOutcomes();
    setBusy(member.username);
    setRoleErrors(null);
    setFailure(null);
    try {
      await api(membersApiPath(tenant, member.username), { method: "DELETE" });
    } catch (err) {
      setFailure(formErrors(err, []).message);
    } finally {
      setBusy(null);
      reloadAll();
    }
  };

  const title = current ? `Members of ${current.display_name || current.name}` : `Members of ${tenant}`;
  // A choice of tenant when there is one to make, or when this one is none of the user's.
  const picker = tenants.data && (tenants.data.length > 1 || (!current && tenants.data.length > 0)) && (
    <div className="tenant-picker">
      <label htmlFor="members-tenant">Tenant</label>
      <select id="members-tenant" value={current ? tenant : ""} onChange={(e) => navigate(membersPagePath(e.target.value))}>
        {!current && <option value="">(choose)</option>}
        {tenants.data.map((t) => (
          <option key={t.name} value={t.name}>
            {t.display_name || t.name} ({t.role_label})
          </option>
        ))}
      </select>
    </div>
  );

  return (
    <>
      <PageHeader title={title}>{picker}</PageHeader>
      <ErrorBanner error={tenants.error} onRetry={tenants.reload} />
      {isAdmin && (
        <Section title="Add member">
          <p className="hint">Add a user who has an account on the portal.</p>
          <ErrorBanner error={addFailure} />
          <form className="member-form" onSubmit={add}>
            <div className={addErrors["username"] ? "field has-error" : "field"}>
              <label htmlFor="member-username">User name</label>
              <input
                id="member-username"
                value={username}
                required
                autoComplete="off"
                spellCheck={false}
                onChange={(e) => {
                  setUsername(e.target.value);
                  setAddErrors({});
                  setAddFailure(null);
                  setAdded(null);
                }}
              />
              <FieldMessages messages={addErrors["username"]} />
            </div>
            <div className={addErrors["role"] ? "field has-error" : "field"}>
              <label htmlFor="member-role">Role</label>
              <select id="member-role" value={role} onChange={(e) => setRole(e.target.value as Role)}>
                <RoleOptions />
              </select>
              <FieldMessages messages={addErrors["role"]} />
            </div>
            <button type="submit" className="button primary" disabled={busy === "add" || !username.trim()}>
              {busy === "add" ? "Adding…" : "Add member"}
            </button>
          </form>
          {added && (
            <p className="notice" role="status">
              {added}
            </p>
          )}
        </Section>
      )}
      <Section title="Members">
        {current && !isAdmin && (
          <p className="hint">
            You are a {current.role_label.toLowerCase()} of {current.display_name || current.name}: its admins add and
            remove members and change their roles.
          </p>
        )}
        <ErrorBanner error={failure} />
        <ResourceTable
          items={members}
          caption={title}
          columns={["User", "Role"]}
          emptyText="No members."
          rowKey={(m) => m.username}
          renderCells={(m) => (
            <>
              <td>
                {m.username}
                {m.username === me.username && <span className="hint"> (you)</span>}
              </td>
              <td>
                {isAdmin ? (
                  <div className={roleErrors?.username === m.username ? "member-role has-error" : "member-role"}>
                    <select
                      aria-label={`Role of ${m.username}`}
                      value={saving?.username === m.username ? saving.role : m.role}
                      disabled={busy === m.username}
                      onChange={(e) => changeRole(m, e.target.value as Role)}
                    >
                      <RoleOptions />
                    </select>
                    <FieldMessages messages={roleErrors?.username === m.username ? roleErrors.messages : undefined} />
                  </div>
                ) : (
                  m.role_label
                )}
              </td>
            </>
          )}
          actionsClassName="row-actions"
          renderActions={(m) =>
            isAdmin && (
              <button
                type="button"
                className="button small danger"
                disabled={busy === m.username}
                onClick={() => remove(m)}
                aria-label={`Remove ${m.username}`}
              >
                Remove
              </button>
            )
          }
        />
      </Section>
    </>
  );
}

function RoleOptions() {
  return ROLES.map((r) => (
    <option key={r.value} value={r.value}>
      {r.label}
    </option>
  ));
}

function FieldMessages({ messages }: { messages: string[] | undefined }) {
  return messages?.map((m) => (
    <p key={m} className="field-error">
      {m}
    </p>
  ));
}

import { describe, expect, it } from "vitest";

import type { Job, Me } from "../api/types";
import { mayDeleteTemplate, mayManage, mayOpenShell, priorityRefusal, roleIn } from "./access";

function me(username: string, memberships: Me["memberships"], is_staff = false): Me {
  return { username, is_staff, email: "", mail_enabled: false, memberships };
}

function job(owner: string, tenant = "vision", state: Job["state"] = "running"): Pick<Job, "tenant" | "owner" | "state"> {
  return { owner, tenant, state };
}

describe("roleIn", () => {
  it("is the user's role in the tenant, member when the API gives none, null outside it", () => {
    const ann = me("ann", [{ tenant: "vision", role: "viewer" }, { tenant: "speech" }]);
    expect(roleIn(ann, "vision")).toBe("viewer");
    expect(roleIn(ann, "speech")).toBe("member");
    expect(roleIn(ann, "audio")).toBeNull();
  });
});

describe("mayManage", () => {
  it("lets the owner manage their job while a member of its tenant", () => {
    expect(mayManage(job("ann"), me("ann", [{ tenant: "vision", role: "member" }]))).toBe(true);
    expect(mayManage(job("bob"), me("ann", [{ tenant: "vision", role: "member" }]))).toBe(false);
  });

  it("not an owner who is now a viewer of the job's tenant, nor one who left it", () => {
    expect(mayManage(job("ann"), me("ann", [{ tenant: "vision", role: "viewer" }]))).toBe(false);
    expect(mayManage(job("ann"), me("ann", [{ tenant: "speech", role: "admin" }]))).toBe(false);
  });

  it("lets an admin of the job's tenant and a cluster admin manage anyone's job", () => {
    expect(mayManage(job("bob"), me("ann", [{ tenant: "vision", role: "admin" }]))).toBe(true);
    expect(mayManage(job("bob"), me("root", [], true))).toBe(true);
    expect(mayManage(job("bob", "speech"), me("ann", [{ tenant: "vision", role: "admin" }]))).toBe(false);
  });
});

describe("mayOpenShell", () => {
  it("is the owner's, as a member or admin of the job's tenant, while the job runs", () => {
    expect(mayOpenShell(job("ann"), me("ann", [{ tenant: "vision", role: "member" }]))).toBe(true);
    expect(mayOpenShell(job("ann"), me("ann", [{ tenant: "vision", role: "admin" }]))).toBe(true);
    expect(mayOpenShell(job("ann", "vision", "pending"), me("ann", [{ tenant: "vision", role: "member" }]))).toBe(false);
  });

  it("not an owner who is now a viewer, nor anyone else, a cluster admin included", () => {
    expect(mayOpenShell(job("ann"), me("ann", [{ tenant: "vision", role: "viewer" }]))).toBe(false);
    expect(mayOpenShell(job("bob"), me("ann", [{ tenant: "vision", role: "admin" }]))).toBe(false);
    expect(mayOpenShell(job("root"), me("root", [], true))).toBe(false);
    expect(mayOpenShell(job("bob"), me("root", [{ tenant: "vision", role: "admin" }], true))).toBe(false);
  });
});

describe("priorityRefusal", () => {
  const production = { tenant_admins_only: true };
  it("keeps a class for tenant admins from the tenant's members, with the reason", () => {
    const bob = me("bob", [{ tenant: "vision", role: "member" }, { tenant: "speech", role: "admin" }]);
    expect(priorityRefusal(production, bob, "vision")).toBe("only admins of vision may use it");
    expect(priorityRefusal(production, bob, "speech")).toBeNull();
    expect(priorityRefusal({ tenant_admins_only: false }, bob, "vision")).toBeNull();
    expect(priorityRefusal(production, me("root", [], true), "vision")).toBeNull();
    expect(priorityRefusal(production, bob, undefined)).toBe("only tenant admins may use it");
  });
});

describe("mayDeleteTemplate", () => {
  it("is its owner, or for a shared one an admin of its tenant", () => {
    const ann = me("ann", [{ tenant: "vision", role: "admin" }]);
    const bob = me("bob", [{ tenant: "vision", role: "member" }]);
    const bobs = { owner: "bob", tenant: "vision", shared: true };
    expect(mayDeleteTemplate(bobs, bob)).toBe(true);
    expect(mayDeleteTemplate(bobs, ann)).toBe(true);
    expect(mayDeleteTemplate({ ...bobs, shared: false }, ann)).toBe(false);
    expect(mayDeleteTemplate({ owner: "ann", tenant: "vision", shared: true }, bob)).toBe(false);
    expect(mayDeleteTemplate(bobs, me("root", [], true))).toBe(true);
  });
});

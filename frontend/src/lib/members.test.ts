import { describe, expect, it } from "vitest";

import type { Tenant } from "../api/types";
import { membersApiPath, membersPagePath, roleLabel, tenantToOpen } from "./members";

function tenant(name: string, role: Tenant["role"]): Tenant {
  return { name, display_name: name.toUpperCase(), role, role_label: roleLabel(role) };
}

describe("membersApiPath and membersPagePath", () => {
  it("quote the tenant and the user name", () => {
    expect(membersApiPath("vision")).toBe("/api/v1/tenants/vision/members/");
    expect(membersApiPath("vision", "ann+gpu@example.org")).toBe("/api/v1/tenants/vision/members/ann%2Bgpu%40example.org/");
    expect(membersApiPath("a/b", "x/y")).toBe("/api/v1/tenants/a%2Fb/members/x%2Fy/");
    expect(membersPagePath("speech lab")).toBe("/tenants/speech%20lab/members");
  });
});

describe("roleLabel", () => {
  it("labels roles as the portal does, and an unknown one by its name", () => {
    expect(["admin", "member", "viewer"].map(roleLabel)).toEqual(["Tenant admin", "Member", "Viewer"]);
    expect(roleLabel("owner")).toBe("owner");
  });
});

describe("tenantToOpen", () => {
  it("opens the first tenant the user administers", () => {
    expect(tenantToOpen([tenant("audio", "member"), tenant("speech", "viewer"), tenant("vision", "admin")])?.name).toBe(
      "vision",
    );
  });

  it("otherwise the first of theirs, and none when they belong to none", () => {
    expect(tenantToOpen([tenant("speech", "viewer"), tenant("vision", "member")])?.name).toBe("speech");
    expect(tenantToOpen([])).toBeNull();
  });
});

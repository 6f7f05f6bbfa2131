import { createContext, useContext } from "react";

import { api } from "./api/client";
import type { Me } from "./api/types";

/** Who is signed in, or null for nobody: the session answers 204 then, not a refusal, so a
 * signed-out visit shows no failed request in the browser's console. */
export async function signedInUser(): Promise<Me | null> {
  return (await api<Me | undefined>("/api/v1/session/", { quiet401: true })) ?? null;
}

export interface SessionValue {
  me: Me;
  signOut: () => void;
}

export const SessionContext = createContext<SessionValue | null>(null);

export function useSession(): SessionValue {
  const value = useContext(SessionContext);
  if (!value) throw new Error("useSession outside a signed-in session");
  return value;
}

/** Tenants where the user may submit (admin or member). */
export function canSubmit(me: Me): boolean {
  return me.is_staff || me.memberships.some((m) => m.role !== "viewer");
}

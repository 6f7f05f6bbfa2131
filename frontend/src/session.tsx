import { createContext, useContext } from "react";

import type { Me } from "./api/types";

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

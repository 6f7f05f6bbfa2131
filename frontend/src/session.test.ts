import { afterEach, describe, expect, it, vi } from "vitest";

import { ApiError } from "./api/client";
import { signedInUser } from "./session";

const ALICE = { username: "alice", is_staff: false, email: "", mail_enabled: false, memberships: [] };

function answer(response: Response): string[] {
  const asked: string[] = [];
  vi.stubGlobal("fetch", (path: string) => {
    asked.push(path);
    return Promise.resolve(response);
  });
  return asked;
}

describe("who is signed in", () => {
  afterEach(() => {
    vi.unstubAllGlobals();
  });

  it("is nobody when the session answers 204", async () => {
    const asked = answer(new Response(null, { status: 204 }));
    expect(await signedInUser()).toBeNull();
    expect(asked).toEqual(["/api/v1/session/"]);
  });

  it("is the user the session names", async () => {
    answer(new Response(JSON.stringify(ALICE), { status: 200, headers: { "Content-Type": "application/json" } }));
    expect(await signedInUser()).toEqual(ALICE);
  });

  it("is an error when the portal fails to say", async () => {
    answer(new Response(JSON.stringify({ detail: "Service unavailable." }), { status: 503 }));
    await expect(signedInUser()).rejects.toBeInstanceOf(ApiError);
  });
});

import { describe, expect, it } from "vitest";

import { ApiError } from "../api/client";
import { formErrors } from "./forms";

describe("formErrors", () => {
  it("puts the messages for the form's fields under them", () => {
    const refused = new ApiError(400, "username: No user named 'ghost'.", { username: ["No user named 'ghost'."] });
    expect(formErrors(refused, ["username", "role"])).toEqual({
      fields: { username: ["No user named 'ghost'."] },
      message: null,
    });
  });

  it("gives a refusal of the whole request, and fields the form lacks, as one message", () => {
    const lastAdmin = "vision-admin is the last admin of vision; make another member an admin first.";
    expect(formErrors(new ApiError(400, lastAdmin, { detail: [lastAdmin] }), ["role"])).toEqual({
      fields: {},
      message: lastAdmin,
    });
    const mixed = new ApiError(400, "role: bad", { role: ["bad"], tenant: ["gone"] });
    expect(formErrors(mixed, ["role"])).toEqual({ fields: { role: ["bad"] }, message: "tenant: gone" });
  });

  it("says a 403, a 404 or no answer in the portal's words, at no field", () => {
    const denied = new ApiError(403, "Only an admin of tenant vision may change its members.", {
      detail: ["Only an admin of tenant vision may change its members."],
    });
    expect(formErrors(denied, ["username"])).toEqual({
      fields: {},
      message: "Only an admin of tenant vision may change its members.",
    });
    const missing = new ApiError(404, "No such tenant among yours.", { detail: ["No such tenant among yours."] });
    expect(formErrors(missing, ["username"]).message).toBe("No such tenant among yours.");
    expect(formErrors(new ApiError(0, "The portal cannot be reached. Check your connection."), ["username"]).message).toBe(
      "The portal cannot be reached. Check your connection.",
    );
    expect(formErrors(new Error("boom"), ["username"])).toEqual({ fields: {}, message: "boom" });
  });

  it("falls back to the error's message for a 400 without a body", () => {
    expect(formErrors(new ApiError(400, "The portal answered 400."), ["username"])).toEqual({
      fields: {},
      message: "The portal answered 400.",
    });
  });
});

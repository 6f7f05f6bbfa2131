import { describe, expect, it } from "vitest";

import type { Webhook } from "../api/types";
import { deliveryOutcome, notifyChannels } from "./webhooks";

function hook(patch: Partial<Webhook>): Webhook {
  return {
    id: 1,
    url: "https://hooks.example.org/abc",
    format: "slack",
    enabled: true,
    has_secret: false,
    created_at: "2026-01-01T12:00:00Z",
    last_delivery_at: null,
    last_delivery_event: "",
    last_delivery_status: null,
    last_delivery_error: "",
    last_delivery_ok: null,
    ...patch,
  };
}

describe("deliveryOutcome", () => {
  it("says when nothing was delivered yet", () => {
    expect(deliveryOutcome(hook({}))).toEqual({ ok: null, text: "none yet" });
  });

  it("gives the status of an answer, and the error with it", () => {
    const at = "2026-01-01T12:01:00Z";
    expect(deliveryOutcome(hook({ last_delivery_at: at, last_delivery_status: 200, last_delivery_ok: true }))).toEqual({
      ok: true,
      text: "HTTP 200",
    });
    expect(deliveryOutcome(hook({ last_delivery_at: at, last_delivery_status: 404, last_delivery_ok: false }))).toEqual({
      ok: false,
      text: "HTTP 404",
    });
    const moved = hook({ last_delivery_at: at, last_delivery_status: 302, last_delivery_error: "redirected", last_delivery_ok: false });
    expect(deliveryOutcome(moved).text).toBe("HTTP 302: redirected");
  });

  it("gives the error when no answer came", () => {
    const refused = hook({ last_delivery_at: "2026-01-01T12:01:00Z", last_delivery_error: "ConnectError: refused", last_delivery_ok: false });
    expect(deliveryOutcome(refused)).toEqual({ ok: false, text: "ConnectError: refused" });
  });
});

describe("notifyChannels", () => {
  it("names the address and the webhooks", () => {
    expect(notifyChannels({ email: "a@example.org", mail_enabled: true }, 0)).toEqual({ possible: true, hint: "To a@example.org." });
    expect(notifyChannels({ email: "a@example.org", mail_enabled: true }, 2).hint).toBe("To a@example.org and your 2 webhooks.");
    expect(notifyChannels({ email: "a@example.org", mail_enabled: false }, 1)).toEqual({ possible: true, hint: "To your webhook." });
  });

  it("says how to be notified when nothing would reach the user", () => {
    const noAddress = notifyChannels({ email: "", mail_enabled: true }, 0);
    expect(noAddress.possible).toBe(false);
    expect(noAddress.hint).toMatch(/^Your account has no email address: add a webhook/);
    expect(notifyChannels({ email: "a@example.org", mail_enabled: false }, 0)).toEqual({
      possible: false,
      hint: "This portal sends no mail: add a webhook on the Tokens & webhooks page to be notified.",
    });
  });
});

// Webhooks in words: the latest delivery's outcome, and where a spec's `notify` would go.
import type { Me, Webhook } from "../api/types";

export const WEBHOOK_FORMATS = [
  { value: "slack", label: "Slack / Mattermost" },
  { value: "json", label: "JSON event" },
] as const;

export interface DeliveryOutcome {
  /** null before the first delivery. */
  ok: boolean | null;
  text: string;
}

/** The latest delivery, for the owner to debug their receiver with: the HTTP status and the error. */
export function deliveryOutcome(hook: Webhook): DeliveryOutcome {
  if (!hook.last_delivery_at) return { ok: null, text: "none yet" };
  const parts: string[] = [];
  if (hook.last_delivery_status !== null) parts.push(`HTTP ${hook.last_delivery_status}`);
  if (hook.last_delivery_error) parts.push(hook.last_delivery_error);
  return { ok: hook.last_delivery_ok === true, text: parts.join(": ") || "no answer" };
}

export interface NotifyChannels {
  /** Whether a spec's `notify` would reach the user at all (the API refuses it otherwise). */
  possible: boolean;
  hint: string;
}

/** Where the portal tells the user about their job's states: mail, when it sends mail and they have
 * an address, and each enabled webhook. */
export function notifyChannels(me: Pick<Me, "email" | "mail_enabled">, enabledWebhooks: number): NotifyChannels {
  const mail = me.mail_enabled && me.email ? me.email : "";
  const hooks = enabledWebhooks === 1 ? "your webhook" : `your ${enabledWebhooks} webhooks`;
  if (mail && enabledWebhooks > 0) return { possible: true, hint: `To ${mail} and ${hooks}.` };
  if (mail) return { possible: true, hint: `To ${mail}.` };
  if (enabledWebhooks > 0) return { possible: true, hint: `To ${hooks}.` };
  const add = "add a webhook on the Tokens & webhooks page";
  if (me.mail_enabled) {
    return { possible: false, hint: `Your account has no email address: ${add}, or ask a cluster admin to set one.` };
  }
  return { possible: false, hint: `This portal sends no mail: ${add} to be notified.` };
}

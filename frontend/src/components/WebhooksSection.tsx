import { type FormEvent, useState } from "react";

import { ApiError, api, fetchAll } from "../api/client";
import type { Webhook, WebhookFormat } from "../api/types";
import { useResource } from "../lib/useResource";
import { WEBHOOK_FORMATS, deliveryOutcome } from "../lib/webhooks";
import { ErrorBanner, Relative, Section } from "./common";
import { ResourceTable } from "./ResourceTable";

/** The user's webhooks: where the portal posts about their jobs (a spec's `notify`, idle GPUs).
 * Add, enable or disable, test, delete; each shows its latest delivery's outcome. */
export function WebhooksSection() {
  const hooks = useResource((signal) => fetchAll<Webhook>("/api/v1/webhooks/", signal), "webhooks");
  const [url, setUrl] = useState("");
  const [format, setFormat] = useState<WebhookFormat>("slack");
  const [secret, setSecret] = useState("");
  const [errors, setErrors] = useState<Record<string, string[]>>({});
  const [addFailure, setAddFailure] = useState<string | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [tested, setTested] = useState<string | null>(null);
  const [busy, setBusy] = useState<number | "add" | null>(null);

  const add = async (event: FormEvent) => {
    event.preventDefault();
    setBusy("add");
    setErrors({});
    setAddFailure(null);
    try {
      await api<Webhook>("/api/v1/webhooks/", { method: "POST", body: { url: url.trim(), format, secret } });
      setUrl("");
      setSecret("");
      hooks.reload();
    } catch (err) {
      const fields = err instanceof ApiError && err.status === 400 ? err.fields : {};
      setErrors(fields);
      // A field's error shows at the field; anything else (the limit, a network error) above the form.
      if (!["url", "format", "secret"].some((name) => fields[name])) setAddFailure(err instanceof Error ? err.message : String(err));
    } finally {
      setBusy(null);
    }
  };

  const act = async (hook: Webhook, run: () => Promise<void>) => {
    setBusy(hook.id);
    setAddFailure(null);
    setFailure(null);
    setTested(null);
    try {
      await run();
    } catch (err) {
      setFailure(err instanceof Error ? err.message : String(err));
    } finally {
      setBusy(null);
      hooks.reload();
    }
  };

  const test = (hook: Webhook) =>
    act(hook, async () => {
      const after = await api<Webhook>(`/api/v1/webhooks/${hook.id}/test/`, { method: "POST" });
      const outcome = deliveryOutcome(after);
      setTested(`${outcome.ok ? "Test delivered" : "Test failed"}: ${outcome.text}.`);
    });
  const toggle = (hook: Webhook) =>
    act(hook, async () => {
      await api(`/api/v1/webhooks/${hook.id}/`, { method: "PATCH", body: { enabled: !hook.enabled } });
    });
  const remove = (hook: Webhook) =>
    act(hook, async () => {
      await api(`/api/v1/webhooks/${hook.id}/`, { method: "DELETE" });
    });

  const fieldErrors = (name: string) =>
    errors[name]?.map((m) => (
      <p key={m} className="field-error">
        {m}
      </p>
    ));

  return (
    <>
      <Section title="New webhook">
        <p className="hint">
          The portal posts to your webhooks when a job reaches a state its spec&apos;s <code>notify</code> names, and when a
          job&apos;s GPUs sit idle. A secret signs each delivery (<code>X-GPU-Portal-Signature</code>).
        </p>
        <ErrorBanner error={addFailure} />
        <form className="webhook-form" onSubmit={add}>
          <div className={errors["url"] ? "field has-error" : "field"}>
            <label htmlFor="webhook-url">URL</label>
            <input
              id="webhook-url"
              type="url"
              value={url}
              required
              placeholder="https://hooks.slack.com/services/…"
              onChange={(e) => {
                setUrl(e.target.value);
                setErrors(({ url: _url, ...rest }) => rest);
                setAddFailure(null);
              }}
            />
            {fieldErrors("url")}
          </div>
          <div className={errors["format"] ? "field has-error" : "field"}>
            <label htmlFor="webhook-format">Format</label>
            <select id="webhook-format" value={format} onChange={(e) => setFormat(e.target.value as WebhookFormat)}>
              {WEBHOOK_FORMATS.map((f) => (
                <option key={f.value} value={f.value}>
                  {f.label}
                </option>
              ))}
            </select>
            {fieldErrors("format")}
          </div>
          <div className={errors["secret"] ? "field has-error" : "field"}>
            <label htmlFor="webhook-secret">Secret (optional)</label>
            <input id="webhook-secret" value={secret} autoComplete="off" spellCheck={false} onChange={(e) => setSecret(e.target.value)} />
            {fieldErrors("secret")}
          </div>
          <button type="submit" className="button primary" disabled={busy === "add" || !url.trim()}>
            {busy === "add" ? "Adding…" : "Add webhook"}
          </button>
        </form>
      </Section>
      <Section title="Your webhooks">
        <ErrorBanner error={failure} />
        {tested && (
          <p className="notice" role="status">
            {tested}
          </p>
        )}
        <ResourceTable
          items={hooks}
          caption="Your webhooks"
          columns={["URL", "Format", "Signed", "Last delivery"]}
          emptyText="No webhooks yet."
          renderCells={(hook) => <WebhookCells hook={hook} />}
          actionsClassName="row-actions"
          renderActions={(hook) => (
            <>
              <button
                type="button"
                className="button small"
                disabled={busy === hook.id}
                onClick={() => test(hook)}
                aria-label={`Test ${hook.url}`}
              >
                Test
              </button>
              <button
                type="button"
                className="button small"
                disabled={busy === hook.id}
                onClick={() => toggle(hook)}
                aria-label={`${hook.enabled ? "Disable" : "Enable"} ${hook.url}`}
              >
                {hook.enabled ? "Disable" : "Enable"}
              </button>
              <button
                type="button"
                className="button small danger"
                disabled={busy === hook.id}
                onClick={() => remove(hook)}
                aria-label={`Delete ${hook.url}`}
              >
                Delete
              </button>
            </>
          )}
        />
      </Section>
    </>
  );
}

/** A webhook's data cells: where it posts, how, whether signed, and how its latest delivery went. */
function WebhookCells({ hook }: { hook: Webhook }) {
  const outcome = deliveryOutcome(hook);
  return (
    <>
      <td className="webhook-url">
        <code>{hook.url}</code> {!hook.enabled && <span className="badge">disabled</span>}
      </td>
      <td>{WEBHOOK_FORMATS.find((f) => f.value === hook.format)?.label ?? hook.format}</td>
      <td>{hook.has_secret ? "yes" : "no"}</td>
      <td>
        {outcome.ok !== null && (
          <span className={outcome.ok ? "badge ok" : "badge state-failed"}>{outcome.ok ? "ok" : "failed"}</span>
        )}{" "}
        {outcome.text}
        {hook.last_delivery_at && (
          <span className="hint">
            {" "}
            <Relative iso={hook.last_delivery_at} />
            {hook.last_delivery_event && ` (${hook.last_delivery_event})`}
          </span>
        )}
      </td>
    </>
  );
}

import { type FormEvent, useState } from "react";

import { ApiError, api, fetchAll } from "../api/client";
import type { ApiToken, CreatedApiToken } from "../api/types";
import { ErrorBanner, PageHeader, Relative, Section } from "../components/common";
import { ResourceTable } from "../components/ResourceTable";
import { WebhooksSection } from "../components/WebhooksSection";
import { formatTime } from "../lib/format";
import { useResource } from "../lib/useResource";

/** API tokens for the CLI and scripts: create (the secret is shown once), list, revoke; and the
 * webhooks the portal posts to about the user's jobs. */
export function TokensPage() {
  const tokens = useResource((signal) => fetchAll<ApiToken>("/api/v1/tokens/", signal), "tokens");
  const [name, setName] = useState("");
  const [days, setDays] = useState("90");
  const [created, setCreated] = useState<CreatedApiToken | null>(null);
  const [errors, setErrors] = useState<Record<string, string[]>>({});
  const [failure, setFailure] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const create = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setErrors({});
    setFailure(null);
    try {
      const token = await api<CreatedApiToken>("/api/v1/tokens/", {
        method: "POST",
        body: { name: name.trim(), expires_in_days: Number(days) },
      });
      setCreated(token);
      setName("");
      tokens.reload();
    } catch (err) {
      if (err instanceof ApiError && err.status === 400) setErrors(err.fields);
      setFailure(err instanceof Error ? err.message : String(err));
    } finally {
      setBusy(false);
    }
  };

  const revoke = async (token: ApiToken) => {
    setFailure(null);
    try {
      await api(`/api/v1/tokens/${token.id}/`, { method: "DELETE" });
      tokens.reload();
    } catch (err) {
      setFailure(err instanceof Error ? err.message : String(err));
    }
  };

  return (
    <>
      <PageHeader title="Tokens and webhooks" />
      <Section title="New token">
        <form className="token-form" onSubmit={create}>
          <div className={errors["name"] ? "field has-error" : "field"}>
            <label htmlFor="token-name">Name</label>
            <input id="token-name" value={name} required placeholder="laptop" onChange={(e) => setName(e.target.value)} />
            {errors["name"]?.map((m) => (
              <p key={m} className="field-error">
                {m}
              </p>
            ))}
          </div>
          <div className="field">
            <label htmlFor="token-days">Expires</label>
            <select id="token-days" value={days} onChange={(e) => setDays(e.target.value)}>
              <option value="7">in 7 days</option>
              <option value="30">in 30 days</option>
              <option value="90">in 90 days</option>
              <option value="365">in a year</option>
              <option value="0">never</option>
            </select>
          </div>
          <button type="submit" className="button primary" disabled={busy || !name.trim()}>
            {busy ? "Creating…" : "Create token"}
          </button>
        </form>
        {failure && <ErrorBanner error={failure} />}
        {created && (
          <div className="notice" role="status">
            <p>
              Token <strong>{created.name}</strong> created. Copy it now: it is shown only once.
            </p>
            <code className="secret" tabIndex={0}>
              {created.token}
            </code>
            <p className="hint">
              Use it as <code>Authorization: Bearer …</code> with the API or the CLI.
            </p>
          </div>
        )}
      </Section>
      <Section title="Your tokens">
        <ResourceTable
          items={tokens}
          caption="Your API tokens"
          columns={["Name", "Starts with", "Created", "Last used", "Expires"]}
          emptyText="No tokens yet."
          renderCells={(t) => (
            <>
              <td>{t.name}</td>
              <td>
                <code>{t.prefix}…</code>
              </td>
              <td>{formatTime(t.created_at)}</td>
              <td><Relative iso={t.last_used_at} empty="never" /></td>
              <td>{t.revoked_at ? "revoked" : t.expires_at ? formatTime(t.expires_at) : "never"}</td>
            </>
          )}
          renderActions={(t) =>
            t.is_active && (
              <button type="button" className="button small danger" onClick={() => revoke(t)} aria-label={`Revoke ${t.name}`}>
                Revoke
              </button>
            )
          }
        />
      </Section>
      <WebhooksSection />
    </>
  );
}

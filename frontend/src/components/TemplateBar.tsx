import { type FormEvent, useState } from "react";

import { ApiError, type FieldErrors, api, fetchAll } from "../api/client";
import type { JobTemplate } from "../api/types";
import { mayDeleteTemplate } from "../lib/access";
import type { SpecObject } from "../lib/spec";
import { sortTemplates, splitTemplateErrors, templateLabel } from "../lib/templates";
import { useResource } from "../lib/useResource";
import { useSession } from "../session";

interface Props {
  username: string;
  /** Viewers may load a shared template but not save one. */
  canSave: boolean;
  /** The spec as it stands; null while the YAML does not parse. */
  currentSpec: () => SpecObject | null;
  onLoad: (spec: SpecObject) => void;
  /** A refused save's errors of the spec, for the form's fields (null: clear them). */
  onSpecErrors: (errors: FieldErrors | null) => void;
}

/** The submit page's templates: a picker that loads a saved spec into the form, "Save as
 * template" for the spec as it stands (the portal checks it as it would a submission), and Delete
 * for the chosen one, when the user may delete it (after a confirmation). */
export function TemplateBar({ username, canSave, currentSpec, onLoad, onSpecErrors }: Props) {
  const templates = useResource<JobTemplate[]>((signal) => fetchAll<JobTemplate>("/api/v1/templates/", signal), "templates");
  const [chosen, setChosen] = useState("");
  const [saving, setSaving] = useState(false);
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [shared, setShared] = useState(false);
  const [errors, setErrors] = useState<FieldErrors>({});
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState<string | null>(null);
  const list = sortTemplates(templates.data ?? [], username);
  const { me } = useSession();
  const current = list.find((t) => String(t.id) === chosen);

  const choose = (id: string) => {
    setChosen(id);
    const template = list.find((t) => String(t.id) === id);
    if (template) {
      onLoad(template.spec as SpecObject);
      setSaved(null);
    }
  };

  const save = async (event: FormEvent) => {
    event.preventDefault();
    const spec = currentSpec();
    setSaved(null); // the last save's outcome, not this one's
    if (spec === null) {
      setErrors({ detail: ["Fix the YAML first: it does not parse."] });
      return;
    }
    setBusy(true);
    setErrors({});
    onSpecErrors(null);
    try {
      const template = await api<JobTemplate>("/api/v1/templates/", {
        method: "POST",
        body: { name: name.trim(), description: description.trim(), shared, spec },
      });
      setSaved(`Saved template ${template.name}${template.shared ? `, shared with tenant ${template.tenant}` : ""}.`);
      setSaving(false);
      setName("");
      setDescription("");
      setShared(false);
      templates.reload();
      setChosen(String(template.id));
    } catch (err) {
      if (err instanceof ApiError && err.status === 400) {
        const split = splitTemplateErrors(err.fields);
        setErrors(Object.keys(split.spec).length ? { ...split.own, detail: ["The spec has errors: see the form."] } : split.own);
        if (Object.keys(split.spec).length) onSpecErrors(split.spec);
      } else {
        setErrors({ detail: [err instanceof Error ? err.message : String(err)] });
      }
    } finally {
      setBusy(false);
    }
  };

  const own = (key: string) => errors[key] ?? [];
  const other = Object.entries(errors).filter(([key]) => !["name", "description"].includes(key));

  return (
    <section className="card template-bar" aria-label="Templates">
      <div className="template-row">
        <label htmlFor="f-template">Template</label>
        <select id="f-template" value={chosen} onChange={(e) => choose(e.target.value)} disabled={!list.length}>
          <option value="">{templates.loading && !templates.data ? "Loading…" : list.length ? "Choose a template…" : "No templates yet"}</option>
          {list.map((t) => (
            <option key={t.id} value={String(t.id)}>
              {templateLabel(t, username)}
            </option>
          ))}
        </select>
        {current && mayDeleteTemplate(current, me) && (
          <DeleteTemplate
            key={current.id}
            template={current}
            onDeleted={() => {
              setChosen("");
              setSaved(`Deleted template ${current.name}.`);
              templates.reload();
            }}
          />
        )}
        {canSave && (
          <button type="button" className="button small" aria-expanded={saving} aria-controls="save-template" onClick={() => setSaving(!saving)}>
            Save as template
          </button>
        )}
      </div>
      {saved && (
        <p className="hint" role="status">
          {saved}
        </p>
      )}
      {templates.error && <p className="field-error">Templates could not be loaded: {templates.error.message}</p>}
      {saving && (
        <form id="save-template" className="save-template" onSubmit={save} noValidate aria-label="Save as template">
          <div className={own("name").length ? "field has-error" : "field"}>
            <label htmlFor="f-template-name">Template name</label>
            <input
              id="f-template-name"
              value={name}
              onChange={(e) => {
                setName(e.target.value);
                setErrors(({ name: _name, ...rest }) => rest);
              }}
              required
              aria-invalid={own("name").length ? true : undefined}
              aria-describedby={own("name").length ? "f-template-name-error" : "f-template-name-hint"}
            />
            {own("name").length ? (
              <p className="field-error" id="f-template-name-error">
                {own("name").join(" ")}
              </p>
            ) : (
              <p className="hint" id="f-template-name-hint">
                Letters, digits, - and _; unique among your templates.
              </p>
            )}
          </div>
          <div className={own("description").length ? "field has-error" : "field"}>
            <label htmlFor="f-template-description">Description</label>
            <input
              id="f-template-description"
              value={description}
              maxLength={300}
              onChange={(e) => setDescription(e.target.value)}
              aria-invalid={own("description").length ? true : undefined}
            />
            {own("description").map((msg) => (
              <p key={msg} className="field-error">
                {msg}
              </p>
            ))}
          </div>
          <label className="checkbox">
            <input type="checkbox" checked={shared} onChange={(e) => setShared(e.target.checked)} />
            Share with everyone in the tenant
          </label>
          {other.length > 0 && (
            <ul className="error-list" role="alert">
              {other.map(([key, msgs]) => (
                <li key={key}>{key === "detail" ? msgs.join(" ") : `${key}: ${msgs.join(" ")}`}</li>
              ))}
            </ul>
          )}
          <div className="form-actions">
            <button type="submit" className="button primary small" disabled={busy}>
              {busy ? "Saving…" : "Save template"}
            </button>
            <button type="button" className="button small" onClick={() => setSaving(false)}>
              Cancel
            </button>
          </div>
        </form>
      )}
    </section>
  );
}

/** Delete for the chosen template, asked once more before it goes; a refusal in the portal's words. */
function DeleteTemplate({ template, onDeleted }: { template: JobTemplate; onDeleted: () => void }) {
  const [confirming, setConfirming] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const remove = async () => {
    setBusy(true);
    setError(null);
    try {
      await api(`/api/v1/templates/${template.id}/`, { method: "DELETE" });
      onDeleted();
    } catch (err) {
      setError(err instanceof Error ? err.message : String(err));
      setConfirming(false);
      setBusy(false);
    }
  };
  const whose = template.shared ? ", shared in the tenant," : "";
  return (
    <>
      {confirming ? (
        <span className="confirm" role="group" aria-label="Confirm delete">
          Delete template {template.name}
          {whose} for good?{" "}
          <button type="button" className="button small danger" onClick={remove} disabled={busy} autoFocus>
            {busy ? "Deleting…" : "Yes, delete"}
          </button>{" "}
          <button type="button" className="button small ghost" onClick={() => setConfirming(false)} disabled={busy}>
            Keep
          </button>
        </span>
      ) : (
        <button type="button" className="button small" onClick={() => setConfirming(true)}>
          Delete template
        </button>
      )}
      {error && (
        <p className="field-error" role="alert">
          {error}
        </p>
      )}
    </>
  );
}

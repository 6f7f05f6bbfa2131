import { type FormEvent, type ReactNode, useEffect, useRef, useState } from "react";

import { ApiError, type FieldErrors, type RequestOptions, api, fetchAll, query } from "../api/client";
import type { BulkSubmitResult, ClusterNode, DryRun, Flavor, JobDetail, PriorityClass, VirtualCluster, WhatIfHint } from "../api/types";
import { NotifyField } from "../components/NotifyField";
import { TemplateBar } from "../components/TemplateBar";
import { ErrorBanner, PageHeader, Spinner } from "../components/common";
import { MAX_COPIES, arrayBody, arrayErrors, arrayYaml, copiesHint, idRanges, isArray, parseCopies } from "../lib/array";
import { cloneSource, replacesWaitingJob } from "../lib/clone";
import { mayManage, priorityRefusal } from "../lib/access";
import { replicasThatFitNow } from "../lib/cluster";
import {
  AFTER_TYPES,
  NOTIFY_STATES,
  type SpecForm,
  type SpecObject,
  applyHint,
  checkForm,
  emptyForm,
  errorsFor,
  formToSpec,
  parseSpecYaml,
  specToForm,
  specToYaml,
  unplacedErrors,
  withoutEdited,
} from "../lib/spec";
import { useNow } from "../lib/clock";
import { useResource } from "../lib/useResource";
import { hintBadge, verdictText } from "../lib/verdict";
import { Link, navigate, useLocation } from "../router";
import { canSubmit, useSession } from "../session";

type Mode = "form" | "yaml";

interface Choices {
  vcs: VirtualCluster[];
  flavors: Flavor[];
  priorities: PriorityClass[];
  nodes: ClusterNode[];
}

export function SubmitPage() {
  const { search } = useLocation();
  const { me } = useSession();
  const cloneId = search.get("clone");
  const hintIndex = search.get("hint");
  const choices = useResource<Choices>(
    async (signal) => {
      const [vcs, flavors, priorities, nodes] = await Promise.all([
        fetchAll<VirtualCluster>("/api/v1/virtual-clusters/", signal),
        fetchAll<Flavor>("/api/v1/flavors/", signal),
        fetchAll<PriorityClass>("/api/v1/priority-classes/", signal),
        fetchAll<ClusterNode>("/api/v1/nodes/", signal),
      ]);
      return { vcs, flavors, priorities, nodes };
    },
    "choices",
  );
  const clone = useResource<JobDetail | null>(
    (signal) => (cloneId ? api<JobDetail>(`/api/v1/jobs/${cloneId}/`, { signal }) : Promise.resolve(null)),
    `clone-${cloneId ?? ""}`,
  );

  // Only the job the URL names: after `?clone=5`, Submit in the menu opens an empty form.
  const cloneOf = cloneSource(cloneId, clone.data, clone.error !== null && !clone.loading);
  if ((choices.loading && !choices.data) || cloneOf === "loading") {
    return <Spinner label="Loading flavors and virtual clusters" />;
  }
  if (!choices.data) return <ErrorBanner error={choices.error} onRetry={choices.reload} />;
  return (
    <>
        <PageHeader title={cloneOf ? `Resubmit ${cloneOf.name}` : "Submit a job"} />
        {cloneId && <ErrorBanner error={clone.error} />}
        {!canSubmit(me) && (
          <p className="notice" role="note" id="viewer-note">
            You are a viewer in your tenants: you can look at jobs but not submit or check them. A tenant admin can make you a
            member.
          </p>
        )}
        <SubmitForm
          key={`${cloneOf ? `clone-${cloneOf.id}` : "new"}-${hintIndex ?? ""}`}
          choices={choices.data}
          cloneOf={cloneOf}
          hint={hintIndex !== null ? (cloneOf?.whatif_hints?.[Number(hintIndex)] ?? null) : null}
        />
    </>
  );
}

/** `spec` changed as a what-if hint proposes, within the time limit of the hint's flavor. */
function withHint(spec: SpecObject, hint: WhatIfHint, flavors: Flavor[]): SpecObject {
  const flavor = flavors.find((f) => f.name === hint.flavor);
  return applyHint(spec, hint, flavor ? flavor.max_runtime_hours * 3600 : undefined);
}

function initialState(
  choices: Choices,
  cloneOf: JobDetail | null,
  hint: WhatIfHint | null,
  tenants: string[],
): { form: SpecForm; extra: SpecObject } {
  if (cloneOf?.spec && typeof cloneOf.spec === "object") {
    const spec = cloneOf.spec as SpecObject;
    return specToForm(hint ? withHint(spec, hint, choices.flavors) : spec);
  }
  const form = emptyForm();
  form.vc = choices.vcs.find((vc) => tenants.includes(vc.tenant))?.name ?? choices.vcs[0]?.name ?? "";
  form.flavor = choices.flavors[0]?.name ?? "";
  form.priority = choices.priorities.find((p) => p.is_default)?.name ?? "";
  return { form, extra: {} };
}

function SubmitForm({ choices, cloneOf, hint }: { choices: Choices; cloneOf: JobDetail | null; hint: WhatIfHint | null }) {
  const { me } = useSession();
  const tenants = me.memberships.filter((m) => m.role !== "viewer").map((m) => m.tenant);
  const [state, setState] = useState(() => initialState(choices, cloneOf, hint, tenants));
  const [mode, setMode] = useState<Mode>("form");
  const [yamlText, setYamlText] = useState(() => specToYaml(formToSpec(state.form, state.extra)));
  const [yamlError, setYamlError] = useState<string | null>(null);
  const [errors, setErrors] = useState<FieldErrors>({});
  const [failure, setFailure] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [copiesText, setCopiesText] = useState("1");
  const [submitted, setSubmitted] = useState<{ ids: number[]; name: string } | null>(null);
  const [queued, setQueued] = useState(false); // the array as it stands was just submitted
  // "Resubmit like this" from a pending job: the original stays queued unless this cancels it.
  const original = replacesWaitingJob(cloneOf, hint !== null) ? cloneOf : null;
  const [cancelOriginal, setCancelOriginal] = useState(false);
  const [originalLeft, setOriginalLeft] = useState<{ id: number; error: string } | null>(null);
  // The last check's verdict, for the spec as it was then: any change clears it, and a verdict
  // that arrives after a change (counted in `edits`) is not shown.
  const [verdict, setVerdict] = useState<DryRun | null>(null);
  const [checking, setChecking] = useState(false);
  const edits = useRef(0);
  // A refusal is scrolled to and focused, however far down the button was: counted, so that the
  // same message refused twice is shown again.
  const banner = useRef<HTMLDivElement>(null);
  const [refusals, setRefusals] = useState(0);
  useEffect(() => {
    if (refusals === 0 || !banner.current) return;
    banner.current.scrollIntoView({ block: "center" });
    banner.current.focus({ preventScroll: true });
  }, [refusals]);
  const { form, extra } = state;
  const viewer = !canSubmit(me);

  const edited = () => {
    edits.current += 1;
    setVerdict(null);
    setQueued(false); // a changed spec may be submitted again
    setFailure(null); // a refusal was for the spec as it was
  };

  const replace = (next: { form: SpecForm; extra: SpecObject }) => {
    setState(next);
    setYamlText(specToYaml(formToSpec(next.form, next.extra)));
    setYamlError(null);
    edited();
  };

  const update = (patch: Partial<SpecForm>) => {
    setErrors((old) => withoutEdited(old, patch));
    replace({ form: { ...form, ...patch }, extra });
  };

  const editYaml = (source: string) => {
    setYamlText(source);
    setErrors({}); // YAML mode lists them in the banner, which goes too
    edited();
    const parsed = parseSpecYaml(source);
    if (parsed.ok) {
      setState(specToForm(parsed.spec));
      setYamlError(null);
    } else {
      setYamlError(parsed.error);
    }
  };

  // The spec as the portal gets it, for a submission and for a check alike: the YAML as typed,
  // or the form's.
  const specRequest = (): RequestOptions =>
    mode === "yaml"
      ? { method: "POST", rawBody: yamlText, contentType: "application/yaml" }
      : { method: "POST", body: formToSpec(form, extra) };

  // An array request: the spec, as for one job, and how many copies to queue.
  const arrayRequest = (copies: number | string): RequestOptions =>
    mode === "yaml"
      ? { method: "POST", rawBody: arrayYaml(yamlText, copies), contentType: "application/yaml" }
      : { method: "POST", body: arrayBody(formToSpec(form, extra), copies) };

  const refused = (err: unknown, words: string) => {
    if (err instanceof ApiError && err.status === 400) {
      setErrors(err.fields);
      setFailure(`${words} See the messages below.`);
    } else {
      setFailure(err instanceof Error ? err.message : String(err));
    }
    setRefusals((n) => n + 1);
  };

  // What the form can tell without asking the portal (job ids that are not numbers): shown as a
  // refusal would be, and nothing is sent.
  const checkedLocally = (): boolean => {
    if (mode !== "form") return true;
    const local = checkForm(form);
    if (Object.keys(local).length === 0) return true;
    setErrors(local);
    setFailure("Some fields need a change before the portal can read the job. See the messages below.");
    setVerdict(null);
    setRefusals((n) => n + 1);
    return false;
  };

  // Once the new job is in, the original it replaces is cancelled when that was asked for: null
  // when done (or not asked), else the portal's words.
  const cancelTheOriginal = async (): Promise<string | null> => {
    if (!original || !cancelOriginal) return null;
    try {
      await api(`/api/v1/jobs/${original.id}/cancel/`, { method: "POST" });
      return null;
    } catch (err) {
      return err instanceof Error ? err.message : String(err);
    }
  };

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    if (!checkedLocally()) return;
    setBusy(true);
    setErrors({});
    setFailure(null);
    setSubmitted(null);
    setOriginalLeft(null);
    const copies = parseCopies(copiesText);
    if (!isArray(copies)) {
      let job: JobDetail;
      try {
        job = await api<JobDetail>("/api/v1/jobs/", specRequest());
      } catch (err) {
        refused(err, "The portal did not accept the job.");
        setBusy(false);
        return;
      }
      const left = await cancelTheOriginal();
      if (left === null) {
        navigate(`/jobs/${job.id}`);
        return;
      }
      // The page stays, to say the original could not be cancelled; Submit waits for an edit.
      setOriginalLeft({ id: job.id, error: left });
      setQueued(true);
      setBusy(false);
      return;
    }
    // The page stays, to say which jobs were made: an array has no one page to go to.
    try {
      const created = await api<BulkSubmitResult>("/api/v1/jobs/bulk/", arrayRequest(copies));
      setSubmitted({ ids: created.ids, name: form.name.trim() });
      setQueued(true);
      setVerdict(null); // it was for a queue without these jobs
      const left = await cancelTheOriginal();
      if (left !== null && created.ids[0] !== undefined) setOriginalLeft({ id: created.ids[0], error: left });
    } catch (err) {
      const named = err instanceof ApiError ? new ApiError(err.status, err.message, arrayErrors(err.fields)) : err;
      refused(named, "The portal did not accept the jobs.");
    } finally {
      setBusy(false);
    }
  };

  const check = async () => {
    if (!checkedLocally()) return;
    setChecking(true);
    setErrors({});
    setFailure(null);
    setVerdict(null);
    const asked = edits.current;
    try {
      const answer = await api<DryRun>("/api/v1/jobs/dry-run/", specRequest());
      if (edits.current === asked) setVerdict(answer);
    } catch (err) {
      refused(err, "The portal would not accept the job.");
    } finally {
      setChecking(false);
    }
  };

  const fieldErrors = (key: string) => errorsFor(errors, key);
  // The Copies field shows its own errors, in both modes.
  const copiesErrors = errors["array"] ?? [];
  const allErrors = Object.entries(errors).filter(([key]) => key !== "array");
  const others = unplacedErrors(errors).filter(([key]) => key !== "array");
  const copies = parseCopies(copiesText);

  // A refused "Save as template" shows its spec's errors where a refused submission's go.
  const templateSpecErrors = (fields: FieldErrors | null) => {
    setErrors(fields ?? {});
    setFailure(fields ? "The portal did not accept the spec for the template. See the messages below." : null);
    if (fields) setRefusals((n) => n + 1);
  };

  return (
    <>
    <TemplateBar
      username={me.username}
      canSave={canSubmit(me)}
      currentSpec={() => (mode === "yaml" && yamlError !== null ? null : formToSpec(form, extra))}
      onLoad={(spec) => {
        replace(specToForm(spec));
        setErrors({});
        setFailure(null);
      }}
      onSpecErrors={templateSpecErrors}
    />
    <form className="submit-form" onSubmit={submit} noValidate aria-describedby={failure ? "submit-failure" : undefined}>
      <div className="tabs" role="tablist" aria-label="Edit as">
        <ModeTab mode="form" current={mode} onSelect={setMode}>
          Form
        </ModeTab>
        <ModeTab mode="yaml" current={mode} onSelect={setMode}>
          YAML
        </ModeTab>
      </div>
      {failure && (
        <div className="error-banner" role="alert" id="submit-failure" tabIndex={-1} ref={banner}>
          <span>{failure}</span>
          {(mode === "yaml" ? allErrors : others).length > 0 && (
            <ul className="error-list">
              {(mode === "yaml" ? allErrors : others).map(([key, msgs]) => (
                <li key={key}>
                  <code>{key}</code>: {msgs.join(" ")}
                </li>
              ))}
            </ul>
          )}
        </div>
      )}
      {mode === "yaml" ? (
        <div className="card" role="tabpanel" aria-label="YAML">
          <label htmlFor="spec-yaml">Job spec (YAML)</label>
          <textarea
            id="spec-yaml"
            className="code"
            rows={22}
            spellCheck={false}
            value={yamlText}
            onChange={(e) => editYaml(e.target.value)}
            aria-invalid={yamlError ? true : undefined}
            aria-describedby="yaml-help"
          />
          <p id="yaml-help" className={yamlError ? "field-error" : "hint"}>
            {yamlError ?? "Changes here show in the form, and the other way round. See the job spec reference for every field."}
          </p>
        </div>
      ) : (
        <div role="tabpanel" aria-label="Form">
          <SpecFields form={form} update={update} choices={choices} errors={fieldErrors} tenants={tenants} />
        </div>
      )}
      <div className="card copies">
        <Field id="f-copies" label="Copies" errors={copiesErrors} hint={copiesHint(copies)}>
          <input
            id="f-copies"
            type="number"
            inputMode="numeric"
            min={1}
            max={MAX_COPIES}
            step={1}
            value={copiesText}
            onChange={(e) => {
              setCopiesText(e.target.value);
              setQueued(false);
              setFailure(null);
              setErrors(({ array: _copies, ...rest }) => rest);
            }}
            aria-invalid={copiesErrors.length ? true : undefined}
            aria-describedby={describedBy("f-copies", copiesErrors, true)}
          />
        </Field>
      </div>
      {original && (
        <OriginalNote original={original} mayCancel={mayManage(original, me)} cancel={cancelOriginal} onCancelChange={setCancelOriginal} left={originalLeft} />
      )}
      <div className="form-actions">
        {/* After an array is queued the same spec is not submitted again by a second click:
            the button waits for an edit. */}
        <button
          type="submit"
          className="button primary"
          disabled={viewer || busy || queued || (mode === "yaml" && yamlError !== null)}
          aria-describedby={viewer ? "viewer-note" : undefined}
        >
          {busy ? "Submitting…" : queued ? "Submitted" : typeof copies === "number" && copies > 1 ? `Submit ${copies} jobs` : "Submit job"}
        </button>
        <button
          type="button"
          className="button"
          onClick={check}
          disabled={viewer || busy || checking || (mode === "yaml" && yamlError !== null)}
          aria-describedby={viewer ? "viewer-note" : undefined}
        >
          {checking ? "Checking…" : "Check"}
        </button>
        {busy && <Spinner label="Submitting" />}
        {checking && <Spinner label="Checking" />}
        {viewer ? (
          <span className="muted">A viewer cannot submit: see the note at the top.</span>
        ) : (
          !busy && !checking && !verdict && <span className="muted">Check: whether it would start now, without submitting it.</span>
        )}
      </div>
      {submitted && <SubmittedCard {...submitted} />}
      {verdict && <VerdictCard verdict={verdict} onHint={(hint) => replace(specToForm(withHint(formToSpec(form, extra), hint, choices.flavors)))} />}
    </form>
    </>
  );
}

/** "Resubmit like this" from a pending job: the original still waits under the same name, and
 * may be cancelled once the new one is in; `left` says when that was refused. */
function OriginalNote({
  original,
  mayCancel,
  cancel,
  onCancelChange,
  left,
}: {
  original: JobDetail;
  mayCancel: boolean;
  cancel: boolean;
  onCancelChange: (on: boolean) => void;
  left: { id: number; error: string } | null;
}) {
  return (
    <section className="card original-note" aria-label="The original job">
      <p role="note">
        The original job <Link href={`/jobs/${original.id}`}>#{original.id}</Link> ({original.name}) is still waiting in the queue, and stays
        there unless it is cancelled.
      </p>
      {mayCancel && (
        <label className="checkbox">
          <input type="checkbox" checked={cancel} onChange={(e) => onCancelChange(e.target.checked)} /> Cancel job #{original.id} once this one is
          submitted
        </label>
      )}
      {left && (
        <p className="field-error" role="alert">
          Submitted as job <Link href={`/jobs/${left.id}`}>#{left.id}</Link>, but job #{original.id} could not be cancelled: {left.error}
        </p>
      )}
    </section>
  );
}

/** What an array submission made: the jobs' ids, and where to find them. */
function SubmittedCard({ ids, name }: { ids: number[]; name: string }) {
  const first = ids[0];
  return (
    <section className="card submitted" aria-label="Submitted">
      <p role="status">
        Submitted {ids.length} jobs: ids {idRanges(ids)}, named {name}-0 to {name}-{ids.length - 1}.
      </p>
      <p className="submitted-links">
        <Link href={`/jobs${query({ q: name, owner: "me" })}`}>Show them in the jobs list</Link>
        {first !== undefined && <Link href={`/jobs/${first}`}>Open {name}-0</Link>}
      </p>
    </section>
  );
}

/** The portal's dry run of the spec: where the job would start, or why it would wait, until
 * when, and what would start it sooner (each applicable to the form). */
function VerdictCard({ verdict, onHint }: { verdict: DryRun; onHint: (hint: WhatIfHint) => void }) {
  const now = useNow();
  const { headline, detail } = verdictText(verdict, now);
  return (
    <section className={verdict.would_start_now ? "card verdict starts" : "card verdict waits"} aria-labelledby="verdict-title">
      <h2 id="verdict-title">If you submit it now</h2>
      <div role="status">
        <p className="verdict-headline">{headline}</p>
        {detail && <p className="hint">{detail}</p>}
      </div>
      {verdict.reason && (
        <p className="hint">
          Reason <code>{verdict.reason}</code>; nothing was submitted.
        </p>
      )}
      {verdict.hints.length > 0 && (
        <>
          <h3 id="verdict-hints-title">What would start it sooner</h3>
          <ul className="whatif-hints" aria-labelledby="verdict-hints-title">
            {verdict.hints.map((hint, index) => (
              <li key={`${hint.kind}-${index}`}>
                <span className={hint.starts_now ? "badge ok" : "badge"}>{hintBadge(hint, now)}</span>{" "}
                <span className="whatif-message">{hint.message}</span>{" "}
                <button type="button" className="button small" onClick={() => onHint(hint)}>
                  Use this
                </button>
              </li>
            ))}
          </ul>
        </>
      )}
    </section>
  );
}

function ModeTab({ mode, current, onSelect, children }: { mode: Mode; current: Mode; onSelect: (m: Mode) => void; children: ReactNode }) {
  return (
    <button
      type="button"
      role="tab"
      id={`tab-${mode}`}
      aria-selected={mode === current}
      className={mode === current ? "tab active" : "tab"}
      onClick={() => onSelect(mode)}
      onKeyDown={(e) => {
        if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
          const other: Mode = mode === "form" ? "yaml" : "form";
          onSelect(other);
          document.getElementById(`tab-${other}`)?.focus();
        }
      }}
    >
      {children}
    </button>
  );
}

function Field({ id, label, errors, hint, children }: { id: string; label: string; errors: string[]; hint?: string; children: ReactNode }) {
  return (
    <div className={errors.length ? "field has-error" : "field"}>
      <label htmlFor={id}>{label}</label>
      {children}
      {hint && !errors.length && (
        <p className="hint" id={`${id}-hint`}>
          {hint}
        </p>
      )}
      {errors.map((msg) => (
        <p key={msg} className="field-error" id={`${id}-error`}>
          {msg}
        </p>
      ))}
    </div>
  );
}

function describedBy(id: string, errors: string[], hint?: boolean): string | undefined {
  if (errors.length) return `${id}-error`;
  return hint ? `${id}-hint` : undefined;
}

interface FieldsProps {
  form: SpecForm;
  update: (patch: Partial<SpecForm>) => void;
  choices: Choices;
  errors: (key: string) => string[];
  tenants: string[];
}

function SpecFields({ form, update, choices, errors, tenants }: FieldsProps) {
  const submittable = choices.vcs.filter((vc) => tenants.includes(vc.tenant));
  const vcOptions = submittable.length ? submittable : choices.vcs;
  return (
    <div className="form-grid">
      <fieldset className="card">
        <legend>Job</legend>
        <Field id="f-name" label="Name" errors={errors("name")} hint="Letters, digits, '.', '_' and '-'.">
          <input
            id="f-name"
            value={form.name}
            required
            onChange={(e) => update({ name: e.target.value })}
            aria-invalid={errors("name").length ? true : undefined}
            aria-describedby={describedBy("f-name", errors("name"), true)}
          />
        </Field>
        <Field id="f-vc" label="Virtual cluster" errors={errors("vc")}>
          <select id="f-vc" value={form.vc} onChange={(e) => update({ vc: e.target.value })} aria-describedby={describedBy("f-vc", errors("vc"))}>
            {!vcOptions.some((vc) => vc.name === form.vc) && <option value={form.vc}>{form.vc || "choose…"}</option>}
            {vcOptions.map((vc) => (
              <option key={vc.id} value={vc.name}>
                {vc.name} ({vc.tenant})
              </option>
            ))}
          </select>
        </Field>
        <Field id="f-image" label="Image" errors={errors("image")} hint="Container image; hosts without Docker ignore it.">
          <input
            id="f-image"
            value={form.image}
            placeholder="registry.example.org/ml/pytorch:24.10"
            onChange={(e) => update({ image: e.target.value })}
            aria-describedby={describedBy("f-image", errors("image"), true)}
          />
        </Field>
        <div className="field">
          <span className="label" id="f-command-mode-label">
            Command is
          </span>
          <div className="radio-row" role="radiogroup" aria-labelledby="f-command-mode-label">
            <label>
              <input type="radio" name="command-mode" checked={form.commandMode === "shell"} onChange={() => update({ commandMode: "shell" })} /> a shell
              line
            </label>
            <label>
              <input type="radio" name="command-mode" checked={form.commandMode === "args"} onChange={() => update({ commandMode: "args" })} /> a list
              of arguments, one per line
            </label>
          </div>
        </div>
        <Field id="f-command" label="Command" errors={errors("command")}>
          <textarea
            id="f-command"
            className="code"
            rows={3}
            value={form.command}
            spellCheck={false}
            placeholder="python train.py --epochs 90"
            onChange={(e) => update({ command: e.target.value })}
            aria-describedby={describedBy("f-command", errors("command"))}
          />
        </Field>
      </fieldset>

      <fieldset className="card">
        <legend>Resources</legend>
        <FlavorPicker form={form} update={update} choices={choices} errors={errors("flavor")} />
        <Field id="f-replicas" label="Replicas" errors={errors("replicas")} hint="All replicas start together or none does.">
          <input
            id="f-replicas"
            inputMode="numeric"
            value={form.replicas}
            onChange={(e) => update({ replicas: e.target.value })}
            aria-describedby={describedBy("f-replicas", errors("replicas"), true)}
          />
        </Field>
        {errors("resources").map((msg) => (
          <p key={msg} className="field-error">
            resources: {msg}
          </p>
        ))}
      </fieldset>

      <fieldset className="card">
        <legend>Scheduling</legend>
        <PriorityField form={form} update={update} choices={choices} errors={errors("priority")} />
        <Field id="f-time-limit" label="Time limit" errors={errors("time_limit")} hint="Seconds, or 90m, 36h, 1d12h. Empty: the flavor's limit.">
          <input
            id="f-time-limit"
            value={form.timeLimit}
            placeholder="36h"
            onChange={(e) => update({ timeLimit: e.target.value })}
            aria-describedby={describedBy("f-time-limit", errors("time_limit"), true)}
          />
        </Field>
        <div className="field-row">
          <Field id="f-after" label="Start after jobs" errors={errors("after")} hint="Ids of jobs to wait for, e.g. 41, 42.">
            <input
              id="f-after"
              value={form.after}
              placeholder="41, 42"
              onChange={(e) => update({ after: e.target.value })}
              aria-describedby={describedBy("f-after", errors("after"), true)}
            />
          </Field>
          <Field id="f-after-type" label="Once they have" errors={errors("after_type")}>
            <select
              id="f-after-type"
              value={form.afterType}
              onChange={(e) => update({ afterType: e.target.value })}
              aria-describedby={describedBy("f-after-type", errors("after_type"))}
            >
              {!AFTER_TYPES.some(([value]) => value === form.afterType) && <option value={form.afterType}>{form.afterType}</option>}
              {AFTER_TYPES.map(([value, meaning]) => (
                <option key={value} value={value}>
                  {meaning}
                </option>
              ))}
            </select>
          </Field>
        </div>
        <div className="field-row">
          <Field id="f-retries" label="Retries" errors={errors("retries")}>
            <input id="f-retries" inputMode="numeric" value={form.retryLimit} onChange={(e) => update({ retryLimit: e.target.value })} />
          </Field>
          <Field id="f-backoff" label="Backoff (s)" errors={[]}>
            <input
              id="f-backoff"
              inputMode="numeric"
              value={form.retryBackoff}
              disabled={form.retryLimit.trim() === "0" || form.retryLimit.trim() === ""}
              onChange={(e) => update({ retryBackoff: e.target.value })}
            />
          </Field>
        </div>
        <Field id="f-exit-codes" label="Exit codes that fail at once" errors={[]} hint="Comma-separated, e.g. 2, 3.">
          <input
            id="f-exit-codes"
            value={form.permanentExitCodes}
            disabled={form.retryLimit.trim() === "0" || form.retryLimit.trim() === ""}
            onChange={(e) => update({ permanentExitCodes: e.target.value })}
          />
        </Field>
        <div className={errors("checkpoint").length ? "field has-error" : "field"}>
          <label className="checkbox">
            <input type="checkbox" checked={form.checkpointEnabled} onChange={(e) => update({ checkpointEnabled: e.target.checked })} /> Checkpointing
            (the job saves when signalled, and may be preempted or migrated)
          </label>
          {errors("checkpoint").map((msg) => (
            <p key={msg} className="field-error">
              {msg}
            </p>
          ))}
        </div>
        {form.checkpointEnabled && (
          <div className="field-row">
            <Field id="f-signal" label="Signal" errors={[]}>
              <select id="f-signal" value={form.checkpointSignal} onChange={(e) => update({ checkpointSignal: e.target.value })}>
                {["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT"].map((s) => (
                  <option key={s}>{s}</option>
                ))}
              </select>
            </Field>
            <Field id="f-grace" label="Grace (s)" errors={[]}>
              <input id="f-grace" inputMode="numeric" value={form.checkpointGrace} onChange={(e) => update({ checkpointGrace: e.target.value })} />
            </Field>
          </div>
        )}
        <div className={errors("time_sliceable").length ? "field has-error" : "field"}>
          <label className="checkbox">
            <input type="checkbox" checked={form.timeSliceable} onChange={(e) => update({ timeSliceable: e.target.checked })} /> Time-sliceable
            (may take turns on its GPUs with other jobs of its VC: paused and resumed, never restarted)
          </label>
          {errors("time_sliceable").map((msg) => (
            <p key={msg} className="field-error">
              {msg}
            </p>
          ))}
        </div>
        <NotifyField states={NOTIFY_STATES} chosen={form.notify} onChange={(notify) => update({ notify })} errors={errors("notify")} />
      </fieldset>

      <fieldset className="card">
        <legend>Environment and mounts</legend>
        <EnvEditor form={form} update={update} errors={errors("env")} />
        <MountEditor form={form} update={update} errors={errors("mounts")} />
      </fieldset>
    </div>
  );
}

/** The priority classes, those the user may not use for the chosen VC disabled with the reason. A
 * spec without a priority gets the default class, which the select shows as chosen. */
function PriorityField({ form, update, choices, errors }: { form: SpecForm; update: (p: Partial<SpecForm>) => void; choices: Choices; errors: string[] }) {
  const { me } = useSession();
  const tenant = choices.vcs.find((vc) => vc.name === form.vc)?.tenant;
  const fallback = choices.priorities.find((p) => p.is_default)?.name ?? "";
  const value = form.priority || fallback;
  const known = choices.priorities.some((p) => p.name === value);
  const chosen = choices.priorities.find((p) => p.name === value);
  const refusal = chosen ? priorityRefusal(chosen, me, tenant) : null;
  return (
    <Field id="f-priority" label="Priority" errors={errors} hint={refusal ? `${value}: ${refusal}; the portal would refuse the job.` : undefined}>
      <select
        id="f-priority"
        value={value}
        onChange={(e) => update({ priority: e.target.value })}
        aria-describedby={describedBy("f-priority", errors, refusal !== null)}
      >
        {!known && <option value={value}>{value || "the portal's default"}</option>}
        {choices.priorities.map((p) => {
          const why = priorityRefusal(p, me, tenant);
          return (
            // The chosen class stays selectable, so that the select shows what the spec says.
            <option key={p.id} value={p.name} disabled={why !== null && p.name !== value}>
              {p.name} ({p.value}
              {p.preemptible ? ", preemptible" : ""}
              {p.is_default ? ", the default" : ""}){why ? `: ${why}` : ""}
            </option>
          );
        })}
      </select>
    </Field>
  );
}

function FlavorPicker({ form, update, choices, errors }: { form: SpecForm; update: (p: Partial<SpecForm>) => void; choices: Choices; errors: string[] }) {
  return (
    <fieldset className={errors.length ? "flavor-picker has-error" : "flavor-picker"}>
      <legend>Flavor (per replica)</legend>
      <div className="flavor-list">
        {choices.flavors.map((flavor) => {
          const fits = replicasThatFitNow(flavor, choices.nodes);
          return (
            <label key={flavor.id} className={form.flavor === flavor.name ? "flavor selected" : "flavor"}>
              <input type="radio" name="flavor" value={flavor.name} checked={form.flavor === flavor.name} onChange={() => update({ flavor: flavor.name })} />
              <span className="flavor-name">{flavor.name}</span>
              <span className="flavor-shape">
                {flavor.gpus} × {flavor.gpu_model} · {flavor.cpu} CPU · {flavor.memory_gb} GB · ≤ {flavor.max_runtime_hours} h
              </span>
              <span className={fits > 0 ? "fits yes" : "fits no"}>{fits > 0 ? `${fits} fit now` : "none free now"}</span>
            </label>
          );
        })}
      </div>
      {errors.map((msg) => (
        <p key={msg} className="field-error">
          {msg}
        </p>
      ))}
    </fieldset>
  );
}

function EnvEditor({ form, update, errors }: { form: SpecForm; update: (p: Partial<SpecForm>) => void; errors: string[] }) {
  const set = (i: number, patch: Partial<{ key: string; value: string }>) =>
    update({ env: form.env.map((row, j) => (i === j ? { ...row, ...patch } : row)) });
  return (
    <div className={errors.length ? "field has-error" : "field"}>
      <span className="label">Environment variables</span>
      {form.env.map((row, i) => (
        <div className="row-editor" key={i}>
          <input aria-label={`Variable ${i + 1} name`} placeholder="NAME" value={row.key} onChange={(e) => set(i, { key: e.target.value })} />
          <input aria-label={`Variable ${i + 1} value`} placeholder="value" value={row.value} onChange={(e) => set(i, { value: e.target.value })} />
          <button type="button" className="button small ghost" aria-label={`Remove variable ${i + 1}`} onClick={() => update({ env: form.env.filter((_, j) => j !== i) })}>
            Remove
          </button>
        </div>
      ))}
      <button type="button" className="button small" onClick={() => update({ env: [...form.env, { key: "", value: "" }] })}>
        Add variable
      </button>
      {errors.map((msg) => (
        <p key={msg} className="field-error">
          {msg}
        </p>
      ))}
    </div>
  );
}

function MountEditor({ form, update, errors }: { form: SpecForm; update: (p: Partial<SpecForm>) => void; errors: string[] }) {
  const set = (i: number, patch: Partial<SpecForm["mounts"][number]>) =>
    update({ mounts: form.mounts.map((row, j) => (i === j ? { ...row, ...patch } : row)) });
  return (
    <div className={errors.length ? "field has-error" : "field"}>
      <span className="label">Mounts</span>
      {form.mounts.map((row, i) => (
        <div className="row-editor" key={i}>
          <input aria-label={`Mount ${i + 1} volume`} placeholder="volume" value={row.name} onChange={(e) => set(i, { name: e.target.value })} />
          <input aria-label={`Mount ${i + 1} path`} placeholder="/data" value={row.path} onChange={(e) => set(i, { path: e.target.value })} />
          <label className="checkbox">
            <input type="checkbox" checked={row.read_only} onChange={(e) => set(i, { read_only: e.target.checked })} /> read-only
          </label>
          <button type="button" className="button small ghost" aria-label={`Remove mount ${i + 1}`} onClick={() => update({ mounts: form.mounts.filter((_, j) => j !== i) })}>
            Remove
          </button>
        </div>
      ))}
      <button type="button" className="button small" onClick={() => update({ mounts: [...form.mounts, { name: "", path: "", read_only: true }] })}>
        Add mount
      </button>
      {errors.map((msg) => (
        <p key={msg} className="field-error">
          {msg}
        </p>
      ))}
    </div>
  );
}


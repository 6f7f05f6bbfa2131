import { type FormEvent, type ReactNode, useCallback, useEffect, useState } from "react";

import { ApiError, api, fetchAll, query } from "../api/client";
import { type LiveMessage, useLive } from "../api/live";
import { type JobDetail, type JobEvent, type Page, type TelemetrySample, isEnded } from "../api/types";
import { AttemptsTable } from "../components/AttemptsTable";
import { ErrorBanner, PageHeader, Section, Spinner, StateBadge } from "../components/common";
import { EventTimeline } from "../components/EventTimeline";
import { LogView, useLogLines } from "../components/LogView";
import { ReplicaStatusList } from "../components/ReplicaStatusList";
import { ShellPanel } from "../components/ShellPanel";
import { type Sample, TelemetryCharts, toSample } from "../components/TelemetryCharts";
import { mayManage, mayOpenShell } from "../lib/access";
import { useNow } from "../lib/clock";
import { elapsedSeconds, formatDuration, formatRelative, formatTime } from "../lib/format";
import { JOB_POLL_MS, pollsJob } from "../lib/jobpoll";
import { holdAction } from "../lib/hold";
import { showReplicas } from "../lib/replicas";
import { fetchTail } from "../lib/tail";
import { afterText } from "../lib/spec";
import { useResource } from "../lib/useResource";
import { useEvery, useSoon } from "../lib/useSoon";
import { Link } from "../router";
import { canSubmit, useSession } from "../session";

const MAX_SAMPLES = 2000;

export function JobDetailPage({ id }: { id: number }) {
  const job = useResource((signal) => api<JobDetail>(`/api/v1/jobs/${id}/`, { signal }), `job-${id}`);
  const events = useResource((signal) => fetchAll<JobEvent>(`/api/v1/jobs/${id}/events/`, signal), `events-${id}`);
  const [resyncToken, setResyncToken] = useState(0);
  const [chosenAttempt, setChosenAttempt] = useState<number | null>(null);
  const [shellOpen, setShellOpen] = useState(false);
  const { me } = useSession();
  const attempts = (job.data?.attempts ?? []).map((a) => a.number);
  const latest = attempts.length ? Math.max(...attempts) : null;
  const attempt = chosenAttempt ?? latest;
  const logs = useLogLines(id, attempt, resyncToken);
  const telemetry = useTelemetry(id, attempt, resyncToken);

  const refresh = useSoon(() => {
    job.reload();
    events.reload();
  }, 300);
  const resync = useCallback(() => {
    job.reload();
    events.reload();
    setResyncToken((t) => t + 1);
  }, [job, events]);

  const onMessage = (m: LiveMessage) => {
    if (m.job !== id) return;
    if (m.kind === "job") refresh();
    else if (m.kind === "log") {
      if (latest === null || m.attempt > latest) refresh();
      logs.addLive(m.attempt, m.lines);
    } else if (m.kind === "telemetry" && attempt === latest) telemetry.addLive(m.samples.map(toSample));
  };
  useLive(`job:${id}`, onMessage, resync, 5000);
  // Figures the socket does not carry: a pending job's reason and estimates, and the GPU-hours and
  // energy of one that holds GPUs, which grow while it runs.
  useEvery(JOB_POLL_MS, job.reload, job.data !== undefined && pollsJob(job.data));

  if (job.loading && !job.data) return <Spinner label="Loading the job" />;
  if (!job.data) {
    const notFound = job.error instanceof ApiError && job.error.status === 404;
    return (
      <div className="card">
        <h1>{notFound ? "Job not found" : "The job could not be loaded"}</h1>
        <ErrorBanner error={notFound ? `There is no job #${id} that you may see.` : job.error} onRetry={notFound ? undefined : job.reload} />
        <p>
          <Link href="/jobs">Back to the job list</Link>
        </p>
      </div>
    );
  }
  const j = job.data;
  const allocations = j.attempts.find((a) => a.number === attempt)?.allocations ?? [];
  // What the agents say of the current attempt's replicas: while it starts (an image pull can take
  // minutes, its progress comes live) and whenever one has a message.
  const current = j.attempts.find((a) => a.number === latest);
  // Only the job's owner (a member or admin of its tenant) may open a shell, and only in a running
  // job. Once open, the panel stays (with how the shell ended) when the job stops, until it is closed.
  const shellOffered = mayOpenShell(j, me);
  // Cancel, hold, move and the time limit: for those the portal lets manage the job.
  const manages = mayManage(j, me);

  return (
    <>
      <PageHeader
        docTitle={`${j.name} #${j.id}`}
        title={
          <>
            {j.name} <span className="muted">#{j.id}</span> <StateBadge state={j.state} />
          </>
        }
      >
        {canSubmit(me) && (
          <Link href={`/submit?clone=${j.id}`} className="button">
            Clone and resubmit
          </Link>
        )}
        {(shellOffered || shellOpen) && (
          <button
            type="button"
            className="button"
            aria-expanded={shellOpen}
            aria-controls="shell-section"
            onClick={() => setShellOpen((open) => !open)}
          >
            {shellOpen ? "Close shell" : "Shell"}
          </button>
        )}
        {manages && j.state !== "pending" && !j.on_hold && <HoldButton job={j} onDone={job.reload} />}
        {manages && !isEnded(j.state) && <CancelButton jobId={j.id} onDone={job.reload} />}
      </PageHeader>
      <ErrorBanner error={job.error} onRetry={job.reload} />
      {j.state === "pending" && <PendingCard job={j} manages={manages} onChanged={job.reload} />}
      {j.state !== "pending" && j.on_hold && !isEnded(j.state) && <PausingCard job={j} manages={manages} onChanged={job.reload} />}
      {current && showReplicas(current) && (
        <Section title="Replicas">
          <ReplicaStatusList replicas={current.replicas_status} />
        </Section>
      )}
      {shellOpen && (
        <div id="shell-section">
          <Section
            title="Shell"
            actions={
              <button type="button" className="button ghost small" onClick={() => setShellOpen(false)}>
                Close
              </button>
            }
          >
            <ShellPanel jobId={j.id} replicas={Math.max(1, j.replicas ?? 1)} />
          </Section>
        </div>
      )}
      <div className="grid-2">
        <Section title="Summary">
          <JobSummary job={j} manages={manages} onChanged={job.reload} />
        </Section>
        <Section title="Timeline">
          <ErrorBanner error={events.error} onRetry={events.reload} />
          {events.data ? <EventTimeline events={events.data} /> : <Spinner />}
        </Section>
      </div>
      <Section title="Attempts">{j.attempts.length ? <AttemptsTable attempts={j.attempts} /> : <p className="empty">No attempt yet.</p>}</Section>
      <Section title="Output">
        <LogView
          jobId={id}
          attempts={attempts}
          attempt={attempt}
          setAttempt={setChosenAttempt}
          lines={logs.lines}
          loading={logs.loading}
          error={logs.error}
          ended={isEnded(j.state)}
        />
      </Section>
      <Section title="GPU telemetry">
        <ErrorBanner error={telemetry.error} />
        <TelemetryCharts samples={telemetry.samples} allocations={allocations} attempt={attempt} ended={isEnded(j.state)} />
      </Section>
      <CheckpointSection job={j} />
    </>
  );
}

function useTelemetry(jobId: number, attempt: number | null, resyncToken: number) {
  const [samples, setSamples] = useState<Sample[]>([]);
  const [error, setError] = useState<Error | null>(null);
  useEffect(() => {
    setSamples([]);
  }, [jobId, attempt]);
  useEffect(() => {
    if (attempt === null) return;
    let stop = false;
    fetchTail(
      (offset, limit) => api<Page<TelemetrySample>>(`/api/v1/jobs/${jobId}/telemetry/${query({ attempt, offset, limit })}`),
      MAX_SAMPLES,
      1000,
    )
      .then((rows) => {
        if (stop) return;
        setError(null);
        setSamples((old) => merge(old, rows.map(toSample)));
      })
      .catch((err: unknown) => !stop && setError(err instanceof Error ? err : new Error(String(err))));
    return () => {
      stop = true;
    };
  }, [jobId, attempt, resyncToken]);
  const addLive = useCallback((incoming: Sample[]) => setSamples((old) => merge(old, incoming)), []);
  return { samples, error, addLive };
}

function merge(old: Sample[], incoming: Sample[]): Sample[] {
  const seen = new Set(old.map((s) => `${s.gpu_uuid}@${s.time}`));
  const next = old.concat(incoming.filter((s) => !seen.has(`${s.gpu_uuid}@${s.time}`)));
  next.sort((a, b) => Date.parse(a.time) - Date.parse(b.time));
  return next.length > MAX_SAMPLES ? next.slice(next.length - MAX_SAMPLES) : next;
}

/** POSTs a job action (`cancel`, `hold`, `release`, `top`, `time-limit` with its body), then
 * `onDone`; its error, if any, shown by <ActionError>. */
function useJobAction(jobId: number, onDone: () => void) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const run = async (action: string, body?: unknown): Promise<boolean> => {
    setBusy(true);
    setError(null);
    try {
      await api(`/api/v1/jobs/${jobId}/${action}/`, { method: "POST", body });
      onDone();
      return true;
    } catch (err) {
      setError(err instanceof Error ? err.message : String(err));
      return false;
    } finally {
      setBusy(false);
    }
  };
  return { busy, error, run };
}

function ActionError({ error, block = false }: { error: string | null; block?: boolean }) {
  if (!error) return null;
  return block ? (
    <p className="field-error" role="alert" id="time-limit-error">
      {error}
    </p>
  ) : (
    <span className="field-error" role="alert">
      {" "}
      {error}
    </span>
  );
}

function CancelButton({ jobId, onDone }: { jobId: number; onDone: () => void }) {
  const [confirming, setConfirming] = useState(false);
  const { busy, error, run } = useJobAction(jobId, onDone);
  const cancel = async () => {
    await run("cancel");
    setConfirming(false);
  };
  return (
    <>
      {confirming ? (
        <span className="confirm" role="group" aria-label="Confirm cancel">
          Cancel this job?{" "}
          <button type="button" className="button danger" onClick={cancel} disabled={busy} autoFocus>
            {busy ? "Cancelling…" : "Yes, cancel"}
          </button>{" "}
          <button type="button" className="button ghost" onClick={() => setConfirming(false)} disabled={busy}>
            Keep
          </button>
        </span>
      ) : (
        <button type="button" className="button danger" onClick={() => setConfirming(true)}>
          Cancel job
        </button>
      )}
      <ActionError error={error} />
    </>
  );
}

/** Hold or Release a pending job, Pause or Resume one with checkpointing (`src/lib/hold.ts`);
 * with `withNote`, what it does beside the button. */
function HoldButton({ job, onDone, withNote = false }: { job: JobDetail; onDone: () => void; withNote?: boolean }) {
  const { busy, error, run } = useJobAction(job.id, onDone);
  const hold = holdAction(job);
  if (!hold) return null;
  return (
    <>
      <button type="button" className="button" title={hold.note} onClick={() => run(hold.action)} disabled={busy}>
        {hold.label}
      </button>
      {withNote && (
        <>
          {" "}
          <span className="muted">{hold.note}</span>
        </>
      )}
      <ActionError error={error} />
    </>
  );
}

/** A paused job until it has stopped: what it waits for, and Resume, which lets it be queued
 * again once it has stopped. */
function PausingCard({ job, manages, onChanged }: { job: JobDetail; manages: boolean; onChanged: () => void }) {
  return (
    <section className="card pending-card" aria-labelledby="pausing-title">
      <h2 id="pausing-title">{job.paused ? "Pausing" : "Held once it stops"}</h2>
      <p className="pending-message">{job.pending_message}</p>
      {manages && (
        <p className="hint">
          <HoldButton job={job} onDone={onChanged} withNote />
        </p>
      )}
    </section>
  );
}

function MoveToFrontButton({ job, onDone }: { job: JobDetail; onDone: () => void }) {
  const [done, setDone] = useState(false);
  const { busy, error, run } = useJobAction(job.id, onDone);
  return (
    <p className="hint">
      <button type="button" className="button" onClick={async () => setDone(await run("top"))} disabled={busy}>
        {busy ? "Moving…" : `Move before ${job.owner}'s other jobs`}
      </button>{" "}
      {done ? (
        <span role="status">Moved: it goes before {job.owner}'s other pending jobs in {job.vc} from the next scheduling cycle.</span>
      ) : (
        <span className="muted">Only {job.owner}'s own pending jobs of its class let it pass; no one else's job waits longer.</span>
      )}
      <ActionError error={error} />
    </p>
  );
}

function PendingCard({ job, manages, onChanged }: { job: JobDetail; manages: boolean; onChanged: () => void }) {
  const now = useNow();
  const submits = canSubmit(useSession().me);
  return (
    <section className="card pending-card" aria-labelledby="pending-title">
      <h2 id="pending-title">Why it is waiting</h2>
      <p className="pending-message">{job.pending_message || "Waiting for the next scheduling cycle."}</p>
      <dl className="facts">
        <div>
          <dt>Reason</dt>
          <dd>
            <code>{job.pending_reason || "–"}</code>
          </dd>
        </div>
        <div>
          <dt>Queue position</dt>
          <dd>{job.queue_position ?? "–"}</dd>
        </div>
        <div>
          <dt>Estimated start</dt>
          <dd title={job.estimated_start_at ?? undefined}>
            {job.estimated_start_at ? `${formatRelative(job.estimated_start_at, now)} (${formatTime(job.estimated_start_at, now)})` : "unknown"}
          </dd>
        </div>
      </dl>
      {job.whatif_hints && job.whatif_hints.length > 0 && (
        <>
          <h3 id="whatif-title">What would start it sooner</h3>
          <ul className="whatif-hints" aria-labelledby="whatif-title">
            {job.whatif_hints.map((hint, index) => (
              <li key={`${hint.kind}-${index}`}>
                <span className={hint.starts_now ? "badge ok" : "badge"}>
                  {hint.starts_now
                    ? "starts now"
                    : hint.estimated_start_at
                      ? `starts ${formatRelative(hint.estimated_start_at, now)}`
                      : "sooner"}
                </span>{" "}
                <span className="whatif-message">{hint.message}</span>{" "}
                {submits && <Link href={`/submit?clone=${job.id}&hint=${index}`}>Resubmit like this</Link>}
              </li>
            ))}
          </ul>
        </>
      )}
      <p className="hint">
        See the <Link href={`/vcs/${encodeURIComponent(job.vc)}`}>queue of {job.vc}</Link>.
      </p>
      {manages && (
        <>
          <MoveToFrontButton job={job} onDone={onChanged} />
          <p className="hint">
            <HoldButton job={job} onDone={onChanged} withNote />
          </p>
        </>
      )}
    </section>
  );
}

/** The time limit, and (until the job ends, for those who manage the job) a form to change it: its
 * owner may lower it, an admin of its tenant raise it too; the portal says who may and how far. */
function TimeLimit({ job, manages, onDone }: { job: JobDetail; manages: boolean; onDone: () => void }) {
  const [editing, setEditing] = useState(false);
  const [value, setValue] = useState("");
  const { busy, error, run } = useJobAction(job.id, onDone);
  const save = async (event: FormEvent) => {
    event.preventDefault();
    const text = value.trim();
    if (await run("time-limit", { time_limit: /^\d+$/.test(text) ? Number(text) : text })) setEditing(false);
  };
  if (!editing) {
    return (
      <>
        {formatDuration(job.time_limit_s)}{" "}
        {manages && !isEnded(job.state) && (
          <button type="button" className="button ghost small" onClick={() => setEditing(true)}>
            Change
          </button>
        )}
      </>
    );
  }
  return (
    <form className="time-limit-form" onSubmit={save}>
      <div className="time-limit-row">
        <label className="visually-hidden" htmlFor="time-limit">
          New time limit
        </label>
        <input
          id="time-limit"
          value={value}
          onChange={(e) => setValue(e.target.value)}
          placeholder="36h"
          size={6}
          autoFocus
          aria-invalid={error ? true : undefined}
          aria-describedby={error ? "time-limit-error" : undefined}
        />
        <button type="submit" className="button small" disabled={busy || !value.trim()}>
          Save
        </button>
        <button type="button" className="button ghost small" onClick={() => setEditing(false)} disabled={busy}>
          Keep
        </button>
      </div>
      <ActionError error={error} block />
    </form>
  );
}

function JobSummary({ job, manages, onChanged }: { job: JobDetail; manages: boolean; onChanged: () => void }) {
  const now = useNow();
  const ran = job.started_at ? formatDuration(elapsedSeconds(job.started_at, job.finished_at, now)) : "–";
  const facts: [string, ReactNode][] = [
    ["Virtual cluster", <Link href={`/vcs/${encodeURIComponent(job.vc)}`}>{job.vc}</Link>],
    ["Owner", job.owner],
    ["Priority", `${job.priority_class} (${job.priority})${job.preemptible ? ", preemptible" : ""}`],
    ["GPUs", `${job.replicas ?? 1} × ${job.gpus_per_replica} ${job.gpu_model} = ${job.total_gpus}`],
    ["Per replica", `${job.cpu_per_replica} CPU, ${job.memory_gb_per_replica} GB`],
    ["Time limit", <TimeLimit job={job} manages={manages} onDone={onChanged} />],
    ["Submitted", formatTime(job.submitted_at)],
    ["Started", formatTime(job.started_at)],
    ["Finished", formatTime(job.finished_at)],
    ["Run time", ran],
    ["Retries left", String(job.retries_left ?? 0)],
    ["GPU-hours", job.usage ? `${job.usage.allocated_gpu_hours.toFixed(2)} held, ${job.usage.used_gpu_hours.toFixed(2)} used` : "–"],
    ["Energy", job.usage ? `${job.usage.energy_kwh.toFixed(2)} kWh` : "–"],
    ["Exit", job.exit_code === null || job.exit_code === undefined ? "–" : `${job.exit_code}${job.end_reason ? ` (${job.end_reason})` : ""}`],
  ];
  const notify = (job.spec as { notify?: unknown } | undefined)?.notify;
  if (Array.isArray(notify) && notify.length > 0) facts.push(["Notifies its owner when", notify.join(", ")]);
  if (job.after && job.after.length > 0) {
    facts.push([
      "Starts once",
      <>
        {job.after.map((id, index) => (
          <span key={id}>
            {index > 0 && ", "}
            <Link href={`/jobs/${id}`}>#{id}</Link>
          </span>
        ))}{" "}
        {afterText(job.after_type, job.after.length)}
      </>,
    ]);
  }
  return (
    <dl className="facts">
      {facts.map(([k, v]) => (
        <div key={k}>
          <dt>{k}</dt>
          <dd>{v}</dd>
        </div>
      ))}
    </dl>
  );
}

function CheckpointSection({ job }: { job: JobDetail }) {
  const spec = (job.spec ?? {}) as { checkpoint?: { enabled?: boolean; signal?: string; grace_seconds?: number } };
  if (!spec.checkpoint?.enabled) return null;
  const resumed = job.attempts.filter((a) => a.resume).map((a) => a.number);
  return (
    <Section title="Checkpoints">
      <p>
        Checkpointing is on: the job gets <code>{spec.checkpoint.signal ?? "SIGUSR1"}</code> when it must save and has{" "}
        {spec.checkpoint.grace_seconds ?? 120} s to write its checkpoint to <code>$GPUPORTAL_CHECKPOINT_DIR</code>.
      </p>
      <p>
        {resumed.length
          ? `Resumed from a checkpoint in attempt ${resumed.join(", ")}.`
          : "No attempt has resumed from a checkpoint yet."}
      </p>
    </Section>
  );
}

"""``gpuportal``: submit and watch GPU jobs from a terminal.

Output for people (tables, state changes) goes through rich; job output (``logs``,
``submit --follow``) goes to stdout unchanged, so it can be piped. Every expected failure
ends with a one-line message on stderr and an exit status from :data:`EXIT_CODES`, never a
stack trace.
"""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.measure import Measurement
from rich.spinner import Spinner
from rich.table import Table

from gpuportal import __version__, config
from gpuportal.client import (
    MAX_ARRAY_JOBS,
    AuthError,
    BadRequest,
    NotFound,
    PortalClient,
    PortalError,
    Unreachable,
    parse_yaml_spec,
)
from gpuportal.models import (
    Attempt,
    DryRun,
    Flavor,
    Job,
    JobDetail,
    JobEvent,
    JobTemplate,
    LogLine,
    Me,
    PriorityClass,
    Quota,
    TenantMember,
    VirtualCluster,
    Webhook,
)
from gpuportal.shell import run_shell

OK = 0
JOB_FAILED = 1
USAGE = 2
NOT_FOUND = 3
AUTH = 4
UNREACHABLE = 5
CONFLICT = 6
INTERRUPTED = 130

EXIT_CODES = {
    OK: "success (submit --follow and logs -f: the job succeeded; submit --dry-run: the spec is accepted)",
    JOB_FAILED: (
        "the job failed, was cancelled or timed out (submit --follow, logs -f); shell: refused or cut off;"
        " webhooks test: the delivery failed"
    ),
    USAGE: (
        "bad usage or input: unknown option, unreadable file,"
        " a spec field or change of members the portal refused"
    ),
    NOT_FOUND: (
        "no such job, virtual cluster, webhook, template, tenant or member (another tenant's looks the same)"
    ),
    AUTH: "not signed in, the token is invalid or expired, or not allowed",
    UNREACHABLE: (
        "the portal cannot be reached or failed (HTTP 5xx), or the URL answers but not as the portal's API"
        " (a redirect, a web page)"
    ),
    CONFLICT: "the request does not fit the job's state (e.g. cancelling an ended job)",
    INTERRUPTED: "interrupted (Ctrl-C); the job keeps running",
}

STATE_STYLES = {
    "pending": "yellow",
    "scheduled": "cyan",
    "starting": "cyan",
    "running": "green",
    "suspended": "magenta",
    "checkpointing": "magenta",
    "preempted": "magenta",
    "lost": "red",
    "succeeded": "bold green",
    "failed": "bold red",
    "cancelled": "dim",
    "timed-out": "red",
}
# The states a job may be in, as the portal names them: every one has a style above, so this is
# the one list of them (what `list --state` takes).
JOB_STATES = tuple(STATE_STYLES)

# An admin's stop of a virtual cluster (its stop_policy): the STATE column of `vcs`, and what it
# means, shown by `vcs NAME`.
VC_STATES = {"": "open", "hold": "held", "hold-and-drain": "held, drained"}
VC_STOPS = {
    "": "open",
    "hold": "held by an admin: none of its jobs starts; running ones go on",
    "hold-and-drain": (
        "held and drained by an admin: none of its jobs starts; running ones are checkpointed and requeued"
    ),
}

# The width of output that goes to a pipe or a file: wide enough that no table wraps.
PIPE_WIDTH = 10_000


def listing(
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    wraps: Sequence[str] = (),
    numbers: Sequence[str] = (),
) -> Table:
    """A borderless table, one row per item; only the columns named in `wraps` may wrap, and
    those named in `numbers` are aligned right."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(
            column, no_wrap=column not in wraps, justify="right" if column in numbers else "left"
        )
    for row in rows:
        table.add_row(*row)
    return table


class UsageError(Exception):
    """Bad input found before anything was sent (exit 2)."""


class Context:
    """What every command needs: the consoles and, lazily, a signed-in client."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Console(highlight=False, soft_wrap=False)
        self.err = Console(stderr=True, highlight=False)
        for console in (self.out, self.err):
            if not console.is_terminal:  # a pipe or a file: whole lines, one row each, for scripts
                console.width = PIPE_WIDTH
        self._client: PortalClient | None = None

    def client(self) -> PortalClient:
        if self._client is None:
            try:
                settings = config.load(getattr(self.args, "url", None))
            except config.ConfigError as error:
                raise UsageError(str(error)) from None
            if not settings.url:
                raise AuthError("no portal URL: run `gpuportal login --url URL` or set GPUPORTAL_URL", None)
            if not settings.token:
                raise AuthError("not signed in: run `gpuportal login` or set GPUPORTAL_TOKEN", None)
            self._client = PortalClient(settings.url, settings.token)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


# -- formatting -------------------------------------------------------------------------


def styled_state(state: str) -> str:
    return f"[{STATE_STYLES.get(state, 'white')}]{escape(state)}[/]"


def relative(moment: datetime | None, now: datetime | None = None) -> str:
    """'in 4m', '2h ago': what people read in a queue; the absolute time goes in JSON output."""
    if moment is None:
        return "-"
    now = now or datetime.now(UTC)
    seconds = (moment - now).total_seconds()
    amount = abs(seconds)
    if amount < 60:
        text = f"{amount:.0f}s"
    elif amount < 3600:
        text = f"{amount // 60:.0f}m"
    elif amount < 86400:
        text = f"{amount // 3600:.0f}h{amount % 3600 // 60:02.0f}m"
    else:
        text = f"{amount // 86400:.0f}d{amount % 86400 // 3600:.0f}h"
    if amount < 1:
        return "now"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def clock(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def wall_time(moment: datetime, now: datetime | None = None) -> str:
    """'14:05' today, 'Dec 12 03:16' on another day: a bare time two weeks out reads as today."""
    local = moment.astimezone()
    today = (now or datetime.now(UTC)).astimezone().date()
    return local.strftime("%H:%M") if local.date() == today else local.strftime("%b %d %H:%M")


def gpus_of(job: Job) -> str:
    if job.replicas > 1:
        return f"{job.replicas}x{job.gpus_per_replica} {job.gpu_model}".strip()
    return f"{job.total_gpus} {job.gpu_model}".strip()


def after_text(job: Job) -> str:
    """What the jobs of `after` must have done for this one to start, after their list: a
    portal newer than this client may know types it does not, which are shown as named."""
    one = len(job.after) == 1
    return {
        "ok": "succeeded",
        "any": "ended",
        "notok": "ended, if it did not succeed" if one else "ended, if one did not succeed",
    }.get(job.after_type, f"(after_type {job.after_type})")


def index_ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6': a whole node reads as 0-7 instead of eight numbers."""
    parts: list[str] = []
    ordered = sorted(set(indices))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


def counted(number: int, noun: str) -> str:
    """'1 GPU', '8 GPUs'."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def vc_state(vc: VirtualCluster) -> str:
    """'open', 'held' or 'held, drained'; a stop this client does not know, as the portal names it."""
    return VC_STATES.get(vc.stop_policy, vc.stop_policy)


def next_month_start(now: datetime | None = None) -> date:
    """The first day of the next calendar month in UTC: when spent GPU-hour budgets start over."""
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    return date(today.year + 1, 1, 1) if today.month == 12 else date(today.year, today.month + 1, 1)


def budget_cell(vc: VirtualCluster) -> str:
    """The BUDGET column: '812.4 / 1,000 GPU-h' this month, '..., spent' once the VC's jobs held
    it all (the portal says when), '-' without a budget. Hours are rounded as in the portal's
    pending message, so the two read the same."""
    if vc.gpu_hours_per_month is None:
        return "-"
    figures = f"{vc.gpu_hours_this_month:,.1f} / {vc.gpu_hours_per_month:,} GPU-h"
    return f"{figures}, spent" if vc.budget_spent else figures


def budget_text(vc: VirtualCluster, now: datetime | None = None) -> str:
    """The budget in words for `vcs NAME`, with the month it counts and, once spent, when the
    VC's jobs may start again."""
    if vc.gpu_hours_per_month is None:
        return "none"
    month = (now or datetime.now(UTC)).astimezone(UTC)
    used = f"{vc.gpu_hours_this_month:,.1f} of {vc.gpu_hours_per_month:,} GPU-hours used in {month:%B} (UTC)"
    if not vc.budget_spent:
        return used
    return (
        f"{used}: spent, none of its jobs starts until {next_month_start(now):%Y-%m-%d}"
        " or until an admin raises it; running ones go on"
    )


QUOTA_FIGURES = ("IN USE", "GUARANTEED", "BORROW LIMIT", "LENDS")  # what quota_cells gives after the model


def quota_cells(quota: Quota) -> tuple[str, str, str, str, str]:
    """LENDS is how many idle guaranteed GPUs other VCs may borrow: "all" unless a limit keeps some."""
    lends = "all" if quota.lending_limit is None else str(quota.lending_limit)
    return (escape(quota.gpu_model), str(quota.in_use), str(quota.guaranteed), str(quota.borrow_limit), lends)


def print_json(ctx: Context, data: Any) -> None:
    ctx.out.print_json(json.dumps(data, default=str))


def dump(items: Sequence[Any]) -> list[Any]:
    return [item.model_dump(mode="json") for item in items]


def read_password(args: argparse.Namespace) -> str:
    """The password, from standard input or asked for. Standard input with no password on it
    (`< /dev/null`, an unset variable in `echo "$PW"`) is a mistake in the script: it is
    refused here rather than sent to the portal, which would refuse an empty password."""
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
        if not password:
            raise UsageError("no password on standard input")
        return password
    if not sys.stdin.isatty():
        raise UsageError("no terminal to ask for the password: use --password-stdin or --token")
    return getpass.getpass("Password: ")


# -- commands ---------------------------------------------------------------------------


def cmd_login(ctx: Context) -> int:
    args = ctx.args
    try:
        stored = config.read_file()
    except config.ConfigError as error:
        # Signing in again is how a user repairs a damaged file (say, half-written in a crash):
        # it must not be refused because of the very file it replaces.
        ctx.err.print(f"[yellow]warning:[/] {escape(str(error))}; signing in replaces it.")
        stored = {}
    url = (args.url or os.environ.get(config.ENV_URL) or stored.get("url") or "").rstrip("/")
    if not url:
        raise UsageError("which portal? give --url URL (e.g. https://gpus.example.org)")
    check_portal_url(url)
    try:
        token, me = sign_in(args, url)
    except NotFound:
        # The sign-in and /me/ exist on every portal: a 404 means the URL is not the portal's
        # address (say, a path under it).
        raise Unreachable(
            f"{url} is not the portal's address (no portal API at {url}/api/v1/): give the"
            " address its web app opens at, e.g. gpuportal login --url https://gpus.example.org"
        ) from None
    path = config.save(url, token, me.username)
    tenants = ", ".join(f"{m.tenant} ({m.role})" for m in me.memberships) or "no tenant"
    ctx.err.print(f"Signed in to {escape(url)} as [bold]{escape(me.username)}[/]: {escape(tenants)}.")
    ctx.err.print(f"Token stored in {escape(str(path))} (readable only by you).")
    if os.environ.get(config.ENV_TOKEN):
        ctx.err.print("[yellow]Note: GPUPORTAL_TOKEN is set and overrides the stored token.[/]")
    return OK


def check_portal_url(url: str) -> None:
    """Refuse, before anything is sent, a URL that is plainly not the portal's base URL: the
    API's own address (.../api/v1), or one without http:// or https://. Both are typing mistakes
    (exit 2), and the message gives the URL to use instead."""
    has_scheme = url.lower().startswith(("http://", "https://"))
    base = url[: -len("/api/v1")] if url.lower().endswith("/api/v1") else url
    suggestion = base if has_scheme else f"{suggested_scheme(base)}://{base}"
    if base != url:
        raise UsageError(
            f"{url} is the address of the portal's API, not the portal's: give the portal's base URL,"
            f" the address its web app opens at, e.g. gpuportal login --url {suggestion}"
        )
    if not has_scheme:
        raise UsageError(f"{url} is not a portal URL: give it with http:// or https://, e.g. {suggestion}")


def suggested_scheme(address: str) -> str:
    """'http' for a portal on this machine (localhost, a loopback address: 127.0.0.0/8, ::1),
    where a development server speaks plain HTTP; 'https' for any other host."""
    try:
        host = urlsplit(f"//{address}").hostname or address
    except ValueError:  # e.g. an unclosed [
        return "https"
    if host == "localhost":
        return "http"
    try:
        return "http" if ipaddress.ip_address(host).is_loopback else "https"
    except ValueError:  # a host name
        return "https"


def sign_in(args: argparse.Namespace, url: str) -> tuple[str, Me]:
    """The token `login` stores (the one given, or a new one made with the password) and
    whom it signs in as."""
    if args.token:
        token = args.token
        with PortalClient(url, token) as client:
            me = client.me()
    else:
        username = args.username
        if not username:
            if not sys.stdin.isatty():
                raise UsageError("no terminal to ask for the user name: use --username")
            username = input("User name: ").strip()
        password = read_password(args)
        name = args.token_name or f"gpuportal CLI on {socket.gethostname()}"[:100]
        created = PortalClient.login_with_password(url, username, password, name, args.expires_in_days)
        if not created.token:
            raise AuthError("the portal created no token", None)
        token = created.token
        with PortalClient(url, token) as client:
            me = client.me()
    return token, me


def cmd_logout(ctx: Context) -> int:
    if not config.forget():
        ctx.err.print("No stored token.")
        return OK
    ctx.err.print("Stored token removed; the portal's URL is kept.")
    ctx.err.print("The token stays valid on the portal until it expires; revoke it at /api/v1/tokens/.")
    return OK


def cmd_whoami(ctx: Context) -> int:
    me = ctx.client().me()
    if ctx.args.output == "json":
        print_json(ctx, me.model_dump(mode="json"))
        return OK
    tenants = ", ".join(f"{m.tenant} ({m.role})" for m in me.memberships) or "no tenant"
    ctx.out.print(f"{escape(me.username)} on {escape(ctx.client().url)}: {escape(tenants)}")
    return OK


def cmd_submit(ctx: Context) -> int:
    args = ctx.args
    text = read_spec_file(args.file)
    if args.follow and args.output == "json":
        raise UsageError("-o json prints the submitted job and ends; leave out --follow")
    try:
        if args.dry_run:
            return report_dry_run(ctx, ctx.client().dry_run(text))
        if args.array is not None:
            return report_array(ctx, ctx.client().submit_job_array(text, args.array))
        job = ctx.client().submit_job(text)
    except BadRequest as error:
        if set(error.errors) != {"detail"}:  # field errors: say which file they are about
            raise BadRequest(
                f"the portal refused the job spec in {spec_source(args.file)}", error.errors
            ) from None
        raise
    if args.output == "json":
        print_json(ctx, job.model_dump(mode="json"))
        return OK
    if args.quiet:
        ctx.out.print(str(job.id))
    else:
        ctx.err.print(
            f"Submitted job [bold]{job.id}[/] {escape(job.name)} to VC {escape(job.vc)} "
            f"({escape(gpus_of(job))}, priority {escape(job.priority_class)})."
        )
    if not args.follow:
        return OK
    return follow(ctx, job.id)


def report_dry_run(ctx: Context, verdict: DryRun) -> int:
    """The portal's verdict on stdout, as the answer asked for: one line, then a line per hint
    (not with -q). Accepted is a success whether the job would start now or wait."""
    if ctx.args.output == "json":
        print_json(ctx, verdict.model_dump(mode="json"))
        return OK
    ctx.out.print(escape(verdict_line(verdict)))
    if verdict.scheduling_paused:
        ctx.err.print(PAUSED_NOTE)
    if not ctx.args.quiet:
        for hint in verdict.hints:
            ctx.out.print(escape(f"  would help: {hint.message}"))
    return OK


PAUSED_NOTE = "Note: an admin has paused scheduling; nothing starts until it resumes."


def verdict_line(verdict: DryRun, now: datetime | None = None) -> str:
    """'would start now on a100-node-1:0,1', or 'would wait: REASON, MESSAGE; position N;
    estimated start 14:05 (in 2h10m)', the words `submit --follow` uses for a waiting job."""
    if verdict.would_start_now:
        line = f"would start now on {verdict.placement}"
        if verdict.borrowed_gpus:
            borrowed = counted(verdict.borrowed_gpus, "GPU")
            line += f" ({borrowed} borrowed beyond its VC's guarantee: preemptible)"
        return line
    line = f"would wait: {verdict.reason}, {verdict.message.rstrip('.')}"
    if verdict.queue_position is not None:
        line += f"; position {verdict.queue_position}"
    start = verdict.estimated_start
    if start is None:
        return line + "; no estimated start"
    return line + f"; estimated start {wall_time(start, now)} ({relative(start, now)})"


def report_array(ctx: Context, job_ids: list[int]) -> int:
    """The ids of a job array on one line of stdout, copy 0 first, for scripts to read
    (`-o json`: a list); what was made, on stderr."""
    if ctx.args.output == "json":
        print_json(ctx, job_ids)
        return OK
    ctx.out.print(" ".join(map(str, job_ids)))
    if not ctx.args.quiet:
        last = len(job_ids) - 1
        ctx.err.print(
            f"Submitted a job array of {len(job_ids)} from {escape(spec_source(ctx.args.file))}: jobs "
            f"{index_ranges(job_ids)} (names ending in -0 to -{last}, ARRAY_INDEX 0 to {last})."
        )
    return OK


def follow(ctx: Context, job_id: int, *, attempt: int | None = None) -> int:
    """Stream the job's transitions and waiting reasons (stderr) and its output (stdout) until
    it ends; the job's outcome becomes the exit status."""
    client = ctx.client()
    last: JobDetail | None = None
    spinner = Spinner("dots", text=f"job {job_id}: waiting")
    # The spinner is drawn on stderr. By default rich's Live also swaps sys.stdout for a proxy
    # that prints through the stderr console whenever stderr is a terminal, and the job's output
    # then went to stderr, lost to `gpuportal logs -f > out.txt`. Only when stdout is a terminal
    # too (both on one screen) do the lines go through that proxy, so that each is printed above
    # the spinner instead of over it; into a pipe or a file they go to the real stdout.
    with Live(
        spinner,
        console=ctx.err,
        transient=True,
        refresh_per_second=12.5,
        redirect_stdout=sys.stdout.isatty(),
    ):
        for item in client.follow_logs(job_id, poll_s=ctx.args.poll, from_attempt=attempt, events=True):
            if isinstance(item, LogLine):
                write_line(item, last)
            elif isinstance(item, JobEvent):
                report_event(ctx, job_id, item)
            else:
                report_waiting(ctx, last, item)
                progress = start_progress(item)
                spinner.update(
                    text=f"job {job_id}: {item.state}" + (f" — {escape(progress)}" if progress else "")
                )
                last = item
    assert last is not None
    return finish(ctx, last)


def write_line(line: LogLine, job: JobDetail | None) -> None:
    prefix = f"[{line.replica}] " if job is not None and job.replicas > 1 else ""
    sys.stdout.write(f"{prefix}{line.text}\n")
    sys.stdout.flush()


def report_event(ctx: Context, job_id: int, event: JobEvent) -> None:
    """One line per event: a transition with the new state, who moved the job and why
    (placement, preemption, ...); an event that changes no state (a hold, a release, a time
    limit's warning) has no state to show, so it reads as what happened and who did it."""
    when = event.created_at.astimezone().strftime("%H:%M:%S")
    if not event.changes_state:
        what = event.reason or "an event with no reason given"
        by = f" (by {event.actor_label})" if event.actor_label else ""
        ctx.err.print(f"[dim]{when}[/] job {job_id}: {escape(what + by)}")
        return
    why = f" ({event.reason})" if event.reason else ""
    by = f" by {event.actor_label}" if event.actor_label else ""
    ctx.err.print(f"[dim]{when}[/] job {job_id} {styled_state(event.to_state)}{escape(why + by)}")


def report_waiting(ctx: Context, before: JobDetail | None, job: JobDetail) -> None:
    """While the job waits, say why and when it may start, whenever that changes."""
    if job.state != "pending" or not job.pending_reason:
        return
    if before is not None and (before.pending_reason, before.pending_message) == (
        job.pending_reason,
        job.pending_message,
    ):
        return
    detail = f"waiting: {job.pending_reason}"
    if job.pending_message:
        detail += f", {job.pending_message}"
    if job.queue_position is not None:
        detail += f"; position {job.queue_position}"
    if job.estimated_start_at:
        detail += f"; estimated start {relative(job.estimated_start_at)}"
    ctx.err.print(f"[dim]{datetime.now().strftime('%H:%M:%S')}[/]   {escape(detail)}")


def start_progress(job: JobDetail) -> str:
    """What the current attempt's starting replicas say (an image pull's progress), for the
    spinner of a follow: it changes about once a second, too often for lines of its own."""
    attempt = job.latest_attempt
    if attempt is None or job.ended:
        return ""
    saying = [r for r in attempt.replicas_status if r.state == "starting" and r.message]
    if not saying:
        return ""
    first = saying[0]
    more = f" (and {len(saying) - 1} more)" if len(saying) > 1 else ""
    return f"replica {first.replica} on {first.node}: {first.message}{more}"


def replicas_worth_showing(job: JobDetail) -> Attempt | None:
    """The current attempt, while one of its replicas is not running yet or when one has
    something to say (a start's progress, why it could not start); replicas that all run
    quietly need no table."""
    attempt = job.latest_attempt
    if attempt is None:
        return None
    replicas = attempt.replicas_status
    waiting = not job.ended and any(r.state in (None, "starting") for r in replicas)
    return attempt if waiting or any(r.message for r in replicas) else None


def finish(ctx: Context, job: JobDetail) -> int:
    if job.state == "succeeded":
        ctx.err.print(f"Job {job.id} {styled_state(job.state)}.")
        return OK
    code = f", exit code {job.exit_code}" if job.exit_code is not None else ""
    reason = f": {job.end_reason}" if job.end_reason else ""
    ctx.err.print(f"Job {job.id} {styled_state(job.state)}{escape(code + reason)}.")
    return JOB_FAILED


def cmd_list(ctx: Context) -> int:
    args = ctx.args
    jobs = ctx.client().list_jobs(
        state=args.state, vc=args.vc, owner=None if args.all else "me", limit=args.limit
    )
    if not jobs and args.vc:
        # The portal filters by any name, so a VC the user cannot see lists no jobs; said so,
        # as `vcs NAME` says it. Asked only when nothing matched: a job shown is in a VC the
        # user sees.
        visible_vc(ctx, args.vc)
    if args.output == "json":
        print_json(ctx, dump(jobs))
        return OK
    if not jobs:
        ctx.err.print("No jobs." if args.all else "You have no jobs here (--all shows your tenants' jobs).")
        return OK
    rows = []
    for job in jobs:
        note = job.pending_reason if job.state == "pending" else ""
        if job.ended and job.exit_code is not None:
            note = f"exit {job.exit_code}"
        rows.append(
            (
                str(job.id),
                escape(job.name),
                escape(job.vc),
                escape(job.owner),
                styled_state(job.state),
                escape(gpus_of(job)),
                escape(job.priority_class),
                relative(job.submitted_at),
                escape(note),
            )
        )
    columns = ("ID", "NAME", "VC", "OWNER", "STATE", "GPUS", "PRIORITY", "SUBMITTED", "NOTE")
    ctx.out.print(listing(columns, rows, wraps=("NOTE",)))
    return OK


def cmd_status(ctx: Context) -> int:
    client = ctx.client()
    job = client.get_job(ctx.args.job_id)
    events = client.job_events(job.id)
    if ctx.args.output == "json":
        data = job.model_dump(mode="json")
        data["events"] = dump(events)
        print_json(ctx, data)
        return OK
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("Job", f"{job.id} {escape(job.name)}")
    info.add_row("State", styled_state(job.state))
    info.add_row("VC / owner", f"{escape(job.vc)} / {escape(job.owner)} (tenant {escape(job.tenant)})")
    info.add_row("GPUs", escape(gpus_of(job)))
    info.add_row(
        "Priority",
        f"{escape(job.priority_class)} ({job.priority}" + (", preemptible)" if job.preemptible else ")"),
    )
    info.add_row("Submitted", f"{clock(job.submitted_at)} ({relative(job.submitted_at)})")
    if job.after:
        info.add_row("Starts after", ", ".join(f"job {dep}" for dep in job.after) + " " + after_text(job))
    if job.on_hold and job.state != "pending":  # held once it has stopped
        info.add_row("Held", escape(job.pending_message))
    if job.state == "pending":
        info.add_row("Why pending", escape(f"{job.pending_reason}: {job.pending_message}".strip(": ")))
        if job.queue_position is not None:
            info.add_row("Queue position", str(job.queue_position))
        if job.estimated_start_at is not None:
            info.add_row(
                "Estimated start", f"{clock(job.estimated_start_at)} ({relative(job.estimated_start_at)})"
            )
        for number, hint in enumerate(job.whatif_hints):
            info.add_row("What would help" if number == 0 else "", escape(hint.message))
    if job.started_at:
        info.add_row("Started", clock(job.started_at))
    if job.finished_at:
        info.add_row("Finished", clock(job.finished_at))
    if job.exit_code is not None or job.end_reason:
        info.add_row(
            "Exit", escape(f"{job.exit_code if job.exit_code is not None else '-'} {job.end_reason}")
        )
    ctx.out.print(info)
    if (current := replicas_worth_showing(job)) is not None:
        title = f"Replicas of attempt {current.number}"
        table = Table(title=title, title_justify="left", box=None, header_style="bold")
        for column in ("#", "NODE", "STATE", "EXIT"):
            table.add_column(column, no_wrap=True)
        table.add_column("MESSAGE", overflow="fold")
        for replica in current.replicas_status:
            table.add_row(
                str(replica.replica),
                escape(replica.node or "-"),
                styled_state(replica.state) if replica.state else "[dim]not reported[/]",
                "-" if replica.exit_code is None else str(replica.exit_code),
                escape(replica.message),
            )
        ctx.out.print()
        ctx.out.print(table)
    if job.attempts:
        attempts = Table(title="Attempts", title_justify="left", box=None, header_style="bold")
        # Times and states stay whole on a narrow terminal; a long placement or reason folds.
        for column in ("#", "STATE", "RESUME", "STARTED", "ENDED", "EXIT"):
            attempts.add_column(column, no_wrap=True)
        for column in ("PLACEMENT", "REASON"):
            attempts.add_column(column, overflow="fold")
        for attempt in job.attempts:
            placement: dict[tuple[int, str], list[int]] = {}
            for allocation in attempt.allocations:
                placement.setdefault((allocation.replica, allocation.node), []).append(allocation.gpu_index)
            where = "; ".join(
                f"{node}:{index_ranges(indices)}" for (_, node), indices in sorted(placement.items())
            )
            attempts.add_row(
                str(attempt.number),
                styled_state(attempt.state),
                "yes" if attempt.resume else "no",
                clock(attempt.started_at),
                clock(attempt.ended_at),
                "-" if attempt.exit_code is None else str(attempt.exit_code),
                escape(where or "-"),
                escape(attempt.end_reason),
            )
        ctx.out.print()
        ctx.out.print(attempts)
    if events:
        table = Table(title="Events", title_justify="left", box=None, header_style="bold")
        for column in ("TIME", "FROM", "TO"):
            table.add_column(column, no_wrap=True)
        for column in ("BY", "WHY"):
            table.add_column(column, overflow="fold")
        for event in events[-ctx.args.events :] if ctx.args.events else events:
            table.add_row(
                clock(event.created_at),
                escape(event.from_state or "-"),
                styled_state(event.to_state) if event.to_state else "-",
                escape(event.actor_label),
                escape(event.reason),
            )
        ctx.out.print()
        ctx.out.print(table)
    return OK


def cmd_logs(ctx: Context) -> int:
    args = ctx.args
    client = ctx.client()
    if args.follow:
        return follow(ctx, args.job_id, attempt=args.attempt)
    job = client.get_job(args.job_id)
    if not job.attempts:
        ctx.err.print(f"Job {job.id} has not started yet ({job.state}); no output.")
        return OK
    printed = False
    for line in client.all_job_logs(job.id, attempt=args.attempt):
        write_line(line, job)
        printed = True
    if not printed:
        # Said on stderr, so that `logs 44 > out.txt` still writes exactly the job's output.
        ctx.err.print(
            f"Job {job.id} ({job.state}) printed nothing."
            if job.ended
            else f"Job {job.id} ({job.state}) has printed nothing yet."
        )
    return OK


def held_text(job: Job) -> str:
    """What a hold did: a job holding GPUs is held only once it has stopped."""
    if job.state == "pending":
        return " is held: it does not start until released."
    if job.paused:
        return (
            f" is checkpointing; it will be held when it stops, and resumes from its checkpoint "
            f"when released (gpuportal release {job.id})."
        )
    return " is stopping; it will be held when it stops, and does not start until released."


def released_text(job: Job) -> str:
    if job.state == "pending":
        return " is released: it may start from the next scheduling cycle."
    return f" is released: it is {job.state}, and is queued again once it has stopped."


# The changes a job's owner (or a tenant admin) asks for by id: command -> (help, what the
# job then is, after "Job ID NAME").
JOB_CHANGES: dict[str, tuple[str, Callable[[Job], str]]] = {
    "cancel": ("cancel a job", lambda job: f": {styled_state(job.state)}."),
    "top": (
        "move a pending job before your other pending jobs (no one else's)",
        lambda job: (
            f" goes before {escape(job.owner)}'s other pending jobs in {escape(job.vc)} "
            "from the next scheduling cycle."
        ),
    ),
    "hold": (
        "keep a job from starting until you release it; a running job with checkpointing is "
        "paused: it checkpoints, stops and waits, its GPUs free for others",
        held_text,
    ),
    "release": (
        "let a held job start; a paused one resumes from its checkpoint",
        released_text,
    ),
}


def cmd_change(ctx: Context) -> int:
    job = ctx.client().change_job(ctx.args.job_id, ctx.args.command)
    ctx.err.print(f"Job {job.id} {escape(job.name)}{JOB_CHANGES[ctx.args.command][1](job)}")
    return OK


def cmd_time_limit(ctx: Context) -> int:
    """Slurm's `scontrol update TimeLimit=`: the portal says who may raise it and how far."""
    text = ctx.args.limit
    job = ctx.client().change_time_limit(ctx.args.job_id, int(text) if text.isdigit() else text)
    shown = f"{text} s" if text.isdigit() else text
    ctx.err.print(f"Job {job.id} {escape(job.name)}: its time limit is now {escape(shown)} per attempt.")
    return OK


def cmd_shell(ctx: Context) -> int:
    """Like `kubectl exec -it` or `srun --pty`: the job's own terminal, so it needs this one."""
    if not sys.stdin.isatty():
        raise UsageError("gpuportal shell needs a terminal: standard input is not one")
    ended = run_shell(ctx.client(), ctx.args.job_id, ctx.args.replica)
    if ended.error:
        ctx.err.print(f"[red]error:[/] {escape(ended.message)}")
    else:
        ctx.err.print(escape(ended.message))
    return ended.status


def cmd_queue(ctx: Context) -> int:
    args = ctx.args
    jobs = ctx.client().list_jobs(state="pending", owner=None if args.all else "me", limit=None)
    jobs.sort(
        key=lambda j: (
            j.queue_position is None,
            j.queue_position or 0,
            j.submitted_at.timestamp() if j.submitted_at else 0.0,
        )
    )
    if args.output == "json":
        print_json(ctx, dump(jobs))
        return OK
    if not jobs:
        ctx.err.print("No pending jobs." if args.all else "You have no pending jobs.")
        return OK
    columns = ("ID", "NAME", "VC", "OWNER", "GPUS", "PRIORITY", "POS", "REASON", "START")
    rows = []
    for job in jobs:
        start = relative(job.estimated_start_at)
        if job.estimated_start_at is not None:
            start += f" ({wall_time(job.estimated_start_at)})"
        rows.append(
            (
                str(job.id),
                escape(job.name),
                escape(job.vc),
                escape(job.owner),
                escape(gpus_of(job)),
                escape(job.priority_class),
                "-" if job.queue_position is None else str(job.queue_position),
                escape(job.pending_reason or "-"),
                start,
            )
        )
    whys = [escape(job.pending_message or "-") for job in jobs]
    table = listing((*columns, "WHY"), ((*row, why) for row, why in zip(rows, whys, strict=True)))
    # One line per job where it fits; a terminal too narrow for the messages gets them below
    # the table, wrapped, by job id.
    width = Measurement.get(ctx.out, ctx.out.options.update(width=PIPE_WIDTH), table).maximum
    if width <= ctx.out.width:
        ctx.out.print(table)
        return OK
    ctx.out.print(listing(columns, rows))
    ctx.out.print()
    ids = [str(job.id) for job in jobs]
    ctx.out.print(listing(("ID", "WHY"), zip(ids, whys, strict=True), wraps=("WHY",)))
    return OK


def cmd_nodes(ctx: Context) -> int:
    nodes = ctx.client().nodes()
    if ctx.args.output == "json":
        print_json(ctx, dump(nodes))
        return OK
    rows = []
    for node in nodes:
        models = sorted({g.model for g in node.gpus})
        free = sum(1 for g in node.gpus if g.healthy and not g.allocated)
        # one mark per GPU: # allocated, . free, x unhealthy
        marks = "".join("x" if not g.healthy else "#" if g.allocated else "." for g in node.gpus)
        unhealthy = ", ".join(
            f"{g.index}: {g.health_reason or 'unhealthy'}" for g in node.gpus if not g.healthy
        )
        state = node.state + (f" ({node.state_reason})" if node.state_reason else "")
        rows.append(
            (
                escape(node.name),
                escape(state),
                escape(node.rack or "-"),
                escape(", ".join(models) or "-"),
                f"{free}/{len(node.gpus)}",
                marks or "-",
                escape(unhealthy or "-"),
                relative(node.last_heartbeat_at),
            )
        )
    columns = ("NODE", "STATE", "RACK", "MODEL", "FREE", "GPUS", "UNHEALTHY", "HEARTBEAT")
    ctx.out.print(listing(columns, rows))
    ctx.err.print("[dim]GPUS: # allocated, . free, x unhealthy[/]")
    return OK


def cmd_vcs(ctx: Context) -> int:
    """Like Slurm's `sshare` or Kueue's `kueuectl list clusterqueue`: how much of each quota is in
    use, so a researcher can tell before submitting whether a job would borrow or wait."""
    if ctx.args.vc_name is not None:
        return show_vc(ctx, visible_vc(ctx, ctx.args.vc_name))
    vcs = ctx.client().virtual_clusters()
    if ctx.args.output == "json":
        print_json(ctx, dump(vcs))
        return OK
    if not vcs:
        ctx.err.print("No virtual clusters: none of your tenants has one.")
        return OK
    rows = []
    for vc in vcs:
        for cells in [quota_cells(quota) for quota in vc.quotas] or [("-", "-", "-", "-", "-")]:
            rows.append((escape(vc.name), escape(vc.tenant), *cells, budget_cell(vc), escape(vc_state(vc))))
    columns = ("VC", "TENANT", "MODEL", *QUOTA_FIGURES, "BUDGET", "STATE")
    table = listing(columns, rows, numbers=QUOTA_FIGURES)
    ctx.out.print(table)
    stopped = [f"{vc.name} ({vc_state(vc)})" for vc in vcs if vc.stop_policy]
    if stopped:
        ctx.err.print(f"[yellow]Stopped by an admin, no job starts in: {escape(', '.join(stopped))}.[/]")
    spent = ", ".join(vc.name for vc in vcs if vc.budget_spent)
    if spent:
        until = next_month_start()
        ctx.err.print(
            f"[yellow]Monthly GPU-hour budget spent, no job starts until {until} in: {escape(spent)}.[/]"
        )
    return OK


def visible_vc(ctx: Context, name: str) -> VirtualCluster:
    """A virtual cluster of the user's tenants by name. Another tenant's reads exactly as one that
    does not exist (exit 3), so that no name tells whether another tenant has it."""
    try:
        return ctx.client().virtual_cluster(name)
    except NotFound:
        raise NotFound(f"virtual cluster {name} not found", 404) from None


def show_vc(ctx: Context, vc: VirtualCluster) -> int:
    """One virtual cluster: what it is for, how it orders its jobs, its limits and quotas."""
    if ctx.args.output == "json":
        print_json(ctx, vc.model_dump(mode="json"))
        return OK
    limits = []
    if vc.max_gpus_per_user is not None:
        limits.append(counted(vc.max_gpus_per_user, "GPU") + " in use")
    if vc.max_cpus_per_user is not None:
        limits.append(counted(vc.max_cpus_per_user, "CPU") + " in use")
    if vc.max_memory_gb_per_user is not None:
        limits.append(f"{vc.max_memory_gb_per_user} GB of memory in use")
    if vc.max_pending_jobs_per_user is not None:
        limits.append(counted(vc.max_pending_jobs_per_user, "pending job"))
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("VC", escape(vc.name))
    info.add_row("Tenant", escape(vc.tenant))
    info.add_row("Description", escape(vc.description or "-"))
    info.add_row("Queue order", escape(vc.queueing_policy_label or vc.queueing_policy or "-"))
    info.add_row("Per-user limits", ", ".join(limits) or "none")
    info.add_row("Monthly budget", budget_text(vc))
    info.add_row("State", escape(VC_STOPS.get(vc.stop_policy, vc.stop_policy)))
    ctx.out.print(info)
    if not vc.quotas:
        ctx.err.print(f"VC {escape(vc.name)} has no GPU quota: none of its jobs can start.")
        return OK
    table = listing(("MODEL", *QUOTA_FIGURES), map(quota_cells, vc.quotas), numbers=QUOTA_FIGURES)
    ctx.out.print()
    ctx.out.print(table)
    return OK


def cmd_flavors(ctx: Context) -> int:
    """What a job spec's `flavor` may name: the resources each replica gets, and the longest time
    limit a job of the flavor may have."""
    flavors = ctx.client().flavors()
    if ctx.args.output == "json":
        print_json(ctx, dump(flavors))
        return OK
    if not flavors:
        ctx.err.print("No flavors: a cluster admin has defined none, so no job can be submitted.")
        return OK
    rows = [flavor_cells(flavor) for flavor in flavors]
    figures = ("GPUS", "CPUS", "MEMORY GB", "MAX TIME LIMIT")
    ctx.out.print(listing(("FLAVOR", "MODEL", *figures), rows, numbers=figures))
    return OK


def flavor_cells(flavor: Flavor) -> tuple[str, ...]:
    """GPUs, CPUs and memory per replica; the time limit in hours, as `time-limit` takes it."""
    hours = "-" if flavor.max_runtime_hours is None else f"{flavor.max_runtime_hours}h"
    return (
        escape(flavor.name),
        escape(flavor.gpu_model),
        str(flavor.gpus),
        str(flavor.cpu),
        str(flavor.memory_gb),
        hours,
    )


def cmd_priority_classes(ctx: Context) -> int:
    """What a job spec's `priority` may name, highest value first: a higher class starts first
    and may preempt jobs of lower, preemptible ones; some are for tenant admins only."""
    classes = ctx.client().priority_classes()
    if ctx.args.output == "json":
        print_json(ctx, dump(classes))
        return OK
    if not classes:
        ctx.err.print("No priority classes: a cluster admin has defined none.")
        return OK
    rows = [priority_cells(priority) for priority in classes]
    columns = ("PRIORITY", "VALUE", "PREEMPTIBLE", "ADMINS ONLY", "DEFAULT", "DESCRIPTION")
    ctx.out.print(listing(columns, rows, wraps=("DESCRIPTION",), numbers=("VALUE",)))
    return OK


def priority_cells(priority: PriorityClass) -> tuple[str, ...]:
    """ADMINS ONLY: only a tenant's admins may submit jobs of the class; DEFAULT: the class of a
    spec that names none."""
    return (
        escape(priority.name),
        str(priority.value),
        "yes" if priority.preemptible else "no",
        "yes" if priority.tenant_admins_only else "no",
        "yes" if priority.is_default else "no",
        escape(priority.description),
    )


def cmd_usage(ctx: Context) -> int:
    args = ctx.args
    client = ctx.client()
    try:
        if args.csv:
            sys.stdout.write(client.usage_csv(args.since, args.until, args.group))
            return OK
        report = client.usage(args.since, args.until, args.group)
    except BadRequest as error:
        raise BadRequest("the portal refused the usage query", error.errors) from None
    if args.output == "json":
        print_json(ctx, report.model_dump(mode="json"))
        return OK
    period = f"{clock(report.since)} to {clock(report.until)}"
    if not report.results:
        ctx.err.print(f"No GPU usage from {period}.")
        return OK
    # Per job, each row is one job: a JOBS column would say 1 on every line.
    per_job = report.group == "job"
    rows = [
        (
            escape(row.key),
            *(() if per_job else (str(row.jobs),)),
            f"{row.allocated_gpu_hours:,.2f}",
            f"{row.used_gpu_hours:,.2f}",
            f"{row.energy_kwh:,.2f}",
        )
        for row in report.results
    ]
    figures = (*(() if per_job else ("JOBS",)), "GPU-HOURS", "USED GPU-HOURS", "ENERGY KWH")
    table = listing((report.group.upper(), *figures), rows, numbers=figures)
    ctx.out.print(table)
    ctx.err.print(
        f"[dim]GPU time from {period} only. USED: GPU-hours weighted by the GPUs' measured utilization.[/]"
    )
    return OK


# -- the parser -------------------------------------------------------------------------


# -- webhooks ---------------------------------------------------------------------------


def delivery_text(hook: Webhook) -> str:
    """The latest delivery: whether it got a 2xx, the receiver's status or what went wrong, when."""
    if hook.last_delivery_at is None:
        return "none yet"
    status = f"HTTP {hook.last_delivery_status}" if hook.last_delivery_status is not None else ""
    outcome = ": ".join(part for part in (status, hook.last_delivery_error) if part) or "no answer"
    verdict = "ok" if hook.last_delivery_ok else "failed"
    return f"{verdict}, {outcome}, {relative(hook.last_delivery_at)}"


def cmd_webhooks(ctx: Context) -> int:
    """Your webhooks: where the portal posts about your jobs (a spec's `notify`, idle GPUs), as
    on the web app's Tokens & webhooks page."""
    args, client = ctx.args, ctx.client()
    if args.webhooks_action == "list":
        hooks = client.webhooks()
        if args.output == "json":
            print_json(ctx, dump(hooks))
        elif not hooks:
            ctx.err.print("No webhooks: add one with `gpuportal webhooks add URL`.")
        else:
            rows = [
                (
                    str(h.id),
                    escape(h.url),
                    h.format,
                    "yes" if h.enabled else "no",
                    "yes" if h.has_secret else "no",
                    escape(delivery_text(h)),
                )
                for h in hooks
            ]
            columns = ("ID", "URL", "FORMAT", "ENABLED", "SIGNED", "LAST DELIVERY")
            ctx.out.print(listing(columns, rows, wraps=("URL", "LAST DELIVERY")))
        return OK
    if args.webhooks_action == "add":
        secret = sys.stdin.readline().rstrip("\n") if args.secret_stdin else ""
        hook = client.add_webhook(args.webhook_url, args.format, secret, enabled=not args.disabled)
        if args.output == "json":
            print_json(ctx, hook.model_dump(mode="json"))
        else:
            ctx.err.print(f"Webhook {hook.id} added: {escape(hook.url)}.")
            ctx.err.print(f"Send it a test: gpuportal webhooks test {hook.id}")
        return OK
    try:
        if args.webhooks_action == "remove":
            client.remove_webhook(args.webhook_id)
            ctx.err.print(f"Webhook {args.webhook_id} removed.")
            return OK
        hook = client.test_webhook(args.webhook_id)
    except NotFound:
        raise NotFound(f"webhook {args.webhook_id} not found", 404) from None
    if args.output == "json":
        print_json(ctx, hook.model_dump(mode="json"))
    elif hook.last_delivery_ok:
        ctx.err.print(f"Test delivered to {escape(hook.url)}: {escape(delivery_text(hook))}.")
    else:
        ctx.err.print(f"[red]Test failed[/] for {escape(hook.url)}: {escape(delivery_text(hook))}.")
    return OK if hook.last_delivery_ok else JOB_FAILED


def spec_source(name: str) -> str:
    """How messages name where a spec came from: its file, or standard input for `-`."""
    return "standard input" if name == "-" else name


def read_spec_file(name: str) -> str:
    """The text of a spec file (- for stdin), refused before anything is sent when it cannot
    be read or is empty."""
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as error:
        raise UsageError(f"cannot read {spec_source(name)}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{spec_source(name)} is not UTF-8 text") from None
    if not text.strip():
        raise UsageError(f"{spec_source(name)} is empty")
    return text


def find_template(ctx: Context, wanted: str) -> JobTemplate:
    """The template called `wanted` (NAME, or OWNER/NAME for one shared by another user): your
    own first, as names are unique per owner only."""
    owner, _, name = wanted.rpartition("/")
    found = ctx.client().templates(name=name)
    if owner:
        found = [t for t in found if t.owner == owner]
    elif len(found) > 1:
        me = ctx.client().me().username
        found = [t for t in found if t.owner == me] or found
    if not found:
        raise NotFound(f"template {wanted} not found", 404)
    if len(found) > 1:
        owners = ", ".join(f"{t.owner}/{t.name}" for t in found)
        raise UsageError(f"several shared templates are called {name}: name one of {owners}")
    return found[0]


def cmd_templates(ctx: Context) -> int:
    """Saved job specs, as the web app's submit page offers them: `show` prints one as YAML,
    so `gpuportal templates show NAME > job.yaml && gpuportal submit job.yaml` submits it."""
    args = ctx.args
    if args.templates_action in (None, "list"):
        templates = ctx.client().templates()
        if args.output == "json":
            print_json(ctx, dump(templates))
        elif not templates:
            ctx.err.print("No templates: save one with `gpuportal templates save NAME FILE`.")
        else:
            rows = [
                (escape(t.name), escape(t.owner), "yes" if t.shared else "no", escape(t.description))
                for t in templates
            ]
            ctx.out.print(listing(("NAME", "OWNER", "SHARED", "DESCRIPTION"), rows, wraps=("DESCRIPTION",)))
        return OK
    if args.templates_action == "save":
        spec = parse_yaml_spec(read_spec_file(args.file))
        try:
            template = ctx.client().save_template(
                args.name, spec, description=args.description, shared=args.shared
            )
        except BadRequest as error:
            if set(error.errors) == {"detail"}:
                raise
            # Only errors under `spec` are about the file; the template's own fields (a name
            # already used, or one the portal does not take) are not, and must not read so.
            about_spec = all(field == "spec" or field.startswith("spec.") for field in error.errors)
            reason = (
                f"the spec in {spec_source(args.file)} was refused" if about_spec else "the portal refused it"
            )
            raise BadRequest(f"template {args.name} not saved: {reason}", error.errors) from None
        if args.output == "json":
            print_json(ctx, template.model_dump(mode="json"))
        else:
            shared = f", shared with tenant {template.tenant}" if template.shared else ""
            ctx.err.print(f"Template {escape(template.name)} saved{escape(shared)}.")
        return OK
    template = find_template(ctx, args.name)
    if args.templates_action == "delete":
        ctx.client().delete_template(template.id)
        ctx.err.print(f"Template {escape(template.owner)}/{escape(template.name)} deleted.")
        return OK
    if args.output == "json":
        print_json(ctx, template.spec)
    else:  # unchanged by rich: this is a file to submit
        sys.stdout.write(yaml.safe_dump(template.spec, sort_keys=False, allow_unicode=True))
    return OK


# -- tenants and members ----------------------------------------------------------------

# The roles a tenant's member may have, as the portal names them; `members add --role` and
# `members set-role` take only these, so a typo is refused before anything is sent.
ROLES = ("admin", "member", "viewer")
MEMBER_ACTIONS = ("list", "add", "set-role", "remove")


def cmd_tenants(ctx: Context) -> int:
    """The tenants you belong to and your role in each: what `members TENANT` takes."""
    tenants = ctx.client().tenants()
    if ctx.args.output == "json":
        print_json(ctx, dump(tenants))
        return OK
    if not tenants:
        ctx.err.print("You belong to no tenant: a tenant admin or a cluster admin adds you to one.")
        return OK
    rows = [(escape(t.name), escape(t.display_name), escape(t.role)) for t in tenants]
    ctx.out.print(listing(("TENANT", "DISPLAY NAME", "ROLE"), rows))
    return OK


def a_role(role: str) -> str:
    """'an admin', 'a member', 'a viewer': a role in a sentence."""
    return f"an {role}" if role[:1] in "aeiou" else f"a {role}"


def member_refusal(what: str, error: BadRequest) -> BadRequest:
    """A refused change of members as the CLI says it: a refusal that names no field (the last
    admin's removal) is the message itself; field errors follow `what` on lines of their own."""
    fields = {field: messages for field, messages in error.errors.items() if field != "non_field_errors"}
    general = error.errors.get("non_field_errors", [])
    if not fields and general:
        message = " ".join(general)
        return BadRequest(message, {"detail": [message]})
    return BadRequest(f"the portal refused to {what}", error.errors)


def member_table(members: Sequence[TenantMember]) -> Table:
    """USER and ROLE, for everyone: the portal gives no one the members' addresses."""
    return listing(("USER", "ROLE"), [(escape(m.username), escape(m.role)) for m in members])


def cmd_members(ctx: Context) -> int:
    """A tenant's members, as on the web app's Members page: any member lists them, its admins
    add members, change their roles and remove them."""
    args, client = ctx.args, ctx.client()
    tenant, action = args.tenant, args.members_action
    if action == "list":
        members = client.members(tenant)
        if args.output == "json":
            print_json(ctx, dump(members))
        else:
            ctx.out.print(member_table(members))
        return OK
    if action == "remove":
        try:
            client.remove_member(tenant, args.username)
        except BadRequest as error:
            raise member_refusal(f"remove {args.username} from {tenant}", error) from None
        ctx.err.print(f"Removed {escape(args.username)} from {escape(tenant)}.")
        return OK
    if action == "add":
        try:
            member = client.add_member(tenant, args.username, args.role)
        except BadRequest as error:
            raise member_refusal(f"add {args.username} to {tenant}", error) from None
        done = f"Added {member.username} to {tenant} as {a_role(member.role)}."
    else:
        try:
            member = client.set_member_role(tenant, args.username, args.role)
        except BadRequest as error:
            raise member_refusal(f"make {args.username} {a_role(args.role)} of {tenant}", error) from None
        done = f"{member.username} is now {a_role(member.role)} of {tenant}."
    if args.output == "json":
        print_json(ctx, member.model_dump(mode="json"))
    else:
        ctx.err.print(escape(done))
    return OK


def with_members_list_implied(argv: Sequence[str]) -> list[str]:
    """`gpuportal members TENANT` is short for `gpuportal members list TENANT`: argparse knows
    only the long form, so `list` is put in when what follows `members` names no action."""
    args = list(argv)
    if not args or args[0] != "members":
        return args
    rest = iter(args[1:])
    for word in rest:
        if word in ("-o", "--output"):
            next(rest, None)  # the option's value is no action
        elif word in ("-h", "--help"):
            return args  # the help of `members` itself
        elif not word.startswith("-"):
            return args if word in MEMBER_ACTIONS else [args[0], "list", *args[1:]]
    return [args[0], "list", *args[1:]]


def at_least(low: int, what: str) -> Callable[[str], int]:
    """An argparse type for a whole number of at least `low`; `what` names it in the refusal."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = low - 1
        if number < low:
            raise argparse.ArgumentTypeError(f"{what} is a whole number from {low}, not {value!r}")
        return number

    return parse


def job_id(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"a job id is a number, not {value!r}")
    return int(value)


def replica_number(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"a replica is a number from 0, not {value!r}")
    return int(value)


def array_size(value: str) -> int:
    """The portal takes 1 to MAX_ARRAY_JOBS jobs in one array: another size is refused here,
    before anything is sent."""
    if not value.isdigit() or not 1 <= int(value) <= MAX_ARRAY_JOBS:
        raise argparse.ArgumentTypeError(f"a job array has 1 to {MAX_ARRAY_JOBS} jobs, not {value!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items())
    parser = argparse.ArgumentParser(
        prog="gpuportal",
        description="Submit and watch jobs on a GPU Portal.",
        epilog=f"Configuration: {config.ENV_URL} and {config.ENV_TOKEN} override the file written by "
        f"`gpuportal login`.\n\nExit codes:\n{codes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuportal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, handler: Callable[[Context], int], help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(handler=handler)
        return command

    def add_output(command: argparse.ArgumentParser) -> None:
        command.add_argument("-o", "--output", choices=["table", "json"], default="table")

    login = add("login", cmd_login, "sign in and store an API token")
    login.add_argument("--url", help="the portal, e.g. https://gpus.example.org")
    login.add_argument("--username", "-u", help="asked for when not given")
    login.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    login.add_argument("--token", help="store this API token instead of signing in with a password")
    login.add_argument("--token-name", help="the name the new token gets on the portal")
    login.add_argument(
        "--expires-in-days",
        type=at_least(0, "a token's lifetime in days"),
        default=90,
        help="0 means never (default 90)",
    )

    add("logout", cmd_logout, "forget the stored token")
    add_output(add("whoami", cmd_whoami, "who the stored token signs in as"))

    submit = add("submit", cmd_submit, "submit a job spec (YAML, as in the web form)")
    submit.add_argument("file", help="the job spec file, or - for stdin")
    one_or_many = submit.add_mutually_exclusive_group()
    one_or_many.add_argument(
        "--follow", "-f", action="store_true", help="stream states and output until it ends"
    )
    one_or_many.add_argument(
        "--array",
        type=array_size,
        metavar="N",
        help=f"submit N copies (1 to {MAX_ARRAY_JOBS}) as a job array, NAME-0 .. NAME-(N-1), each "
        "with its index in ARRAY_INDEX; prints their ids on one line",
    )
    one_or_many.add_argument(
        "--dry-run",
        action="store_true",
        help="submit nothing: say whether the portal would accept the spec, and whether the job would "
        "start now or why it would wait, until when, and what would help",
    )
    submit.add_argument(
        "--quiet", "-q", action="store_true", help="print only the job id(s); --dry-run: only the verdict"
    )
    add_output(submit)

    listing = add("list", cmd_list, "list your jobs, newest first")
    listing.add_argument(
        "--state",
        action="append",
        choices=JOB_STATES,
        metavar="STATE",
        help=f"only jobs in this state (repeatable): {', '.join(JOB_STATES)}",
    )
    listing.add_argument("--vc", help="only jobs of this virtual cluster")
    listing.add_argument("--all", action="store_true", help="jobs of everyone in your tenants")
    listing.add_argument(
        "--limit", type=at_least(1, "the limit"), default=50, help="at most this many (default 50)"
    )
    add_output(listing)

    status = add("status", cmd_status, "a job's state, attempts, placement and events")
    status.add_argument("job_id", type=job_id)
    status.add_argument(
        "--events",
        type=at_least(0, "the number of events"),
        default=20,
        help="show the last N events (0 = all)",
    )
    add_output(status)

    logs = add("logs", cmd_logs, "a job's output")
    logs.add_argument("job_id", type=job_id)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    logs.add_argument(
        "--attempt",
        type=at_least(1, "an attempt"),
        help="this attempt (default: the latest; -f starts at the first)",
    )

    for name, (help_text, _) in JOB_CHANGES.items():
        add(name, cmd_change, help_text).add_argument("job_id", type=job_id)

    time_limit = add("time-limit", cmd_time_limit, "lower a job's time limit (a tenant admin may raise it)")
    time_limit.add_argument("job_id", type=job_id)
    time_limit.add_argument("limit", help="seconds, or 90m, 36h, 1d12h")

    shell = add("shell", cmd_shell, "open a shell in your running job (a replica of it)")
    shell.add_argument("job_id", type=job_id)
    shell.add_argument(
        "--replica", type=replica_number, default=0, metavar="N", help="this replica (default 0)"
    )

    queue = add("queue", cmd_queue, "your pending jobs with reasons and estimated starts")
    queue.add_argument("--all", action="store_true", help="pending jobs of everyone in your tenants")
    add_output(queue)

    add_output(add("nodes", cmd_nodes, "nodes and their GPUs"))

    vcs = add(
        "vcs",
        cmd_vcs,
        "your tenants' virtual clusters: quotas, GPUs in use, monthly GPU-hour budget, whether stopped",
    )
    vcs.add_argument("vc_name", nargs="?", metavar="NAME", help="one virtual cluster in detail")
    add_output(vcs)

    add_output(
        add(
            "flavors",
            cmd_flavors,
            "the flavors a spec may name: GPUs, CPUs and memory per replica, longest time limit",
        )
    )
    add_output(
        add(
            "priority-classes",
            cmd_priority_classes,
            "the priority classes a spec may name: value, whether preemptible or for tenant admins only,"
            " the default",
        )
    )

    usage = add(
        "usage", cmd_usage, "GPU-hours and energy of the jobs you may see, per VC, user, tenant or job"
    )
    usage.add_argument("--group", default="vc", help="vc (default), user, tenant or job")
    usage.add_argument("--since", help="ISO date (midnight UTC) or time; default 30 days before --until")
    usage.add_argument("--until", help="ISO date (midnight UTC) or time, not included; default now")
    usage.add_argument("--csv", action="store_true", help="print the portal's CSV file instead of a table")
    add_output(usage)

    webhooks = add("webhooks", cmd_webhooks, "your webhooks: where the portal posts about your jobs")
    actions = webhooks.add_subparsers(dest="webhooks_action", metavar="ACTION", required=True)
    add_output(actions.add_parser("list", help="your webhooks and their latest deliveries"))
    new_hook = actions.add_parser("add", help="add a webhook (https on a public host)")
    new_hook.add_argument("webhook_url", metavar="URL")
    new_hook.add_argument(
        "--format",
        choices=["slack", "json"],
        default="slack",
        help="slack: a {text: ...} body (default); json: the event",
    )
    new_hook.add_argument("--secret-stdin", action="store_true", help="read a signing secret from stdin")
    new_hook.add_argument("--disabled", action="store_true", help="add it disabled")
    add_output(new_hook)
    actions.add_parser("remove", help="delete a webhook").add_argument("webhook_id", type=int, metavar="ID")
    test_hook = actions.add_parser("test", help="send a test delivery now and show its outcome")
    test_hook.add_argument("webhook_id", type=int, metavar="ID")
    add_output(test_hook)

    templates = add("templates", cmd_templates, "saved job specs: yours and those shared in your tenants")
    add_output(templates)
    templates.set_defaults(templates_action=None)
    template_actions = templates.add_subparsers(dest="templates_action", metavar="ACTION")
    add_output(template_actions.add_parser("list", help="your templates and the shared ones (the default)"))
    show = template_actions.add_parser("show", help="a template's spec as YAML (-o json: as JSON)")
    show.add_argument("name", metavar="NAME", help="NAME, or OWNER/NAME for another user's shared one")
    add_output(show)
    save = template_actions.add_parser("save", help="save a job spec file as a template")
    save.add_argument("name", metavar="NAME", help="letters, digits, - and _; unique among yours")
    save.add_argument("file", metavar="FILE", help="the job spec file, or - for stdin")
    save.add_argument("--shared", action="store_true", help="offer it to every member of its tenant")
    save.add_argument("--description", default="", help="one line on what it is for")
    add_output(save)
    template_actions.add_parser("delete", help="delete a template").add_argument(
        "name", metavar="NAME", help="NAME, or OWNER/NAME (a tenant admin: a shared one)"
    )

    add_output(add("tenants", cmd_tenants, "the tenants you belong to and your role in each"))

    members = add("members", cmd_members, "a tenant's members; its admins add, remove and change their roles")
    members.usage = (
        "gpuportal members [list] TENANT [-o json]\n"
        "       gpuportal members add TENANT USERNAME [--role ROLE] [-o json]\n"
        "       gpuportal members set-role TENANT USERNAME ROLE [-o json]\n"
        "       gpuportal members remove TENANT USERNAME"
    )
    # Its actions' usage lines start with this, not with the members usage above.
    member_actions = members.add_subparsers(
        dest="members_action", metavar="ACTION", required=True, prog="gpuportal members"
    )
    member_list = member_actions.add_parser("list", help="the tenant's members and their roles (the default)")
    member_list.add_argument("tenant", metavar="TENANT")
    add_output(member_list)
    new_member = member_actions.add_parser("add", help="tenant admins: add an existing user to the tenant")
    new_member.add_argument("tenant", metavar="TENANT")
    new_member.add_argument("username", metavar="USERNAME")
    new_member.add_argument("--role", choices=ROLES, default="member", help="(default member)")
    add_output(new_member)
    role_change = member_actions.add_parser("set-role", help="tenant admins: change a member's role")
    role_change.add_argument("tenant", metavar="TENANT")
    role_change.add_argument("username", metavar="USERNAME")
    role_change.add_argument("role", metavar="ROLE", choices=ROLES, help="admin, member or viewer")
    add_output(role_change)
    removal = member_actions.add_parser("remove", help="tenant admins: remove a member (their jobs stay)")
    removal.add_argument("tenant", metavar="TENANT")
    removal.add_argument("username", metavar="USERNAME")

    for command in sub.choices.values():
        command.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    return parser


def unexpected_answer(error: ValidationError, ctx: Context) -> str:
    """One line for an answer that does not read as the resource asked for (another server at
    the URL, or a portal too old or too new for this client): pydantic's own report is a dozen
    lines about models the user never saw."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the answer"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    url = ctx.args.url if getattr(ctx.args, "url", None) else (ctx._client.url if ctx._client else "the URL")
    return (
        f"the portal's answer does not read as a {error.title}: {where}: {first['msg']}{more};"
        f" is {url} the portal, and as new as this client?"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(with_members_list_implied(sys.argv[1:] if argv is None else argv))
    ctx = Context(args)
    try:
        return int(args.handler(ctx))
    except UsageError as error:
        ctx.err.print(f"[red]error:[/] {escape(str(error))}")
        return USAGE
    except BadRequest as error:
        ctx.err.print(f"[red]error:[/] {escape(error.message)}")
        for field, messages in error.errors.items():
            for message in messages:
                if field != "detail" or message != error.message:
                    ctx.err.print(f"  {escape(field)}: {escape(message)}")
        return error.exit_code
    except NotFound as error:
        # The same words for a job that does not exist and another tenant's (a VC's: visible_vc).
        job = getattr(args, "job_id", None)
        message = f"job {job} not found" if job is not None else escape(error.message)
        ctx.err.print(f"[red]error:[/] {message}")
        return error.exit_code
    except PortalError as error:
        ctx.err.print(f"[red]error:[/] {escape(error.message)}")
        if isinstance(error, AuthError) and error.status == 401:
            ctx.err.print("Sign in again with `gpuportal login`.")
        return error.exit_code
    except ValidationError as error:
        ctx.err.print(f"[red]error:[/] {escape(unexpected_answer(error, ctx))}")
        return UNREACHABLE
    except KeyboardInterrupt:
        ctx.err.print("interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return OK
    finally:
        ctx.close()

"""The CLI and client without a portal: configuration, error mapping and exit codes."""

from __future__ import annotations

import http.server
import io
import json
import os
import stat
import subprocess
import sys
import threading
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from rich.console import Console

from gpuportal import cli, config
from gpuportal.client import (
    AuthError,
    BadRequest,
    Conflict,
    NotFound,
    PortalClient,
    Unreachable,
    flatten_errors,
)
from gpuportal.models import DryRun, Job, JobDetail, JobEvent, LogLine, VirtualCluster
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def run_cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPORTAL_")}
    return subprocess.run(
        [sys.executable, "-m", "gpuportal", *args],
        env={
            **base,
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "COLUMNS": "200",
            **(env or {}),
        },
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    for name in (config.ENV_URL, config.ENV_TOKEN, config.ENV_CONFIG):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_the_token_file_is_private_and_the_environment_wins(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config.save("https://gpus.example.org/", "gpp_secret", "alice")
    assert path == home / ".config" / "gpuportal" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "url": "https://gpus.example.org",
        "token": "gpp_secret",
        "username": "alice",
    }
    settings = config.load()
    assert (settings.url, settings.token, settings.source) == (
        "https://gpus.example.org",
        "gpp_secret",
        "file",
    )

    monkeypatch.setenv(config.ENV_TOKEN, "gpp_from_env")
    assert config.load().token == "gpp_from_env"
    monkeypatch.delenv(config.ENV_TOKEN)
    # The stored token belongs to the stored portal and is never sent to another one.
    monkeypatch.setenv(config.ENV_URL, "https://elsewhere.example.org")
    assert config.load().token is None
    # Signing out forgets the token and the user, not the portal: a later login may leave out --url.
    assert config.forget() and json.loads(path.read_text()) == {"url": "https://gpus.example.org"}
    assert not config.forget()


def test_https_to_a_plain_http_portal_says_to_use_http(home: Path) -> None:
    """TLS against a server that answers in plain HTTP (the demo) gave the raw
    "[SSL: WRONG_VERSION_NUMBER]"; it now says what to use instead."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{server.server_port}"
        result = run_cli(home, "list", env={"GPUPORTAL_URL": url, "GPUPORTAL_TOKEN": "x"})
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == cli.UNREACHABLE
    said = " ".join(result.stderr.split())
    plain = f"http://127.0.0.1:{server.server_port}"
    assert f"does not answer over TLS; if it serves plain HTTP, use {plain}" in said
    assert "WRONG_VERSION_NUMBER" not in said


def test_expected_failures_give_a_message_and_an_exit_code_not_a_traceback(home: Path) -> None:
    no_login = run_cli(home, "list")
    assert no_login.returncode == cli.AUTH
    assert "not signed in" in no_login.stderr or "no portal URL" in no_login.stderr

    port = free_port()  # nothing listens there
    down = run_cli(home, "list", env={"GPUPORTAL_URL": f"http://127.0.0.1:{port}", "GPUPORTAL_TOKEN": "x"})
    assert down.returncode == cli.UNREACHABLE
    assert "cannot reach" in down.stderr

    bad_id = run_cli(
        home, "status", "abc", env={"GPUPORTAL_URL": "http://127.0.0.1:1", "GPUPORTAL_TOKEN": "x"}
    )
    assert bad_id.returncode == cli.USAGE and "a job id is a number" in bad_id.stderr

    missing = run_cli(
        home, "submit", "no-such.yaml", env={"GPUPORTAL_URL": "http://x", "GPUPORTAL_TOKEN": "x"}
    )
    assert missing.returncode == cli.USAGE and "cannot read no-such.yaml" in missing.stderr

    for result in (no_login, down, bad_id, missing):
        assert "Traceback" not in result.stderr + result.stdout


def test_messages_into_a_file_are_whole_lines(home: Path) -> None:
    """`gpuportal submit --follow 2> log` keeps each message on one line, whatever COLUMNS says."""
    result = run_cli(home, "list", env={"COLUMNS": "30"})
    assert result.returncode == cli.AUTH
    message = "error: no portal URL: run `gpuportal login --url URL` or set GPUPORTAL_URL"
    assert result.stderr.splitlines() == [message], result.stderr


def test_help_lists_every_command_and_the_exit_codes(home: Path) -> None:
    result = run_cli(home, "--help")
    assert result.returncode == 0
    for command in ("login", "submit", "list", "status", "logs", "cancel", "queue", "nodes"):
        assert command in result.stdout
    assert "Exit codes" in result.stdout and "130" in result.stdout


def test_error_bodies_become_one_message_per_field() -> None:
    body = {
        "flavor": ["No flavor named 'xl-A100'."],
        "retries": {"limit": ["Ensure this value is less than or equal to 10."]},
        "mounts": [{}, {"path": ["Give an absolute path."]}],
    }
    assert flatten_errors(body) == {
        "flavor": ["No flavor named 'xl-A100'."],
        "retries.limit": ["Ensure this value is less than or equal to 10."],
        "mounts[1].path": ["Give an absolute path."],
    }
    assert flatten_errors({"detail": "YAML parse error"}) == {"detail": ["YAML parse error"]}


def fake_portal(handler: Any) -> PortalClient:
    return PortalClient("http://portal.test", "gpp_t", transport=httpx.MockTransport(handler))


def test_status_codes_map_to_client_errors() -> None:
    answers = {
        "/api/v1/jobs/1/": (404, {"detail": "No Job matches the given query."}),
        "/api/v1/jobs/2/cancel/": (409, {"detail": "job 2 has already ended"}),
        "/api/v1/me/": (401, {"detail": "Invalid token."}),
        "/api/v1/nodes/": (502, None),
        "/api/v1/jobs/": (400, {"name": ["This field is required."]}),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer gpp_t"
        code, body = answers[request.url.path]
        return httpx.Response(code, json=body) if body is not None else httpx.Response(code)

    with fake_portal(handler) as client:
        with pytest.raises(NotFound):
            client.get_job(1)
        with pytest.raises(Conflict, match="already ended"):
            client.cancel_job(2)
        with pytest.raises(AuthError):
            client.me()
        with pytest.raises(Unreachable):
            client.nodes()
        with pytest.raises(BadRequest) as refused:
            client.submit_job("vc: vision\n")
        assert refused.value.errors == {"name": ["This field is required."]}


def test_lists_follow_the_pages() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        offset = int(request.url.params.get("offset", 0))
        assert request.url.params.get_list("state") == ["pending", "running"]
        results = [
            {"id": i, "name": f"j{i}", "vc": "v", "owner": "o", "state": "pending"}
            for i in range(offset, offset + 2)
        ]
        following = (
            f"http://portal.test/api/v1/jobs/?state=pending&state=running&offset={offset + 2}"
            if offset < 4
            else None
        )
        return httpx.Response(200, json={"count": 6, "next": following, "results": results})

    with fake_portal(handler) as client:
        jobs = client.list_jobs(state=["pending", "running"], limit=None)
        assert [j.id for j in jobs] == [0, 1, 2, 3, 4, 5]
        assert [j.id for j in client.list_jobs(state=["pending", "running"], limit=3)] == [0, 1, 2]


def test_follow_never_shows_a_wait_after_the_event_that_ended_it() -> None:
    """The portal moves on between two requests of one poll: here the job is placed right
    after each read of it. A reason read before the events would show after them."""
    stages = [("pending", "new"), ("scheduled", ""), ("succeeded", "")]
    stage = 0
    now = datetime.now(UTC).isoformat()

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal stage
        path = request.url.path
        if path == "/api/v1/jobs/7/":
            state, reason = stages[stage]
            stage = min(stage + 1, len(stages) - 1)
            job = {"id": 7, "name": "j", "vc": "v", "owner": "o", "state": state, "pending_reason": reason}
            return httpx.Response(200, json=job)
        assert path == "/api/v1/jobs/7/events/", path
        offset = int(request.url.params["offset"])
        happened = [
            {"id": i + 1, "created_at": now, "to_state": to_state} for i, (to_state, _) in enumerate(stages)
        ][: stage + 1]
        return httpx.Response(200, json={"count": len(happened), "next": None, "results": happened[offset:]})

    with fake_portal(handler) as client:
        seen = [
            (
                "job" if isinstance(item, JobDetail) else "event",
                item.state if isinstance(item, JobDetail) else item.to_state,
            )
            for item in client.follow_logs(7, poll_s=0, events=True)
            if not isinstance(item, LogLine)
        ]
    assert seen.index(("job", "pending")) < seen.index(("event", "scheduled")), seen
    assert seen[-2:] == [("job", "succeeded"), ("event", "succeeded")], seen
    assert [s for kind, s in seen if kind == "event"] == ["pending", "scheduled", "succeeded"], seen


def test_follow_tells_the_end_after_the_output_that_trails_it() -> None:
    """The agent may deliver a job's last lines after its final status: they come before the
    event that ended the job, not after it."""
    polls = 0
    now = datetime.now(UTC).isoformat()
    attempt = {"number": 1, "state": "running"}

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal polls
        path = request.url.path
        if path == "/api/v1/jobs/7/events/":
            offset = int(request.url.params["offset"])
            happened = [{"id": 1, "created_at": now, "to_state": "running"}]
            if polls >= 1:
                happened.append({"id": 2, "created_at": now, "to_state": "succeeded"})
            return httpx.Response(
                200, json={"count": len(happened), "next": None, "results": happened[offset:]}
            )
        if path == "/api/v1/jobs/7/":
            polls += 1
            state = "running" if polls == 1 else "succeeded"
            job = {"id": 7, "name": "j", "vc": "v", "owner": "o", "state": state, "attempts": [attempt]}
            return httpx.Response(200, json=job)
        assert path == "/api/v1/jobs/7/logs/", path
        lines = [{"id": 1, "attempt": 1, "text": "first"}]
        if polls >= 3:  # the last line lands after the job was seen to end
            lines.append({"id": 2, "attempt": 1, "text": "last"})
        after = int(request.url.params.get("after", 0))
        return httpx.Response(
            200, json={"count": 2, "next": None, "results": [ln for ln in lines if ln["id"] > after]}
        )

    with fake_portal(handler) as client:
        seen = [
            item.text if isinstance(item, LogLine) else item.to_state
            for item in client.follow_logs(7, poll_s=0, events=True)
            if not isinstance(item, JobDetail)
        ]
    assert seen == ["running", "first", "last", "succeeded"], seen


def test_relative_times_read_like_a_queue() -> None:
    now = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
    assert cli.relative(now + timedelta(minutes=5, seconds=3), now) == "in 5m"
    assert cli.relative(now - timedelta(hours=2, minutes=7), now) == "2h07m ago"
    assert cli.relative(now + timedelta(seconds=20), now) == "in 20s"
    assert cli.relative(None, now) == "-"


def test_estimated_starts_on_another_day_name_the_day() -> None:
    now = datetime.now(UTC)
    later_today = now.astimezone().replace(hour=23, minute=59, second=0, microsecond=0)
    assert cli.wall_time(later_today, now) == "23:59"
    two_weeks = (now + timedelta(days=14)).astimezone()
    assert cli.wall_time(two_weeks, now) == two_weeks.strftime("%b %d %H:%M")
    assert two_weeks.strftime("%H:%M") != cli.wall_time(two_weeks, now)


def test_gpu_indices_read_as_ranges() -> None:
    assert cli.index_ranges([3, 0, 1, 2, 6]) == "0-3,6"
    assert cli.index_ranges(list(range(8))) == "0-7"
    assert cli.index_ranges([5]) == "5"
    assert cli.index_ranges([]) == ""


def test_starts_after_says_what_the_jobs_it_waits_for_must_do() -> None:
    def job(after: list[int], **extra: Any) -> Job:
        return Job(id=9, name="j", vc="v", owner="o", state="pending", after=after, **extra)

    assert cli.after_text(job([4])) == "succeeded"  # a portal that sends no after_type
    assert cli.after_text(job([4, 5], after_type="ok")) == "succeeded"
    assert cli.after_text(job([4, 5], after_type="any")) == "ended"
    assert cli.after_text(job([4], after_type="notok")) == "ended, if it did not succeed"
    assert cli.after_text(job([4, 5], after_type="notok")) == "ended, if one did not succeed"
    assert cli.after_text(job([4], after_type="later")) == "(after_type later)"


def test_a_dry_run_verdict_reads_as_one_line() -> None:
    now = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
    starts = DryRun(would_start_now=True, placement="a100-node-1:0,1; a100-node-2:0,1", borrowed_gpus=2)
    assert cli.verdict_line(starts, now) == (
        "would start now on a100-node-1:0,1; a100-node-2:0,1 (2 GPUs borrowed beyond its VC's guarantee: "
        "preemptible)"
    )
    later = now + timedelta(hours=2, minutes=10)
    waits = DryRun(would_start_now=False, reason="vc-quota", message="VC v: 16 of 8", estimated_start=later)
    assert cli.verdict_line(waits.model_copy(update={"queue_position": 3}), now) == (
        "would wait: vc-quota, VC v: 16 of 8; position 3; "
        f"estimated start {cli.wall_time(later, now)} (in 2h10m)"
    )
    message = "Waiting for job 4 (pending) to succeed."
    blocked = DryRun(would_start_now=False, reason="dependency", message=message)
    assert cli.verdict_line(blocked, now) == (
        "would wait: dependency, Waiting for job 4 (pending) to succeed; no estimated start"
    )


def test_a_vcs_monthly_budget_reads_as_hours_used_of_it() -> None:
    november = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    # A portal without budgets sends none of the fields: the VC has no budget.
    older = VirtualCluster.model_validate({"id": 1, "name": "vision", "quotas": []})
    assert (older.gpu_hours_per_month, older.gpu_hours_this_month, older.budget_spent) == (None, 0.0, False)
    assert cli.budget_cell(older) == "-"
    assert cli.budget_text(older, november) == "none"

    used = VirtualCluster(id=1, name="vision", gpu_hours_per_month=1000, gpu_hours_this_month=812.44)
    assert cli.budget_cell(used) == "812.4 / 1,000 GPU-h"
    assert cli.budget_text(used, november) == "812.4 of 1,000 GPU-hours used in November (UTC)"

    spent = used.model_copy(update={"gpu_hours_this_month": 1002.5, "budget_spent": True})
    assert cli.budget_cell(spent) == "1,002.5 / 1,000 GPU-h, spent"
    assert cli.budget_text(spent, november) == (
        "1,002.5 of 1,000 GPU-hours used in November (UTC): spent, none of its jobs starts until 2026-12-01"
        " or until an admin raises it; running ones go on"
    )


def test_spent_budgets_start_over_on_the_first_of_the_next_month_in_utc() -> None:
    assert cli.next_month_start(datetime(2026, 11, 20, 12, 0, tzinfo=UTC)) == date(2026, 12, 1)
    assert cli.next_month_start(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == date(2027, 1, 1)
    # 20:00 on 30 November in New York is 1 December in UTC.
    new_york = timezone(timedelta(hours=-5))
    assert cli.next_month_start(datetime(2026, 11, 30, 20, 0, tzinfo=new_york)) == date(2027, 1, 1)


def cli_against(monkeypatch: pytest.MonkeyPatch, handler: Any) -> list[httpx.Request]:
    """Every PortalClient the CLI makes answers from `handler`; returns the requests it sent."""
    sent: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return handler(request)

    real_init = PortalClient.__init__

    def init(self: PortalClient, url: str, token: str | None = None, **options: Any) -> None:
        real_init(self, url, token, **{**options, "transport": httpx.MockTransport(recording)})

    monkeypatch.setattr(PortalClient, "__init__", init)
    return sent


def test_followed_output_goes_to_stdout_while_the_spinner_is_on_a_terminal(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpuportal logs 7 -f > out.txt` in a terminal: stderr is the terminal (the spinner),
    stdout a file, and the job's output belongs in the file."""
    polls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal polls
        path = request.url.path
        if path == "/api/v1/jobs/7/":
            polls += 1
            job = {
                "id": 7,
                "name": "j",
                "vc": "v",
                "owner": "o",
                "state": "running" if polls < 2 else "succeeded",
            }
            return httpx.Response(200, json={**job, "attempts": [{"number": 1, "state": "running"}]})
        if path == "/api/v1/jobs/7/events/":
            return httpx.Response(200, json={"count": 0, "next": None, "results": []})
        assert path == "/api/v1/jobs/7/logs/", path
        lines = [] if request.url.params.get("after") else [{"id": 1, "attempt": 1, "text": "epoch 1 done"}]
        return httpx.Response(200, json={"count": len(lines), "next": None, "results": lines})

    cli_against(monkeypatch, handler)
    monkeypatch.setenv(config.ENV_URL, "http://portal.test")
    monkeypatch.setenv(config.ENV_TOKEN, "gpp_t")
    terminal = io.StringIO()
    real_init = cli.Context.__init__

    def on_a_terminal(self: cli.Context, args: Any) -> None:
        real_init(self, args)
        self.err = Console(file=terminal, force_terminal=True, width=80, highlight=False)

    monkeypatch.setattr(cli.Context, "__init__", on_a_terminal)
    assert cli.main(["logs", "7", "-f", "--poll", "0"]) == cli.OK
    assert capsys.readouterr().out == "epoch 1 done\n"
    assert "epoch 1 done" not in terminal.getvalue()
    assert "Job 7" in terminal.getvalue()  # the outcome, on the terminal


class Screen:
    """A terminal's screen, which stdout and stderr both write to: block-buffered as into a
    pipe, what a stream holds reaches the screen only when it is flushed."""

    def __init__(self) -> None:
        self.shown: list[tuple[str, str]] = []

    def stream(self, name: str) -> Any:
        screen = self

        class Stream(io.StringIO):
            def flush(self) -> None:
                lines = self.getvalue().splitlines()
                screen.shown += [(name, line) for line in lines]
                self.seek(0)
                self.truncate()

            def isatty(self) -> bool:
                return False

        return Stream()


JOB_OUTPUT = [
    ("stdout", "loading data"),
    ("stderr", "warning: no GPU peer access"),
    ("stdout", "step 1 loss 2.31"),
    ("stderr", "error: loss is NaN"),
    ("stdout", "saving checkpoint"),
]


@pytest.mark.parametrize("follow", [False, True], ids=["logs", "logs -f"])
def test_job_output_comes_out_whole_and_in_order_on_stdout(
    home: Path, monkeypatch: pytest.MonkeyPatch, follow: bool
) -> None:
    """The portal lists an attempt's stdout and stderr lines together, in the order it received
    them: all of them go to the command's standard output (`logs 7 > out.txt` keeps every line),
    each flushed at once, so that on a screen the command's own messages on standard error never
    overtake a line of output printed before them."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/v1/jobs/7/":
            job = {"id": 7, "name": "j", "vc": "v", "owner": "o", "state": "failed"}
            return httpx.Response(200, json={**job, "attempts": [{"number": 1, "state": "failed"}]})
        if path == "/api/v1/jobs/7/events/":
            return httpx.Response(200, json={"count": 0, "next": None, "results": []})
        assert path == "/api/v1/jobs/7/logs/", path
        lines = [
            {"id": seq + 10, "attempt": 1, "stream": stream, "seq": seq, "text": text}
            for seq, (stream, text) in enumerate(JOB_OUTPUT)
        ]
        page = [] if request.url.params.get("after") else lines
        return httpx.Response(200, json={"count": len(page), "next": None, "results": page})

    cli_against(monkeypatch, handler)
    monkeypatch.setenv(config.ENV_URL, "http://portal.test")
    monkeypatch.setenv(config.ENV_TOKEN, "gpp_t")
    screen = Screen()
    monkeypatch.setattr(sys, "stdout", screen.stream("stdout"))
    monkeypatch.setattr(sys, "stderr", screen.stream("stderr"))
    args = ["logs", "7", "-f", "--poll", "0"] if follow else ["logs", "7"]
    assert cli.main(args) == (cli.JOB_FAILED if follow else cli.OK)
    job_lines = [shown for shown in screen.shown if shown[1] in {text for _, text in JOB_OUTPUT}]
    assert job_lines == [("stdout", text) for _, text in JOB_OUTPUT]


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("running", "Job 7 (running) has printed nothing yet."),
        ("succeeded", "Job 7 (succeeded) printed nothing."),
    ],
)
def test_logs_of_a_job_that_printed_nothing_say_so_on_stderr(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], state: str, said: str
) -> None:
    """Silence looked like a broken command; the note goes to stderr, so a redirect of stdout
    still holds exactly the job's output (none)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/jobs/7/":
            job = {"id": 7, "name": "j", "vc": "v", "owner": "o", "state": state}
            return httpx.Response(200, json={**job, "attempts": [{"number": 1, "state": state}]})
        assert request.url.path == "/api/v1/jobs/7/logs/", request.url.path
        return httpx.Response(200, json={"count": 0, "next": None, "results": []})

    cli_against(monkeypatch, handler)
    monkeypatch.setenv(config.ENV_URL, "http://portal.test")
    monkeypatch.setenv(config.ENV_TOKEN, "gpp_t")
    assert cli.main(["logs", "7"]) == cli.OK
    out, err = capsys.readouterr()
    assert out == ""
    assert said in " ".join(err.split())


def redirect_to_https(request: httpx.Request) -> httpx.Response:
    return httpx.Response(301, headers={"Location": f"https://gpus.example.org{request.url.path}"})


@pytest.mark.parametrize(
    ("args", "answer", "words"),
    [
        (["whoami"], redirect_to_https, "use that URL, gpuportal login --url https://gpus.example.org"),
        (
            ["list"],
            lambda r: httpx.Response(200, text="<html>sign in</html>", headers={"Content-Type": "text/html"}),
            "is not the portal's API (HTTP 200, text/html): is http://gpus.example.org the portal?",
        ),
        (
            ["list"],
            lambda r: httpx.Response(200, json={"hello": "world"}),
            "is not a page of the portal's API",
        ),
        (
            ["whoami"],
            lambda r: httpx.Response(200, json={"hello": "world"}),
            "does not read as a Me: username",
        ),
    ],
    ids=["redirect", "html", "json-not-a-page", "json-not-a-resource"],
)
def test_an_answer_that_is_not_the_portals_api_is_one_line(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    answer: Any,
    words: str,
) -> None:
    """A proxy that redirects http:// to https://, a sign-in page or another server at the URL:
    one line that says so, never a traceback (a crash on a None body or a pydantic report)."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, answer)
    assert cli.main(args) == cli.UNREACHABLE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and words in err, err


def test_login_to_a_url_that_redirects_says_which_url_to_use(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent = cli_against(monkeypatch, redirect_to_https)
    monkeypatch.setattr("sys.stdin", io.StringIO("alice-pass\n"))
    code = cli.main(["login", "--url", "http://gpus.example.org", "-u", "alice", "--password-stdin"])
    assert code == cli.UNREACHABLE
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: http://gpus.example.org redirects to https://gpus.example.org/api/v1/session/ (HTTP 301):"
        " use that URL, gpuportal login --url https://gpus.example.org"
    ]
    assert [r.url.host for r in sent] == ["gpus.example.org"]  # the redirect was not followed
    assert not (home / ".config" / "gpuportal" / "config.json").exists()


def test_login_replaces_a_config_file_it_cannot_read(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = home / ".config" / "gpuportal" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text("")  # say, half-written in a crash
    cli_against(monkeypatch, lambda r: httpx.Response(200, json={"username": "alice", "memberships": []}))
    assert cli.main(["login", "--url", "http://gpus.example.org", "--token", "gpp_new"]) == cli.OK
    assert "warning: cannot read" in capsys.readouterr().err
    assert json.loads(path.read_text()) == {
        "url": "http://gpus.example.org",
        "token": "gpp_new",
        "username": "alice",
    }


def test_the_config_file_reaches_the_disk_before_it_replaces_the_old_one(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(config.os, "fsync", lambda fd: (steps.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(config.os, "replace", lambda a, b: (steps.append("replace"), real_replace(a, b))[1])
    config.save("https://gpus.example.org", "gpp_t", "alice")
    assert steps == ["fsync", "replace"]


def test_logout_keeps_the_url_for_the_next_login(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config.save("https://gpus.example.org", "gpp_old", "alice")
    assert cli.main(["logout"]) == cli.OK
    assert json.loads(path.read_text()) == {"url": "https://gpus.example.org"}
    assert cli.main(["whoami"]) == cli.AUTH  # not signed in any more
    sent = cli_against(
        monkeypatch, lambda r: httpx.Response(200, json={"username": "alice", "memberships": []})
    )
    assert cli.main(["login", "--token", "gpp_new"]) == cli.OK  # no --url: it was remembered
    assert [str(r.url) for r in sent] == ["https://gpus.example.org/api/v1/me/"]
    assert "No stored token." not in capsys.readouterr().err


def test_pages_are_read_from_the_configured_portal_whatever_next_says() -> None:
    """Behind a proxy the portal may build `next` as http:// or with its own host name: only
    the link's path and query are used, so the token never leaves the configured https:// URL."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.url.scheme, request.url.host) == ("https", "gpus.example.org"), request.url
        if request.url.params.get("offset") == "1":
            return httpx.Response(
                200, json={"count": 2, "next": None, "results": [{"id": 2, "name": "n2", "state": "ready"}]}
            )
        following = "http://internal-host:8000/api/v1/nodes/?limit=1&offset=1"
        return httpx.Response(
            200, json={"count": 2, "next": following, "results": [{"id": 1, "name": "n1", "state": "ready"}]}
        )

    with PortalClient("https://gpus.example.org", "gpp_t", transport=httpx.MockTransport(handler)) as client:
        assert [n.name for n in client.nodes()] == ["n1", "n2"]


def test_pages_of_a_portal_under_a_path_prefix_stay_under_it() -> None:
    """A proxy serves the portal under /gpu/ and strips it: the portal's `next` lacks the prefix,
    and the client keeps the list's own path under the configured URL, with the link's query."""
    asked: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url)
        assert request.url.path == "/gpu/api/v1/nodes/", request.url
        if request.url.params.get("offset") == "1":
            return httpx.Response(
                200, json={"count": 2, "next": None, "results": [{"id": 2, "name": "n2", "state": "ready"}]}
            )
        following = "https://gpus.example.org/api/v1/nodes/?limit=1&offset=1&state=ready&state=cordoned"
        return httpx.Response(
            200, json={"count": 2, "next": following, "results": [{"id": 1, "name": "n1", "state": "ready"}]}
        )

    with PortalClient(
        "https://gpus.example.org/gpu", "gpp_t", transport=httpx.MockTransport(handler)
    ) as client:
        assert [n.name for n in client.nodes()] == ["n1", "n2"]
    assert asked[1].params.get_list("state") == ["ready", "cordoned"]


def test_templates_save_names_a_yaml_date_instead_of_crashing(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config.save("http://gpus.example.org", "gpp_t", "alice")
    refusal = "TRANSFORMERS_VERSION must be text, not the number 4.4: in YAML put the value in quotes."
    sent = cli_against(
        monkeypatch,
        lambda r: httpx.Response(400, json={"spec": {"env": {"TRANSFORMERS_VERSION": [refusal]}}}),
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: nightly\nvc: vision\nflavor: s-A100\ncommand: echo hi\nenv:\n  RUN_DATE: 2026-01-01\n"
    )
    assert cli.main(["templates", "save", "nightly", str(spec)]) == cli.USAGE
    err = capsys.readouterr().err
    assert (
        "spec.env.RUN_DATE: RUN_DATE must be text, not the date 2026-01-01: in YAML put the value in quotes."
        in err
    )
    assert not sent  # refused before anything was sent

    spec.write_text(
        "name: nightly\nvc: vision\nflavor: s-A100\ncommand: echo hi\nenv:\n  TRANSFORMERS_VERSION: 4.40\n"
    )
    assert cli.main(["templates", "save", "nightly", str(spec)]) == cli.USAGE
    assert f"spec.env.TRANSFORMERS_VERSION: {refusal}" in capsys.readouterr().err  # the portal's words


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["list", "--limit", "0"], "argument --limit: the limit is a whole number from 1, not '0'"),
        (["list", "--limit", "-3"], "the limit is a whole number from 1, not '-3'"),
        (["status", "7", "--events", "-1"], "the number of events is a whole number from 0, not '-1'"),
        (["logs", "7", "--attempt", "0"], "an attempt is a whole number from 1, not '0'"),
        (
            ["login", "--url", "http://gpus.example.org", "--expires-in-days", "-1"],
            "a token's lifetime in days is a whole number from 0, not '-1'",
        ),
    ],
    ids=["limit-0", "limit-negative", "events-negative", "attempt-0", "expiry-negative"],
)
def test_counts_out_of_range_are_refused_before_anything_is_sent(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
) -> None:
    """`list --limit 0` listed one job and `status --events -1` all but the first event (a
    slice from the end); `login --expires-in-days -1` signed in with the password before the
    portal refused the lifetime. Each is a usage error now, named by its option."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    sent = cli_against(monkeypatch, lambda r: httpx.Response(500))
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == cli.USAGE
    assert words in capsys.readouterr().err
    assert not sent


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (
            "gpus.example.org",
            "gpus.example.org is not a portal URL: give it with http:// or https://, e.g."
            " https://gpus.example.org",
        ),
        ("10.0.0.7:8000", "e.g. https://10.0.0.7:8000"),
        (
            "127.0.0.1:8000",
            "127.0.0.1:8000 is not a portal URL: give it with http:// or https://, e.g."
            " http://127.0.0.1:8000",
        ),
        ("127.3.2.1:8000/", "e.g. http://127.3.2.1:8000"),
        ("localhost:8000", "e.g. http://localhost:8000"),
        ("[::1]:8000", "e.g. http://[::1]:8000"),
        (
            "https://gpus.example.org/api/v1",
            "https://gpus.example.org/api/v1 is the address of the portal's API, not the portal's: give the"
            " portal's base URL, the address its web app opens at, e.g. gpuportal login --url"
            " https://gpus.example.org",
        ),
        ("http://127.0.0.1:8000/api/v1/", "e.g. gpuportal login --url http://127.0.0.1:8000"),
        ("127.0.0.1:8000/api/v1", "e.g. gpuportal login --url http://127.0.0.1:8000"),
    ],
)
def test_login_refuses_a_url_that_is_not_the_portals_base_url_before_sending_anything(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, words: str
) -> None:
    """A URL without its scheme was "cannot reach ...: Request URL is missing an 'http://' or
    'https://' protocol" (exit 5), and then suggested https:// for a development server on this
    machine, which speaks plain HTTP; the API's own path given as the portal's was "error: not
    found" (exit 3), then exit 5 after a request. Both are mistakes in what was typed: exit 2,
    before any request, with the URL to give."""
    sent = cli_against(monkeypatch, lambda r: httpx.Response(404, json={"detail": "Not found."}))
    assert cli.main(["login", "--url", url, "--token", "gpp_t"]) == cli.USAGE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and words in err, err
    assert not sent
    assert not config.config_path().exists()  # nothing stored


def test_login_to_a_url_without_the_portals_api_says_which_url_to_give(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL that answers 404 where the API should be is not the portal's address (exit 5)."""
    cli_against(monkeypatch, lambda r: httpx.Response(404, json={"detail": "Not found."}))
    code = cli.main(["login", "--url", "https://gpus.example.org/portal", "--token", "gpp_t"])
    assert code == cli.UNREACHABLE
    err = capsys.readouterr().err
    assert "https://gpus.example.org/portal is not the portal's address" in err
    assert not config.config_path().exists()


def test_logout_without_a_token_says_only_that(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["logout"]) == cli.OK
    assert capsys.readouterr().err.splitlines() == ["No stored token."]  # no token to revoke


def test_a_refused_spec_from_stdin_is_named_so(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, lambda r: httpx.Response(400, json={"flavor": ["No flavor named 'x'."]}))
    monkeypatch.setattr(sys, "stdin", io.StringIO("name: a\nvc: vision\nflavor: x\ncommand: echo\n"))
    assert cli.main(["submit", "-"]) == cli.USAGE
    err = capsys.readouterr().err
    assert "error: the portal refused the job spec in standard input" in err
    assert "flavor: No flavor named 'x'." in err


def test_templates_save_tells_a_refused_name_from_a_refused_spec(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A name already used is the template's fault, not the file's: it read "the spec in
    job.yaml was refused"."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    answers = iter(
        [
            {"name": ["You already have a template named 'train'."]},
            {"spec": {"vc": ["No virtual cluster named 'nope' that you can submit to."]}},
        ]
    )
    cli_against(monkeypatch, lambda r: httpx.Response(400, json=next(answers)))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\nvc: vision\nflavor: s-A100\ncommand: echo\n")

    assert cli.main(["templates", "save", "train", str(spec)]) == cli.USAGE
    err = capsys.readouterr().err
    assert "error: template train not saved: the portal refused it" in err
    assert "name: You already have a template named 'train'." in err
    assert "the spec in" not in err

    assert cli.main(["templates", "save", "train", str(spec)]) == cli.USAGE
    err = capsys.readouterr().err
    assert f"error: template train not saved: the spec in {spec} was refused" in err
    assert "spec.vc: No virtual cluster named 'nope' that you can submit to." in err


# What the portal answers to each change the CLI makes, for the commands' confirmations.
CHANGED_JOB = {"id": 7, "name": "train", "vc": "vision", "owner": "alice", "state": "pending"}
HOOK = {
    "id": 3,
    "url": "https://hooks.example.org/h",
    "format": "slack",
    "last_delivery_at": "2026-01-01T00:00:00Z",
    "last_delivery_status": 200,
    "last_delivery_ok": True,
}
TEMPLATE = {
    "id": 5,
    "name": "train",
    "spec": {"name": "a", "vc": "vision", "flavor": "s-A100", "command": "echo"},
    "owner": "alice",
    "tenant": "vision",
    "shared": True,
}


def portal_of_changes(request: httpx.Request) -> httpx.Response:
    method, path = request.method, request.url.path.removeprefix("/api/v1")
    if method == "DELETE":
        return httpx.Response(204)
    if path == "/me/":
        return httpx.Response(200, json={"username": "alice", "memberships": []})
    if path.startswith("/jobs/"):
        return httpx.Response(201 if path == "/jobs/" else 200, json=CHANGED_JOB)
    if path.startswith("/webhooks/"):
        return httpx.Response(200, json=HOOK)
    if path == "/templates/" and method == "GET":
        return httpx.Response(200, json={"count": 1, "next": None, "results": [TEMPLATE]})
    if path == "/templates/":
        return httpx.Response(201, json=TEMPLATE)
    assert path.startswith("/tenants/vision/members/"), (method, path)
    return httpx.Response(200, json={"username": "carol", "role": "admin" if method == "PATCH" else "viewer"})


# Every command that changes something, with its confirmation.
CHANGES = [
    (["login", "--token", "gpp_t"], "Signed in to http://gpus.example.org as alice: no tenant."),
    (["logout"], "Stored token removed; the portal's URL is kept."),
    (["submit", "job.yaml"], "Submitted job 7 train to VC vision"),
    (["cancel", "7"], "Job 7 train: pending."),
    (["top", "7"], "Job 7 train goes before alice's other pending jobs in vision"),
    (["hold", "7"], "Job 7 train is held: it does not start until released."),
    (["release", "7"], "Job 7 train is released: it may start from the next scheduling cycle."),
    (["time-limit", "7", "2h"], "Job 7 train: its time limit is now 2h per attempt."),
    (
        ["templates", "save", "train", "job.yaml", "--shared"],
        "Template train saved, shared with tenant vision.",
    ),
    (["templates", "delete", "train"], "Template alice/train deleted."),
    (["webhooks", "add", "https://hooks.example.org/h"], "Webhook 3 added: https://hooks.example.org/h."),
    (["webhooks", "test", "3"], "Test delivered to https://hooks.example.org/h: ok, HTTP 200"),
    (["webhooks", "remove", "3"], "Webhook 3 removed."),
    (["members", "add", "vision", "carol", "--role", "viewer"], "Added carol to vision as a viewer."),
    (["members", "set-role", "vision", "carol", "admin"], "carol is now an admin of vision."),
    (["members", "remove", "vision", "carol"], "Removed carol from vision."),
]


@pytest.mark.parametrize(("args", "message"), CHANGES, ids=[" ".join(args[:2]) for args, _ in CHANGES])
def test_state_changes_are_reported_on_stderr_and_leave_stdout_empty(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    """docs/cli.md: tables go to stdout, state changes to stderr. `templates save`, `members
    add` and the other changes of templates, webhooks and members printed theirs on stdout,
    where a script reading the command's output took it for data."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, portal_of_changes)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: a\nvc: vision\nflavor: s-A100\ncommand: echo\n")
    assert cli.main(args) == cli.OK
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


@pytest.mark.parametrize(
    "args",
    [
        ["templates", "save", "train", "job.yaml", "-o", "json"],
        ["webhooks", "add", "https://hooks.example.org/h", "-o", "json"],
        ["webhooks", "test", "3", "-o", "json"],
        ["members", "add", "vision", "carol", "-o", "json"],
        ["members", "set-role", "vision", "carol", "admin", "-o", "json"],
        ["submit", "job.yaml", "-o", "json"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_changes_asked_for_as_json_print_only_the_json_on_stdout(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    args: list[str],
) -> None:
    """Data a script reads stays on stdout, and nothing else is mixed into it."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, portal_of_changes)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: a\nvc: vision\nflavor: s-A100\ncommand: echo\n")
    assert cli.main(args) == cli.OK
    assert isinstance(json.loads(capsys.readouterr().out), dict)


def test_data_to_pipe_stays_on_stdout(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`templates show NAME > job.yaml` and `ID=$(gpuportal submit job.yaml -q)` read stdout."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, portal_of_changes)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: a\nvc: vision\nflavor: s-A100\ncommand: echo\n")
    assert cli.main(["templates", "show", "train"]) == cli.OK
    shown = capsys.readouterr()
    assert (yaml.safe_load(shown.out), shown.err) == (TEMPLATE["spec"], "")
    assert cli.main(["submit", "job.yaml", "-q"]) == cli.OK
    assert capsys.readouterr() == ("7\n", "")


# -- signing in with a password -----------------------------------------------------------


def test_an_empty_password_on_stdin_is_refused_before_anything_is_sent(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`login --password-stdin < /dev/null` signed in with an empty password, and the portal's
    refusal read "the portal refused the request" (exit 4)."""
    sent = cli_against(monkeypatch, lambda r: httpx.Response(500))
    for stdin in ("", "\n"):
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = cli.main(["login", "--url", "http://127.0.0.1:8000", "-u", "alice", "--password-stdin"])
        assert code == cli.USAGE
        assert capsys.readouterr().err == "error: no password on standard input\n"
    assert not sent


def sign_in_refused(body: dict[str, Any]) -> Any:
    """A portal that sets the CSRF cookie and refuses every sign-in with `body` (HTTP 400)."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/session/", request.url
        if request.method == "GET":
            return httpx.Response(204, headers={"Set-Cookie": "csrftoken=c; Path=/"})
        return httpx.Response(400, json=body)

    return handler


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"detail": "Wrong user name or password."}, "error: Wrong user name or password."),
        (
            {"password": ["This field may not be blank."]},
            "error: the portal refused the sign-in: password: This field may not be blank.",
        ),
        (
            {"username": ["Ensure this field has no more than 150 characters."], "password": ["Too long."]},
            "error: the portal refused the sign-in: username: Ensure this field has no more than 150"
            " characters.; password: Too long.",
        ),
    ],
    ids=["detail", "one-field", "two-fields"],
)
def test_a_refused_sign_in_shows_the_portals_message(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    body: dict[str, Any],
    message: str,
) -> None:
    """A refusal that named a field (not `detail`) read "the portal refused the request"."""
    cli_against(monkeypatch, sign_in_refused(body))
    monkeypatch.setattr(sys, "stdin", io.StringIO("alice-pass\n"))
    code = cli.main(["login", "--url", "http://127.0.0.1:8000", "-u", "alice", "--password-stdin"])
    assert code == cli.AUTH
    assert capsys.readouterr().err.splitlines() == [message]
    assert not config.config_path().exists()


# -- job events ---------------------------------------------------------------------------

EVENT_TIME = datetime(2026, 11, 22, 9, 31, 51, tzinfo=UTC)
RELEASED = "released: it may start again, from its checkpoint at step 9"


def event(to_state: str, reason: str, actor: str, from_state: str = "") -> dict[str, Any]:
    return {
        "id": 1,
        "created_at": EVENT_TIME.isoformat(),
        "from_state": from_state,
        "to_state": to_state,
        "actor_label": actor,
        "reason": reason,
    }


def test_events_without_a_change_of_state_read_as_what_happened(capsys: pytest.CaptureFixture[str]) -> None:
    """A release (no state: to_state "") read `job 36  (released: ...) by alice`, two spaces
    where the state goes; an event that leaves the state as it was repeated it as if it were
    a transition."""
    ctx = cli.Context(cli.build_parser().parse_args(["status", "36"]))
    when = EVENT_TIME.astimezone().strftime("%H:%M:%S")
    for shown in (
        event("", RELEASED, "alice"),
        event("running", "time limit in 10 minutes", "scheduler", from_state="running"),
        event("scheduled", "placed on a100-node-1:0,1", "scheduler", from_state="pending"),
        event("", "", ""),
    ):
        cli.report_event(ctx, 36, JobEvent.model_validate(shown))
    assert capsys.readouterr().err.splitlines() == [
        f"{when} job 36: {RELEASED} (by alice)",
        f"{when} job 36: time limit in 10 minutes (by scheduler)",
        f"{when} job 36 scheduled (placed on a100-node-1:0,1) by scheduler",
        f"{when} job 36: an event with no reason given",
    ]


def test_status_shows_no_blank_state_for_an_event_without_one(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [event("pending", "submitted", "alice"), event("", RELEASED, "alice")]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/jobs/36/events/":
            return httpx.Response(200, json={"count": 2, "next": None, "results": events})
        assert request.url.path == "/api/v1/jobs/36/", request.url
        return httpx.Response(
            200, json={"id": 36, "name": "j", "vc": "v", "owner": "alice", "state": "pending"}
        )

    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, handler)
    assert cli.main(["status", "36"]) == cli.OK
    out = capsys.readouterr().out
    rows = [line.split() for line in out[out.index("TIME  ") :].splitlines()[1:]]
    assert [row[2:5] for row in rows] == [["-", "pending", "alice"], ["-", "-", "alice"]]


# -- flavors and priority classes ---------------------------------------------------------

FLAVORS = [
    {
        "id": 1,
        "name": "s-A100",
        "gpu_model": "A100",
        "gpus": 2,
        "cpu": 64,
        "memory_gb": 256,
        "max_runtime_hours": 72,
    },
    {
        "id": 4,
        "name": "l-A100",
        "gpu_model": "A100",
        "gpus": 8,
        "cpu": 256,
        "memory_gb": 1024,
        "max_runtime_hours": 336,
    },
]
PRIORITY_CLASSES = [
    {
        "id": 1,
        "name": "production",
        "value": 1000,
        "preemptible": False,
        "is_default": False,
        "tenant_admins_only": True,
        "description": "Serving and deadline work; never preempted. [Tenant admins only.]",
    },
    {
        "id": 2,
        "name": "training",
        "value": 500,
        "preemptible": True,
        "is_default": True,
        "tenant_admins_only": False,
        "description": "Regular training jobs.",
    },
]


def catalog(flavors: list[dict[str, Any]], classes: list[dict[str, Any]]) -> Any:
    """A portal whose flavors and priority classes are these, one page each."""

    def handler(request: httpx.Request) -> httpx.Response:
        found = {"/api/v1/flavors/": flavors, "/api/v1/priority-classes/": classes}[request.url.path]
        return httpx.Response(200, json={"count": len(found), "next": None, "results": found})

    return handler


def test_flavors_lists_what_a_spec_may_name(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Users curled /api/v1/flavors/ to learn what `flavor:` takes."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    sent = cli_against(monkeypatch, catalog(FLAVORS, PRIORITY_CLASSES))
    assert cli.main(["flavors"]) == cli.OK
    shown = capsys.readouterr()
    assert shown.err == ""
    assert shown.out.splitlines() == [
        "FLAVOR  MODEL  GPUS  CPUS  MEMORY GB  MAX TIME LIMIT",
        "s-A100  A100      2    64        256             72h",
        "l-A100  A100      8   256       1024            336h",
    ]
    assert cli.main(["flavors", "-o", "json"]) == cli.OK
    assert json.loads(capsys.readouterr().out) == FLAVORS
    assert [str(r.url) for r in sent] == ["http://gpus.example.org/api/v1/flavors/?limit=200"] * 2


def test_priority_classes_lists_what_a_spec_may_name(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Users curled /api/v1/priority-classes/ to learn what `priority:` takes."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, catalog(FLAVORS, PRIORITY_CLASSES))
    assert cli.main(["priority-classes"]) == cli.OK
    shown = capsys.readouterr()
    assert shown.err == ""
    assert [line.rstrip() for line in shown.out.splitlines()] == [
        "PRIORITY    VALUE  PREEMPTIBLE  ADMINS ONLY  DEFAULT  DESCRIPTION",
        "production   1000  no           yes          no       Serving and deadline work; never preempted."
        " [Tenant admins only.]",
        "training      500  yes          no           yes      Regular training jobs.",
    ]
    assert cli.main(["priority-classes", "-o", "json"]) == cli.OK
    assert json.loads(capsys.readouterr().out) == PRIORITY_CLASSES


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("flavors", "No flavors: a cluster admin has defined none, so no job can be submitted."),
        ("priority-classes", "No priority classes: a cluster admin has defined none."),
    ],
)
def test_an_empty_catalog_says_so(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, words: str
) -> None:
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, catalog([], []))
    assert cli.main([command]) == cli.OK
    assert capsys.readouterr() == ("", words + "\n")
    assert cli.main([command, "-o", "json"]) == cli.OK
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize("command", ["flavors", "priority-classes", "vcs"])
def test_a_refused_catalog_exits_as_any_list_does(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, lambda r: httpx.Response(401, json={"detail": "Invalid token."}))
    assert cli.main([command]) == cli.AUTH
    assert capsys.readouterr() == ("", "error: Invalid token.\nSign in again with `gpuportal login`.\n")


def test_help_lists_flavors_and_priority_classes(home: Path) -> None:
    result = run_cli(home, "--help")
    assert result.returncode == 0
    assert "flavors" in result.stdout and "priority-classes" in result.stdout


# -- list filters -------------------------------------------------------------------------


def jobs_of_visible_vcs(request: httpx.Request) -> httpx.Response:
    """A portal where the user sees VC vision only, and has no jobs in it."""
    path = request.url.path
    if path == "/api/v1/jobs/":
        return httpx.Response(200, json={"count": 0, "next": None, "results": []})
    if path == "/api/v1/virtual-clusters/vision/":
        return httpx.Response(200, json={"id": 1, "name": "vision", "tenant": "vision", "quotas": []})
    assert path.startswith("/api/v1/virtual-clusters/"), path
    return httpx.Response(404, json={"detail": "No VirtualCluster matches the given query."})


@pytest.mark.parametrize("output", [[], ["-o", "json"]], ids=["table", "json"])
def test_list_of_a_vc_the_user_cannot_see_says_it_is_not_found(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], output: list[str]
) -> None:
    """`list --vc nope` said "You have no jobs here" (exit 0), while `vcs nope` exits 3."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    cli_against(monkeypatch, jobs_of_visible_vcs)
    assert cli.main(["list", "--vc", "nope", *output]) == cli.NOT_FOUND
    assert capsys.readouterr() == ("", "error: virtual cluster nope not found\n")
    assert cli.main(["vcs", "nope", *output]) == cli.NOT_FOUND
    assert capsys.readouterr() == ("", "error: virtual cluster nope not found\n")

    assert cli.main(["list", "--vc", "vision", *output]) == cli.OK
    shown = capsys.readouterr()
    if output:
        assert json.loads(shown.out) == []
    else:
        assert shown == ("", "You have no jobs here (--all shows your tenants' jobs).\n")


def test_list_asks_about_the_vc_only_when_no_job_matched(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config.save("http://gpus.example.org", "gpp_t", "alice")
    job = {"id": 7, "name": "j", "vc": "vision", "owner": "alice", "state": "running"}
    sent = cli_against(
        monkeypatch, lambda r: httpx.Response(200, json={"count": 1, "next": None, "results": [job]})
    )
    assert cli.main(["list", "--vc", "vision"]) == cli.OK
    assert [r.url.path for r in sent] == ["/api/v1/jobs/"]


def test_list_refuses_an_unknown_state_with_the_valid_ones(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`list --state bogus` sent the filter, and the portal's refusal named no valid state."""
    config.save("http://gpus.example.org", "gpp_t", "alice")
    sent = cli_against(monkeypatch, lambda r: httpx.Response(500))
    with pytest.raises(SystemExit) as exited:
        cli.main(["list", "--state", "running", "--state", "bogus"])
    assert exited.value.code == cli.USAGE
    err = capsys.readouterr().err
    assert "argument --state: invalid choice: 'bogus'" in err
    assert all(state in err for state in cli.JOB_STATES)
    assert not sent


def test_the_states_list_takes_are_the_portals() -> None:
    from portal.jobs.choices import JobState

    assert list(cli.JOB_STATES) == [state.value for state in JobState]

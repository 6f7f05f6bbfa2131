"""The agent's enrollment (agents.enroll) against a real HTTP server on 127.0.0.1 that plays
the portal's enrollment endpoint."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.__main__ import main
from agents.config import parse_args
from agents.enroll import EnrollmentRefused, enroll, enroll_url, stored_token_path


class FakePortal(http.server.ThreadingHTTPServer):
    answer: tuple[int, dict[str, Any]] = (201, {"node_name": "gpu-1", "token": "gpp_node-token"})

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), EnrollHandler)
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.answers: list[tuple[int, dict[str, Any]]] = []  # given before `answer`, once each

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class EnrollHandler(http.server.BaseHTTPRequestHandler):
    server: FakePortal

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, self.headers["Authorization"], body))
        status, answer = self.server.answers.pop(0) if self.server.answers else self.server.answer
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def portal() -> Iterator[FakePortal]:
    server = FakePortal()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def args(portal_url: str, tmp_path: Path, *extra: str) -> list[str]:
    return ["--portal", portal_url, "--state-dir", str(tmp_path / "state"), "--node-name", "gpu-1", *extra]


def test_enroll_urls_follow_the_portal_url() -> None:
    assert enroll_url("ws://127.0.0.1:8000/ws/agent/") == "http://127.0.0.1:8000/agent/enroll/"
    assert (
        enroll_url("wss://portal.example.org/gpu/ws/agent/") == "https://portal.example.org/gpu/agent/enroll/"
    )


def test_the_first_start_enrolls_and_keeps_the_node_token_private(portal: FakePortal, tmp_path: Path) -> None:
    enroll_file = tmp_path / "enroll.token"
    enroll_file.write_text("gpe_secret\n")
    config = parse_args(args(portal.url, tmp_path, "--enroll-token-file", str(enroll_file)))
    assert config.token == "" and config.enroll_token == "gpe_secret"
    config.state_dir.mkdir(mode=0o700)

    token = enroll(config.portal_url, config.enroll_token, config.node_name, config.state_dir, lambda: 0.0)

    assert token == "gpp_node-token"
    assert portal.requests == [("/agent/enroll/", "Bearer gpe_secret", {"node_name": "gpu-1"})]
    stored = stored_token_path(config.state_dir)
    assert stored.read_text() == "gpp_node-token\n"
    assert stored.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in config.state_dir.iterdir()] == ["node.token"]  # no temporary file left
    # Later starts use the stored token; the spent enrollment token is not even read.
    enroll_file.unlink()
    again = parse_args(args(portal.url, tmp_path, "--enroll-token-file", str(enroll_file)))
    assert again.token == "gpp_node-token" and again.enroll_token == ""
    assert len(portal.requests) == 1


def test_a_refused_enrollment_token_stops_the_agent_and_stores_nothing(
    portal: FakePortal, tmp_path: Path
) -> None:
    portal.answer = (401, {"detail": "Invalid, used or expired enrollment token."})
    enroll_file = tmp_path / "enroll.token"
    enroll_file.write_text("gpe_used\n")
    code = main(args(portal.url, tmp_path, "--enroll-token-file", str(enroll_file), "--simulate", "dgx-a100"))
    assert code == 2
    assert len(portal.requests) == 1
    assert not stored_token_path(tmp_path / "state").exists()
    with pytest.raises(EnrollmentRefused, match="401"):
        enroll(
            f"ws://127.0.0.1:{portal.server_address[1]}/ws/agent/", "gpe_used", "gpu-1", tmp_path, lambda: 0.0
        )


def test_enrollment_waits_for_a_portal_that_is_not_up_yet(portal: FakePortal, tmp_path: Path) -> None:
    """A portal that is not up (503, as a proxy answers) is asked again after the backoff's
    delay; the token is stored once it answers."""
    portal.answers = [(503, {"detail": "starting"}), (503, {"detail": "starting"})]
    delays: list[float] = []
    token = enroll(
        f"ws://127.0.0.1:{portal.server_address[1]}/ws/agent/",
        "gpe_x",
        "gpu-1",
        tmp_path,
        next_delay=lambda: 0.25 * (len(delays) + 1),
        sleep=delays.append,
    )
    assert token == "gpp_node-token" and delays == [0.25, 0.5] and len(portal.requests) == 3
    assert stored_token_path(tmp_path).read_text() == "gpp_node-token\n"


def test_exactly_one_credential_option(tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text("x")
    with pytest.raises(SystemExit):
        parse_args(args("http://127.0.0.1:1", tmp_path))
    with pytest.raises(SystemExit):
        parse_args(
            args(
                "http://127.0.0.1:1",
                tmp_path,
                "--token-file",
                str(token_file),
                "--enroll-token-file",
                str(token_file),
            )
        )

"""Requests the browser gives up on (a reload, a closed tab, navigating away while a page loads)
must give their database connection back to the pool.

A real ASGI server with a pool of three connections gets bursts of API requests whose clients
close the socket while the server is working on them, many more than the pool holds. Before
PortalASGIHandler (portal/lib/asgi.py), each of some of them lost a connection of the pool for
good, and after a few bursts every request waited for the pool and was answered 503."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from portal.accounts.services import create_api_token
from tests.conftest import web_server

pytestmark = pytest.mark.django_db(transaction=True)

POOL_SIZE = 3
BURSTS = 8
BURST = 30  # aborted requests at once, ten times the pool
PATHS = ("/api/v1/jobs/", "/api/v1/me/")


def abort_in_flight(address: str, path: str, token: str, after: float) -> None:
    """Sends a GET and closes the socket `after` seconds later, without reading the response."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        request = f"GET {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\r\n"
        sock.sendall(request.encode())
        time.sleep(after)


def in_threads(calls: list[Any]) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_aborted_requests_return_their_connections_to_the_pool(users: dict[str, Any], tmp_path: Path) -> None:
    _, token = create_api_token(users["alice"], "aborts")
    with web_server(tmp_path, DATABASE_POOL_SIZE=str(POOL_SIZE)) as address:
        for _ in range(BURSTS):
            # Closed 0 to 18 ms after sending: before, during and after the view's queries.
            in_threads(
                [
                    lambda i=i: abort_in_flight(address, PATHS[i % 2], token, after=(i % 7) * 0.003)
                    for i in range(BURST)
                ]
            )

        # More requests at once than the pool holds: each one needs every connection back.
        answers: list[tuple[int, float]] = []

        def get_jobs() -> None:
            started = time.monotonic()
            response = httpx.get(
                f"http://{address}/api/v1/jobs/", headers={"Authorization": f"Bearer {token}"}, timeout=30
            )
            answers.append((response.status_code, time.monotonic() - started))

        in_threads([get_jobs for _ in range(POOL_SIZE + 2)])

    log = (tmp_path / "web.log").read_text()
    assert [status for status, _ in answers] == [200] * (POOL_SIZE + 2), log[-3000:]
    assert max(seconds for _, seconds in answers) < 5, answers  # the pool waits 10 s
    assert "couldn't get a connection" not in log
    assert "Exception in ASGI application" not in log, log[-3000:]

"""Nothing an agent sent is lost when the web process stops normally: a real uvicorn process
gets SIGTERM while the agent is connected, with samples still in its buffer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from websockets.sync.client import connect

from portal.devstack import free_port, port_open, wait_until
from tests.conftest import database_url_of_tests

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[3]


def test_samples_buffered_when_the_server_stops_are_written(tmp_path) -> None:  # type: ignore[no-untyped-def]

    from bench.telemetry import batch_template, hello, prepare
    from portal.jobs.models import TelemetrySample

    ((node, token),) = prepare(1, 8).items()
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url_of_tests(),
        "DEBUG": "true",
    }
    with open(tmp_path / "web.log", "wb") as out:
        web = subprocess.Popen(
            [str(Path(sys.executable).parent / "uvicorn"), "portal.asgi:application", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: port_open(port), 30, "the web server")
        template, placeholder = batch_template(node, 8)
        with connect(
            f"ws://127.0.0.1:{port}/ws/agent/", additional_headers={"Authorization": f"Bearer {token}"}
        ) as ws:
            ws.send(hello(node, 8))
            assert json.loads(ws.recv(timeout=30))["type"] == "welcome"
            ws.recv(timeout=30)  # the desired set
            for _ in range(3):
                now = json.dumps(datetime.now(UTC).isoformat().replace("+00:00", "Z"))
                ws.send(template.replace(placeholder, now))
            ws.ping().wait(timeout=10)  # the server has read the batches
            web.send_signal(signal.SIGTERM)
            web.wait(timeout=30)  # uvicorn shuts down gracefully, then re-raises the signal
    finally:
        if web.poll() is None:
            web.kill()
    assert TelemetrySample.objects.count() == 24, (tmp_path / "web.log").read_text()

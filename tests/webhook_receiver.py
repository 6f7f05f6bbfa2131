"""A real HTTP receiver on loopback for webhook tests: records every request it gets and answers
with the statuses a test queues (200 once the queue is empty)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.deliveries: list[Delivery] = []
        self.statuses: list[int] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, *statuses: int) -> None:
        """The statuses of the next requests, in order."""
        with self.lock:
            self.statuses.extend(statuses)

    def to(self, path: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.path == path]


@contextmanager
def running_receiver() -> Iterator[WebhookReceiver]:
    receiver: WebhookReceiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with receiver.lock:
                receiver.deliveries.append(Delivery(self.path, dict(self.headers.items()), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = WebhookReceiver(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()

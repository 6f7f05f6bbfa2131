"""A small portal for agent tests: a real websockets server on 127.0.0.1 speaking the protocol.

It checks the node token and the path, answers hello with welcome and the current
desired set, records every message, and can drop the connection or send requests.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

import websockets
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from agents.protocol import (
    AgentToPortal,
    AttemptStatus,
    DesiredAttempt,
    DesiredSet,
    Hello,
    LogChunk,
    PortalToAgent,
    Welcome,
    decode_from_agent,
    encode,
)

TOKEN = "node-token-for-tests"


class FakePortal:
    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.desired: list[DesiredAttempt] = []
        self.revision = 0
        self.received: list[AgentToPortal] = []
        self.received_per_connection: list[list[AgentToPortal]] = []  # after each hello
        self.hellos: list[Hello] = []
        self.refused = 0
        self.refuse_all = False  # simulate a portal that is down: refuse every handshake
        self.connection: ServerConnection | None = None
        self.server: Any = None

    async def __aenter__(self) -> FakePortal:
        self.server = await websockets.serve(self._handle, "127.0.0.1", 0, process_request=self._check)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        if self.refuse_all:
            self.refused += 1
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "down for maintenance\n")
        if request.path != "/ws/agent/" or request.headers.get("Authorization") != f"Bearer {self.token}":
            self.refused += 1
            return connection.respond(HTTPStatus.UNAUTHORIZED, "bad node token\n")
        return None

    async def _handle(self, connection: ServerConnection) -> None:
        hello = decode_from_agent(await connection.recv())
        assert isinstance(hello, Hello), hello
        self.hellos.append(hello)
        self.received_per_connection.append(received := [])
        self.connection = connection
        await connection.send(
            encode(Welcome(node_id="node-1", heartbeat_interval_s=1, telemetry_interval_s=1))
        )
        await connection.send(encode(DesiredSet(revision=self.revision, attempts=self.desired)))
        try:
            async for text in connection:
                message = decode_from_agent(text)
                self.received.append(message)
                received.append(message)
        except websockets.exceptions.ConnectionClosed:
            pass

    async def set_desired(self, attempts: list[DesiredAttempt]) -> None:
        self.desired = attempts
        self.revision += 1
        if self.connection is not None:
            await self.send(DesiredSet(revision=self.revision, attempts=attempts))

    async def send(self, message: PortalToAgent) -> None:
        assert self.connection is not None
        await self.connection.send(encode(message))

    async def drop(self) -> None:
        """Cut the current connection, as a network failure or a portal restart would."""
        assert self.connection is not None
        connection, self.connection = self.connection, None
        await connection.close()

    # -- queries -----------------------------------------------------------------

    def of_type(self, kind: type) -> list[Any]:
        return [message for message in self.received if isinstance(message, kind)]

    def statuses(self, attempt_id: str) -> list[AttemptStatus]:
        return [message for message in self.of_type(AttemptStatus) if message.attempt_id == attempt_id]

    def last_status(self, attempt_id: str) -> AttemptStatus | None:
        statuses = self.statuses(attempt_id)
        return max(statuses, key=lambda status: (status.state.rank, status.generation)) if statuses else None

    def log_lines(self, attempt_id: str, stream: str = "stdout") -> dict[int, str]:
        """Lines by sequence number; re-sent chunks land on the same numbers."""
        lines: dict[int, str] = {}
        for chunk in self.of_type(LogChunk):
            if chunk.attempt_id == attempt_id and chunk.stream == stream:
                for offset, text in enumerate(chunk.text.splitlines()):
                    lines[chunk.seq + offset] = text
        return lines


async def wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached: {predicate}")
        await asyncio.sleep(0.02)

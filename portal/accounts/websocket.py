"""Websocket handshakes signed with an API token, for clients that are not browsers (the CLI).

A browser cannot set `Authorization` on a websocket and always sends `Origin`; a page of another
site that a signed-in user visits can open a socket with the user's session cookie, which is why
browser sockets are checked for their origin. A handshake with `Authorization` and without
`Origin` is therefore no browser's: BearerTokenMiddleware signs it in with the API token alone
(portal.accounts.authentication.authenticate_token, as the REST API does), ignoring any cookie,
and skips the origin check, which has nothing to check. Every other handshake goes the
browser's way, session and origin checked, exactly as without this middleware.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AnonymousUser

from portal.accounts.authentication import authenticate_token, bearer_secret
from portal.lib.db import database_sync_to_async
from portal.live.publish import token_key

ASGIApp = Any  # an ASGI application: (scope, receive, send) -> awaitable


def header(scope: dict[str, Any], name: bytes) -> str | None:
    """The first value of a handshake's header (names arrive in lower case), or None."""
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def has_origin(scope: dict[str, Any]) -> bool:
    """Whether the handshake says which page opened it: every browser's does."""
    return header(scope, b"origin") is not None


def bearer_token(scope: dict[str, Any]) -> str:
    """The secret of the handshake's `Authorization: Bearer` header; empty when there is none."""
    value = header(scope, b"authorization")
    return (bearer_secret(value) if value is not None else None) or ""


def credential_key(scope: dict[str, Any]) -> str | None:
    """The key of what signed the socket in, as publish_access_change names it: its API token's
    (token_key) or its session's."""
    token = scope.get("api_token")
    if token is not None:
        return token_key(token.pk)
    session = scope.get("session")
    return session.session_key if session is not None else None


def ends_access(scope: dict[str, Any], access_change: str) -> bool:
    """Whether an access change (publish_access_change's message) closes this socket: any change
    of the user's access, or the end of what signed it in (credential_key); another session's
    sign-out or another token's revocation leaves it open."""
    key = json.loads(access_change).get("session")
    return key is None or key == credential_key(scope)


def ends_shell_access(scope: dict[str, Any], access_change: str, job_tenant_id: int) -> bool:
    """As ends_access, for a shell in a job of `job_tenant_id`: a change of the user's membership
    in another tenant leaves it open."""
    tenant = json.loads(access_change).get("tenant")
    return ends_access(scope, access_change) and (tenant is None or tenant == job_tenant_id)


def credential_expiry(scope: dict[str, Any]) -> datetime | None:
    """When what signed the socket in stops signing anyone in: its API token's expiry, or its
    session's (as stored: a session's expiry moves only when the session is saved). None: never,
    or nothing signed it in. A socket outlives its handshake, so a consumer that stays open for
    long closes itself at this time, as a request would be refused from then on."""
    token = scope.get("api_token")
    if token is not None:
        return token.expires_at
    session = scope.get("session")
    if session is None or session.session_key is None or not hasattr(session, "get_model_class"):
        return None
    sessions = session.get_model_class().objects.filter(session_key=session.session_key)
    return sessions.values_list("expire_date", flat=True).first()


class BearerTokenMiddleware:
    """Signs in a handshake that carries `Authorization` and no `Origin` with its API token:
    `scope["user"]` is the token's user (AnonymousUser when the token is missing, malformed,
    expired or revoked, or its user inactive: the consumer refuses it as not signed in) and
    `scope["api_token"]` the token (None then). Any other handshake is passed to `browsers`, the
    session and origin checks."""

    def __init__(self, inner: ASGIApp, browsers: ASGIApp) -> None:
        self.inner = inner
        self.browsers = browsers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket" or has_origin(scope) or header(scope, b"authorization") is None:
            return await self.browsers(scope, receive, send)
        token = await database_sync_to_async(authenticate_token)(bearer_token(scope))
        user = token.user if token is not None else AnonymousUser()
        return await self.inner(dict(scope, user=user, api_token=token), receive, send)

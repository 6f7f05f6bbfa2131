"""`Authorization: Bearer <token>` for scripts and the CLI."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from portal.accounts.models import TOKEN_PREFIX, ApiToken, hash_secret


def bearer_secret(header: str) -> str | None:
    """The secret of an `Authorization` header's value, or None when its scheme is not Bearer."""
    scheme, _, raw = header.partition(" ")
    return raw.strip() if scheme == "Bearer" else None


def authenticate_token(raw: str) -> ApiToken | None:
    """The API token whose secret is `raw`, with its user, if it may be used: not revoked, not
    expired, its user active; else None. Every way in that takes API tokens (the REST API, the
    shell socket) checks them here, so that none accepts a token another refuses. Its use is
    noted (`last_used_at`) at most once a minute, not a write per request."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.usable().select_related("user").filter(token_hash=hash_secret(raw)).first()
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        raw = bearer_secret(header) if header else None
        if raw is None:
            return None  # another scheme, or none: another authentication class may take it
        if not raw.startswith(TOKEN_PREFIX):
            raise exceptions.AuthenticationFailed("Invalid token.")
        token = authenticate_token(raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API token from /api/v1/tokens/."}

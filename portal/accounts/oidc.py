"""Single sign-on through an OpenID Connect provider: the authorization code flow with PKCE.

The browser goes to the provider with a fresh state, nonce and code challenge kept in the
session; the provider sends it back with a code, which the portal exchanges for an ID token
over a direct request. The token is trusted only when its signature verifies against the
provider's published keys with an asymmetric algorithm the provider announces, and its issuer,
audience, expiry and nonce are this login's. Users are found by (issuer, subject), never by a
matching name, so an account at the provider cannot take over a local user that happens to
share its name (a cluster admin links such accounts in Django admin).

A user created here belongs to no tenant: tenant admins add members, as for any other user.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.validators import ASCIIUsernameValidator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

from portal.accounts.models import OidcIdentity
from portal.accounts.services import record_audit

SESSION_KEY = "oidc_logins"
# A login left at the provider longer than this is refused on its return: start again.
LOGIN_TTL_S = 600
# Logins begun in other tabs and not finished yet, kept per session (the oldest are dropped).
MAX_PENDING_LOGINS = 5
# Signature algorithms an ID token may use: asymmetric only, so nobody who knows the client
# secret (or nothing, with "none") can mint a token.
ASYMMETRIC_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
DISCOVERY_TTL_S = 3600
CLOCK_SKEW_S = 60


class SsoRefused(Exception):
    """A sign-in that cannot go on; the message is for the person signing in."""


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    algorithms: tuple[str, ...]


_cache_lock = threading.Lock()
_providers: dict[str, tuple[float, Provider]] = {}
_key_sets: dict[str, jwt.PyJWKSet] = {}


def enabled() -> bool:
    return bool(settings.OIDC_ISSUER)


def login_path() -> str:
    return reverse("oidc-login")


def redirect_uri() -> str:
    """The callback the provider must know for this client: fixed by PORTAL_URL, not by the
    Host header of the request, so a forged host cannot redirect the code elsewhere."""
    return settings.PORTAL_URL.rstrip("/") + reverse("oidc-callback")


def _fetch_json(url: str, **kwargs: Any) -> dict[str, Any]:
    try:
        response = httpx.request(kwargs.pop("method", "GET"), url, timeout=settings.OIDC_TIMEOUT_S, **kwargs)
    except httpx.HTTPError as error:
        raise SsoRefused(f"The sign-on provider could not be reached ({type(error).__name__}).") from None
    if response.status_code >= 400:
        raise SsoRefused(f"The sign-on provider answered {response.status_code} at {url}.")
    try:
        body = response.json()
    except ValueError:
        raise SsoRefused(f"The sign-on provider did not answer JSON at {url}.") from None
    if not isinstance(body, dict):
        raise SsoRefused(f"The sign-on provider did not answer a JSON object at {url}.")
    return body


def provider() -> Provider:
    """The provider's endpoints from its discovery document, kept for an hour.

    OIDC_ISSUER is compared exactly as configured, as OpenID Connect Discovery requires: some
    providers' issuers end in "/" (Auth0) and most do not (Keycloak), and an ID token's `iss`
    is the issuer character for character. Only the discovery URL is built without the "/"."""
    issuer = settings.OIDC_ISSUER
    now = time.monotonic()
    with _cache_lock:
        cached = _providers.get(issuer)
    if cached is not None and now - cached[0] < DISCOVERY_TTL_S:
        return cached[1]
    document = _fetch_json(f"{issuer.rstrip('/')}/.well-known/openid-configuration")
    if document.get("issuer") != issuer:
        raise SsoRefused(
            f"The sign-on provider's discovery document names the issuer {document.get('issuer')!r}, "
            f"not {issuer!r}: OIDC_ISSUER must be exactly the provider's, trailing '/' or not."
        )
    announced = document.get("id_token_signing_alg_values_supported") or ["RS256"]
    algorithms = tuple(a for a in announced if a in ASYMMETRIC_ALGORITHMS)
    missing = [k for k in ("authorization_endpoint", "token_endpoint", "jwks_uri") if not document.get(k)]
    if missing or not algorithms:
        raise SsoRefused(
            "The sign-on provider's discovery document lacks " + (", ".join(missing) or "an algorithm")
        )
    found = Provider(
        issuer=issuer,
        authorization_endpoint=document["authorization_endpoint"],
        token_endpoint=document["token_endpoint"],
        jwks_uri=document["jwks_uri"],
        algorithms=algorithms,
    )
    with _cache_lock:
        _providers[issuer] = (now, found)
    return found


def forget_provider() -> None:
    """Drop cached discovery documents and keys (tests, and a provider that moved)."""
    with _cache_lock:
        _providers.clear()
        _key_sets.clear()


def _signing_key(found: Provider, kid: str | None) -> Any:
    """The provider's key for `kid`; the key set is fetched again once for a key it did not
    have, which is how providers roll their keys."""
    for attempt in range(2):
        with _cache_lock:
            key_set = _key_sets.get(found.jwks_uri)
        if key_set is None or attempt:
            try:
                key_set = jwt.PyJWKSet.from_dict(_fetch_json(found.jwks_uri))
            except jwt.PyJWTError:
                raise SsoRefused("The sign-on provider's keys could not be read.") from None
            with _cache_lock:
                _key_sets[found.jwks_uri] = key_set
        if kid is None and len(key_set.keys) == 1:
            return key_set.keys[0].key
        for key in key_set.keys:
            if key.key_id == kid:
                return key.key
    raise SsoRefused("The ID token was signed with a key the sign-on provider does not publish.")


def _pkce_challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def safe_next(target: str | None) -> str:
    """Where to land after signing in: a path on this site, else the dashboard."""
    if target and target.startswith("/") and url_has_allowed_host_and_scheme(target, allowed_hosts=None):
        return target
    return "/"


def begin(request: Any, next_path: str | None) -> str:
    """Start a login: remember its state in the session and return the provider's URL."""
    found = provider()
    state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
    pending = dict(request.session.get(SESSION_KEY, {}))
    pending[state] = {"nonce": nonce, "verifier": verifier, "next": safe_next(next_path), "at": time.time()}
    while len(pending) > MAX_PENDING_LOGINS:
        pending.pop(min(pending, key=lambda s: pending[s]["at"]))
    request.session[SESSION_KEY] = pending
    query = {
        "response_type": "code",
        "client_id": settings.OIDC_CLIENT_ID,
        "redirect_uri": redirect_uri(),
        "scope": settings.OIDC_SCOPES,
        "state": state,
        "nonce": nonce,
        "code_challenge": _pkce_challenge(verifier),
        "code_challenge_method": "S256",
    }
    return f"{found.authorization_endpoint}?{urlencode(query)}"


def complete(request: Any, params: Any) -> tuple[Any, str]:
    """Finish a login from the provider's redirect: the user, and where to send them."""
    pending = dict(request.session.get(SESSION_KEY, {}))
    login = pending.pop(params.get("state", ""), None)
    request.session[SESSION_KEY] = pending
    if login is None:
        raise SsoRefused("This sign-in was not started here, or it was finished already. Start again.")
    if time.time() - login["at"] > LOGIN_TTL_S:
        raise SsoRefused("This sign-in took too long at the sign-on provider. Start again.")
    if params.get("error"):
        description = str(params.get("error_description") or params["error"])[:200]
        raise SsoRefused(f"The sign-on provider refused the sign-in: {description}")
    code = params.get("code")
    if not code:
        raise SsoRefused("The sign-on provider sent no authorization code.")
    claims = _id_token_claims(code, login)
    return user_for(claims), login["next"]


def _id_token_claims(code: str, login: dict[str, Any]) -> dict[str, Any]:
    found = provider()
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri(),
        "code_verifier": login["verifier"],
    }
    auth = None
    if settings.OIDC_CLIENT_SECRET:
        auth = (settings.OIDC_CLIENT_ID, settings.OIDC_CLIENT_SECRET)  # client_secret_basic
    else:
        form["client_id"] = settings.OIDC_CLIENT_ID  # a public client
    tokens = _fetch_json(found.token_endpoint, method="POST", data=form, auth=auth)
    id_token = tokens.get("id_token")
    if not isinstance(id_token, str):
        raise SsoRefused("The sign-on provider sent no ID token.")
    try:
        header = jwt.get_unverified_header(id_token)
    except jwt.PyJWTError:
        raise SsoRefused("The ID token is not a valid JWT.") from None
    if header.get("alg") not in found.algorithms:
        raise SsoRefused(f"The ID token is signed with {header.get('alg')!r}, which is not accepted.")
    key = _signing_key(found, header.get("kid"))
    try:
        claims = jwt.decode(
            id_token,
            key=key,
            algorithms=list(found.algorithms),
            audience=settings.OIDC_CLIENT_ID,
            issuer=found.issuer,
            leeway=CLOCK_SKEW_S,
            options={"require": ["exp", "iat", "iss", "aud", "sub"]},
        )
    except jwt.PyJWTError as error:
        raise SsoRefused(f"The ID token was refused: {error}.") from None
    if claims.get("nonce") != login["nonce"]:
        raise SsoRefused("The ID token is not for this sign-in (its nonce differs).")
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audiences) > 1 and claims.get("azp") != settings.OIDC_CLIENT_ID:
        raise SsoRefused("The ID token was issued to another client.")
    return claims


def user_for(claims: dict[str, Any]) -> Any:
    """The portal user of a verified ID token: the linked one, or a new one if allowed."""
    issuer, subject = settings.OIDC_ISSUER, str(claims["sub"])
    try:
        with transaction.atomic():
            identity = (
                OidcIdentity.objects.select_for_update()
                .select_related("user")
                .filter(issuer=issuer, subject=subject)
                .first()
            )
            if identity is not None:
                if not identity.user.is_active:
                    raise SsoRefused("Your portal account is deactivated. Ask a cluster admin.")
                identity.last_login_at = timezone.now()
                identity.save(update_fields=["last_login_at"])
                return identity.user
            return _create_user(claims, issuer, subject)
    except IntegrityError:
        # A second first sign-in of the same account, or of the same name, at the same moment.
        raise SsoRefused("Your account was being set up by another sign-in. Try again.") from None


def _create_user(claims: dict[str, Any], issuer: str, subject: str) -> Any:
    username = claims.get(settings.OIDC_USERNAME_CLAIM)
    if not settings.OIDC_CREATE_USERS:
        raise SsoRefused(
            f"No portal account is linked to your sign-on account {username or subject!r}. "
            "Ask a cluster admin."
        )
    if not isinstance(username, str) or not username:
        raise SsoRefused(
            f"The sign-on provider sent no {settings.OIDC_USERNAME_CLAIM!r} claim to name you by."
        )
    try:
        if len(username) > 150:
            raise ValidationError("too long")
        ASCIIUsernameValidator()(username)
    except ValidationError:
        raise SsoRefused(
            f"Your sign-on name {username[:150]!r} cannot be a portal user name (letters, digits "
            "and @.+-_ only, at most 150). Ask a cluster admin to link your account."
        ) from None
    User = get_user_model()
    if User.objects.filter(username__iexact=username).exists():
        raise SsoRefused(
            f"A portal user named {username!r} exists already and is not linked to your sign-on account. "
            "Ask a cluster admin to link them."
        )
    email = claims.get("email") if claims.get("email_verified", True) is not False else ""
    # No password: this user signs in through the provider only (create_user sets none usable).
    user = User.objects.create_user(username=username, email=email if isinstance(email, str) else "")
    OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject, last_login_at=timezone.now())
    record_audit(user, "user.create_by_sso", user, detail=f"subject {subject} at {issuer}")
    return user

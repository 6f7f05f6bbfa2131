"""Single sign-on through OpenID Connect, against a provider on loopback (tests/oidc_provider.py):
the whole round trip over real HTTP, and every refusal leaves nobody signed in."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from portal.accounts import oidc
from portal.accounts.models import AuditEntry, OidcIdentity
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider

pytestmark = pytest.mark.django_db

PORTAL_URL = "http://portal.test"
CALLBACK = f"{PORTAL_URL}/auth/oidc/callback/"


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    found = OidcProvider(redirect_uris=[CALLBACK])
    yield found
    found.stop()


@pytest.fixture
def sso(provider: OidcProvider, settings: Any) -> OidcProvider:
    settings.PORTAL_URL = PORTAL_URL
    settings.OIDC_ISSUER = provider.issuer
    settings.OIDC_CLIENT_ID = CLIENT_ID
    settings.OIDC_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_CREATE_USERS = True
    settings.OIDC_PROVIDER_NAME = "Lab SSO"
    provider.reset()
    provider.account = {"sub": "f3b1-9c", "preferred_username": "erin", "email": "erin@lab.example"}
    oidc.forget_provider()
    return provider


def sign_in(client: Client, next_path: str = "/jobs/") -> Any:
    """The browser's round trip: portal, provider, portal. Returns the callback's response."""
    start = client.get("/auth/oidc/login/", {"next": next_path})
    assert start.status_code == 302, start.content
    at_provider = httpx.get(start["Location"], follow_redirects=False)
    assert at_provider.status_code == 302, at_provider.text
    back = urlsplit(at_provider.headers["location"])
    assert f"{back.scheme}://{back.netloc}{back.path}" == CALLBACK
    return client.get(back.path, {k: v[0] for k, v in parse_qs(back.query).items()})


def signed_in_as(client: Client) -> str | None:
    response = client.get("/api/v1/session/")
    return response.json()["username"] if response.status_code == 200 else None


def test_a_first_sign_in_creates_the_user_and_lands_where_asked(sso: OidcProvider) -> None:
    client = Client()
    response = sign_in(client, "/jobs/7")
    assert response.status_code == 302 and response["Location"] == "/jobs/7"
    assert signed_in_as(client) == "erin"
    erin = get_user_model().objects.get(username="erin")
    assert erin.email == "erin@lab.example" and not erin.has_usable_password()
    assert not erin.memberships.exists()  # tenant admins add members, as for anyone
    identity = OidcIdentity.objects.get(user=erin)
    assert (identity.issuer, identity.subject) == (sso.issuer, "f3b1-9c")
    assert AuditEntry.objects.filter(action="user.create_by_sso", object_id=str(erin.pk)).exists()
    # What the provider saw: a code request with PKCE, then the exchange with the client's
    # credentials and the verifier of that challenge.
    (asked,) = sso.authorize_requests
    assert asked["client_id"] == CLIENT_ID and asked["redirect_uri"] == CALLBACK
    assert asked["code_challenge_method"] == "S256" and asked["nonce"] and asked["state"]
    (exchange,) = sso.token_requests
    verifier = exchange["form"]["code_verifier"]
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert challenge == asked["code_challenge"]
    assert exchange["form"]["redirect_uri"] == CALLBACK and "client_secret" not in exchange["form"]


def test_a_later_sign_in_is_the_same_user_whatever_the_name_says(sso: OidcProvider) -> None:
    sign_in(Client())
    sso.account = {**sso.account, "preferred_username": "erin.renamed"}
    client = Client()
    sign_in(client)
    assert signed_in_as(client) == "erin"
    assert get_user_model().objects.filter(username__startswith="erin").count() == 1
    assert OidcIdentity.objects.get(subject="f3b1-9c").last_login_at is not None


@pytest.mark.parametrize(
    "tamper",
    [
        {"claim_overrides": {"aud": "another-client"}},
        {"claim_overrides": {"iss": "http://127.0.0.1:1/realms/other"}},
        {"claim_overrides": {"nonce": "not-this-login"}},
        {"claim_overrides": {"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}},
        {"claim_overrides": {"sub": None}},
        {"sign_with": "unpublished"},
        {"sign_with": "secret"},  # HS256 keyed with the client secret: anyone with it could mint one
        {"header_overrides": {"kid": "key-that-does-not-exist"}},
    ],
    ids=["audience", "issuer", "nonce", "expired", "no-subject", "unknown-key", "hs256", "unknown-kid"],
)
def test_an_id_token_that_does_not_verify_signs_nobody_in(sso: OidcProvider, tamper: dict[str, Any]) -> None:
    for name, value in tamper.items():
        if isinstance(value, dict):
            getattr(sso, name).update(value)
        else:
            setattr(sso, name, value)
    client = Client()
    response = sign_in(client)
    assert response.status_code == 400
    assert "did not work" in response.content.decode()
    assert signed_in_as(client) is None
    assert not get_user_model().objects.filter(username="erin").exists()


def test_a_callback_not_started_in_this_session_or_replayed_is_refused(sso: OidcProvider) -> None:
    client = Client()
    start = client.get("/auth/oidc/login/")
    back = urlsplit(httpx.get(start["Location"], follow_redirects=False).headers["location"])
    params = {k: v[0] for k, v in parse_qs(back.query).items()}
    # Another browser (an attacker's link) with this code and state: its session began no login.
    stranger = Client()
    refused = stranger.get(back.path, params)
    assert refused.status_code == 400 and "not started here" in refused.content.decode()
    assert signed_in_as(stranger) is None
    assert client.get(back.path, params).status_code == 302
    replay = client.get(back.path, params)
    assert replay.status_code == 400 and "finished already" in replay.content.decode()


def test_a_provider_account_never_becomes_a_local_user_of_the_same_name(
    sso: OidcProvider, users: Any
) -> None:
    sso.account = {"sub": "intruder-1", "preferred_username": "Alice"}
    client = Client()
    response = sign_in(client)
    assert response.status_code == 400 and "exists already" in response.content.decode()
    assert signed_in_as(client) is None
    # A cluster admin links the accounts: then that provider account is alice.
    OidcIdentity.objects.create(user=users["alice"], issuer=sso.issuer, subject="intruder-1")
    client = Client()
    sign_in(client)
    assert signed_in_as(client) == "alice"


def test_deactivated_users_unlinked_accounts_and_bad_names_are_refused(
    sso: OidcProvider, settings: Any
) -> None:
    sign_in(Client())
    get_user_model().objects.filter(username="erin").update(is_active=False)
    client = Client()
    response = sign_in(client)
    assert response.status_code == 400 and "deactivated" in response.content.decode()
    assert signed_in_as(client) is None

    sso.account = {"sub": "bad-name", "preferred_username": "frank smith!"}
    response = sign_in(Client())
    assert response.status_code == 400 and "cannot be a portal user name" in response.content.decode()

    settings.OIDC_CREATE_USERS = False
    sso.account = {"sub": "new-2", "preferred_username": "grace"}
    response = sign_in(Client())
    assert response.status_code == 400 and "Ask a cluster admin" in response.content.decode()
    assert not get_user_model().objects.filter(username__in=["grace", "frank smith!"]).exists()


def test_the_provider_refusing_and_foreign_next_urls(sso: OidcProvider) -> None:
    client = Client()
    start = client.get("/auth/oidc/login/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    refused = client.get("/auth/oidc/callback/", {"state": state, "error": "access_denied"})
    assert refused.status_code == 400 and "access_denied" in refused.content.decode()
    for target in ("https://elsewhere.example/", "//elsewhere.example/x", "javascript:alert(1)"):
        response = sign_in(Client(), target)
        assert response.status_code == 302 and response["Location"] == "/"


@pytest.fixture
def slash_sso(sso: OidcProvider, settings: Any) -> Iterator[OidcProvider]:
    """The provider with an issuer that ends in "/", as Auth0's does (https://TENANT.auth0.com/)."""
    plain = sso.issuer
    sso.issuer = plain + "/"
    settings.OIDC_ISSUER = sso.issuer
    oidc.forget_provider()
    yield sso
    sso.issuer = plain
    oidc.forget_provider()


def test_an_issuer_that_ends_in_a_slash_signs_in(slash_sso: OidcProvider, settings: Any) -> None:
    client = Client()
    response = sign_in(client)
    assert response.status_code == 302, response.content
    assert signed_in_as(client) == "erin"
    assert OidcIdentity.objects.get(user__username="erin").issuer == slash_sso.issuer
    # Compared exactly, as OpenID Connect Discovery requires: the issuer without its "/" is
    # another issuer, and the refusal says which one the provider names.
    settings.OIDC_ISSUER = slash_sso.issuer.rstrip("/")
    oidc.forget_provider()
    refused = Client().get("/auth/oidc/login/")
    assert refused.status_code == 400
    assert "names the issuer" in refused.content.decode()


def test_the_settings_keep_the_issuer_as_configured() -> None:
    env = {**os.environ, "OIDC_ISSUER": "https://lab.eu.auth0.com/", "OIDC_CLIENT_ID": CLIENT_ID}
    result = subprocess.run(
        [sys.executable, "-c", "import portal.settings as s; print(s.OIDC_ISSUER)"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "https://lab.eu.auth0.com/"


def test_without_an_issuer_there_is_no_single_sign_on(settings: Any, client: Client) -> None:
    settings.OIDC_ISSUER = ""
    assert client.get("/auth/oidc/login/").status_code == 404
    assert client.get("/auth/oidc/callback/", {"state": "x", "code": "y"}).status_code == 404
    assert client.get("/api/v1/session/sso/").json() == {
        "enabled": False,
        "name": settings.OIDC_PROVIDER_NAME,
        "login_url": "",
    }


def test_the_sign_in_page_learns_about_the_provider(sso: OidcProvider, client: Client) -> None:
    assert client.get("/api/v1/session/sso/").json() == {
        "enabled": True,
        "name": "Lab SSO",
        "login_url": "/auth/oidc/login/",
    }


def test_an_unreachable_provider_is_said_plainly(sso: OidcProvider, settings: Any, client: Client) -> None:
    settings.OIDC_ISSUER = "http://127.0.0.1:9/realms/gone"
    oidc.forget_provider()
    response = client.get("/auth/oidc/login/")
    assert response.status_code == 400 and "could not be reached" in response.content.decode()

"""An OpenID Connect provider on loopback for the single sign-on tests.

A real identity provider (Keycloak, Entra ID) cannot run here, so this one serves what the
portal talks to: discovery, the authorization endpoint, the token endpoint and the key set,
over real HTTP. It checks every request the way a provider would (client, redirect URI, PKCE
verifier against the challenge, single-use codes) and records them, so tests can assert the
exact calls. The account it "signs in" is set by the test; the ID token it returns can be
altered (another audience, an expired one, another key or algorithm) to test the refusals.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

CLIENT_ID = "gpu-portal"
CLIENT_SECRET = "portal-client-secret-of-32-bytes-or-more"


def _public_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}


@dataclass
class OidcProvider:
    redirect_uris: list[str] = field(default_factory=list)
    account: dict[str, Any] = field(default_factory=dict)
    # Changes to the next ID tokens' claims (None removes a claim), header and key.
    claim_overrides: dict[str, Any] = field(default_factory=dict)
    header_overrides: dict[str, Any] = field(default_factory=dict)
    sign_with: str = "published"  # "published", "unpublished" (a key not in the set), "secret" (HS256)
    authorize_requests: list[dict[str, str]] = field(default_factory=list)
    token_requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "key-1"
        self.codes: dict[str, dict[str, Any]] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}/realms/lab"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        self.claim_overrides.clear()
        self.header_overrides.clear()
        self.sign_with = "published"
        self.authorize_requests.clear()
        self.token_requests.clear()

    def discovery(self) -> dict[str, Any]:
        # A test may give the issuer a trailing "/", as Auth0's has: the endpoints stay put.
        base = self.issuer.rstrip("/")
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{base}/protocol/openid-connect/auth",
            "token_endpoint": f"{base}/protocol/openid-connect/token",
            "jwks_uri": f"{base}/protocol/openid-connect/certs",
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
        }

    def authorize(self, query: dict[str, str]) -> tuple[int, str]:
        """The browser at the provider, already signed in there: a redirect back with a code,
        or 400 for a request no provider would accept."""
        self.authorize_requests.append(query)
        problems = []
        if query.get("client_id") != CLIENT_ID:
            problems.append("unknown client")
        if query.get("redirect_uri") not in self.redirect_uris:
            problems.append("redirect_uri not registered")
        if query.get("response_type") != "code" or "openid" not in query.get("scope", "").split():
            problems.append("not an OpenID code request")
        if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
            problems.append("no S256 code challenge")
        if problems:
            return 400, "; ".join(problems)
        code = secrets.token_urlsafe(16)
        self.codes[code] = {
            "redirect_uri": query["redirect_uri"],
            "challenge": query["code_challenge"],
            "nonce": query.get("nonce"),
            "account": dict(self.account),
        }
        return 302, f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query.get('state', '')})}"

    def token(self, form: dict[str, str], authorization: str) -> tuple[int, dict[str, Any]]:
        self.token_requests.append({"form": form, "authorization": authorization})
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if authorization != expected:
            return 401, {"error": "invalid_client"}
        grant = self.codes.pop(form.get("code", ""), None)  # single use
        if form.get("grant_type") != "authorization_code" or grant is None:
            return 400, {"error": "invalid_grant"}
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri differs"}
        digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["challenge"]:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verifier does not match"}
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": grant["nonce"],
            **grant["account"],
        }
        for name, value in self.claim_overrides.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        headers = {"kid": self.kid, **self.header_overrides}
        if self.sign_with == "secret":
            id_token = jwt.encode(claims, CLIENT_SECRET, algorithm="HS256", headers=headers)
        else:
            key = self.key if self.sign_with == "published" else self.other_key
            id_token = jwt.encode(claims, key, algorithm="RS256", headers=headers)
        return 200, {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer", "id_token": id_token}


def _handler(provider: OidcProvider) -> type[BaseHTTPRequestHandler]:
    prefix = "/realms/lab"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any = None, location: str = "") -> None:
            payload = json.dumps(body).encode() if isinstance(body, dict) else str(body or "").encode()
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == f"{prefix}/.well-known/openid-configuration":
                self._send(200, provider.discovery())
            elif url.path == f"{prefix}/protocol/openid-connect/certs":
                self._send(200, {"keys": [_public_jwk(provider.key, provider.kid)]})
            elif url.path == f"{prefix}/protocol/openid-connect/auth":
                status, target = provider.authorize(query)
                self._send(status, "" if status == 302 else target, location=target if status == 302 else "")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if urlsplit(self.path).path == f"{prefix}/protocol/openid-connect/token":
                status, body = provider.token(form, self.headers.get("Authorization", ""))
                self._send(status, body)
            else:
                self._send(404, {"error": "not found"})

    return Handler

"""Webhooks: users' own endpoints that hear of their jobs, beside or instead of mail.

A webhook is a URL the portal POSTs to: a chat tool's incoming webhook (format `slack`, a
`{"text": ...}` body that Slack and Mattermost post to a channel) or any receiver of the JSON
event (format `json`, see `event`). With a secret, each delivery is signed (`SIGNATURE_HEADER`).

The portal posts from inside the organisation's network, so a URL is a way to make it send
requests on the user's behalf (SSRF). A host that resolves to a loopback, private, link-local,
multicast or reserved address is refused when the webhook is registered and again at every
delivery (DNS may answer differently later), and the delivery connects to the very address
that was checked, so the name cannot be resolved a second time to something else. Redirects are
never followed (a public receiver could redirect to an internal one). An operator may allow
internal hosts with WEBHOOK_ALLOW_PRIVATE_HOSTS.

Deliveries run in the worker after the change they tell of is committed (portal.jobs.tasks),
with a short timeout; the task tries again later on network errors, 5xx and 429, never on
another answer. Each attempt's outcome is kept on the webhook for its owner to debug with.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from portal.accounts.choices import WebhookFormat
from portal.accounts.models import Webhook
from portal.accounts.services import record_audit

USER_AGENT = "GPU-Portal-Webhooks/1"
EVENT_HEADER = "X-GPU-Portal-Event"
DELIVERY_HEADER = "X-GPU-Portal-Delivery"
TIMESTAMP_HEADER = "X-GPU-Portal-Timestamp"
SIGNATURE_HEADER = "X-GPU-Portal-Signature"

# The events a webhook hears of (the `event` of the JSON body and EVENT_HEADER).
JOB_STATE = "job.state"
JOB_IDLE = "job.idle"
VC_BUDGET = "vc.budget"
TEST = "webhook.test"

# Addresses in these networks carry an IPv4 address a gateway forwards to: checked as that one.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
# The only IPv6 addresses routed on the internet; older forms outside it (IPv4-compatible
# ::a.b.c.d, IPv4-translated ::ffff:0:a.b.c.d, site-local fec0::/10) may reach internal hosts.
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")


class UnsafeUrl(ValueError):
    """A URL the portal will not post to; the message says why, for the user."""


class UnresolvedHost(UnsafeUrl):
    """The host has no address now: at delivery, possibly a passing DNS failure."""


class WebhookLimitReached(Exception):
    """The user has WEBHOOK_MAX_PER_USER webhooks already."""


# ---- addresses


def _parse(url: str) -> SplitResult:
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https"):
        raise UnsafeUrl("Only http and https URLs can be webhooks.")
    if not parts.hostname:
        raise UnsafeUrl("The URL names no host.")
    if not parts.netloc.isascii():
        raise UnsafeUrl("Write the host name in ASCII: its punycode form (xn--...).")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("Put no user name or password in the URL: use a secret to sign deliveries.")
    try:
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError:
        raise UnsafeUrl("The URL's port is not a valid port number.") from None
    try:
        httpx.URL(url.strip())  # what the delivery will send: characters it refuses are refused here
    except httpx.InvalidURL as exc:
        raise UnsafeUrl(f"The URL is not valid: {exc}.") from None
    return parts


def _port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme.lower() == "https" else 80)


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether an address is on the public internet: not loopback, private, link-local,
    multicast, reserved or unspecified (Python's `is_global`, which also leaves out shared and
    documentation ranges), looking through the IPv4 address an IPv6 one may carry."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return is_public(address.ipv4_mapped)
        if address in NAT64:
            return is_public(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address not in GLOBAL_UNICAST_V6:
            return False
    return address.is_global and not address.is_multicast


def _resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise UnresolvedHost(f"The host {host} cannot be resolved.") from None
    # The scope of a link-local IPv6 address (fe80::1%eth0) is no part of the address.
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses:
        raise UnresolvedHost(f"The host {host} cannot be resolved.")
    return list(dict.fromkeys(addresses))


def checked_address(url: str) -> tuple[SplitResult, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The URL's parts and the address to connect to; UnsafeUrl when the portal must not post
    there. Every address the host resolves to must be public (unless the operator allows
    internal hosts), not only the one used: a name with one public and one private address is
    refused."""
    parts = _parse(url)
    addresses = _resolve(parts.hostname or "", _port(parts))
    if not settings.WEBHOOK_ALLOW_PRIVATE_HOSTS:
        internal = [a for a in addresses if not is_public(a)]
        if internal:
            # Which address is not said: the portal's resolver would answer any user's questions
            # about internal names.
            raise UnsafeUrl(
                f"{parts.hostname} is or resolves to a loopback, private, link-local, multicast or "
                "reserved address: the portal posts only to public hosts."
            )
    return parts, addresses[0]


def check_url(url: str) -> None:
    """Refuses (UnsafeUrl) a URL the portal must not post to, at registration."""
    checked_address(url)


# ---- the body and its signature


def event(
    kind: str,
    text: str,
    *,
    job_id: int | None = None,
    job_name: str = "",
    vc: str = "",
    state: str = "",
    reason: str = "",
    url: str = "",
) -> dict[str, Any]:
    """The JSON body of a delivery (documented in docs/api.md, *Webhooks*); `text` says it in a
    sentence, as a chat message would."""
    return {
        "event": kind,
        "job_id": job_id,
        "job_name": job_name,
        "vc": vc,
        "state": state,
        "reason": reason,
        "url": url,
        "time": timezone.now().isoformat().replace("+00:00", "Z"),
        "text": text,
    }


def _slack_escaped(text: str) -> str:
    """Slack reads <...> as links and mentions (<!channel>): a job's name or reason must not."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(format: str, payload: dict[str, Any]) -> bytes:
    if format == WebhookFormat.JSON:
        body = payload
    else:
        text = _slack_escaped(payload["text"])
        body = {"text": f"{text}\n{payload['url']}" if payload["url"] else text}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over `TIMESTAMP.BODY`: the timestamp is signed so that a receiver can refuse
    an old delivery replayed to it."""
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


# ---- delivery


@dataclass(frozen=True)
class Outcome:
    """What one delivery attempt got: the receiver's status, or an error when none came or the
    portal did not post; `retry` says whether another attempt may get further."""

    status: int | None
    error: str = ""
    retry: bool = False

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and not self.error

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.status, "error": self.error, "retry": self.retry}


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {settings.WEBHOOK_TIMEOUT_S} s"
    return f"{type(exc).__name__}: {exc}"[:300]


def post(url: str, format: str, secret: str, payload: dict[str, Any], delivery_id: str) -> Outcome:
    """One POST of `payload` to `url`: no retry here (the task decides), no redirect followed,
    no proxy from the environment (it would connect to the host by name, past the check)."""
    try:
        parts, address = checked_address(url)
    except UnresolvedHost as exc:
        return Outcome(None, str(exc), retry=True)
    except UnsafeUrl as exc:
        return Outcome(None, str(exc))
    body = render(format, payload)
    timestamp = str(int(time.time()))
    headers = {
        "Host": parts.netloc,
        "Content-Type": "application/json",
        "User-Agent": f"{USER_AGENT} (+{settings.PORTAL_URL})",
        EVENT_HEADER: payload["event"],
        DELIVERY_HEADER: delivery_id,
        TIMESTAMP_HEADER: timestamp,
    }
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, timestamp, body)
    host = f"[{address}]" if address.version == 6 else str(address)
    pinned = parts._replace(netloc=f"{host}:{_port(parts)}", fragment="").geturl()
    try:
        client = httpx.Client(timeout=settings.WEBHOOK_TIMEOUT_S, follow_redirects=False, trust_env=False)
        with client:
            request = client.build_request(
                "POST", pinned, content=body, headers=headers, extensions={"sni_hostname": parts.hostname}
            )
            response = client.send(request, stream=True)  # the answer's body is never read
            response.close()
    except httpx.InvalidURL as exc:  # registered before the URL was checked as httpx reads it
        return Outcome(None, f"invalid URL: {exc}")
    except httpx.HTTPError as exc:
        return Outcome(None, _describe(exc), retry=True)
    status = response.status_code
    if 300 <= status < 400:
        return Outcome(status, "redirected: the portal does not follow redirects")
    return Outcome(status, retry=status == 429 or status >= 500)


def record(webhook_id: int, kind: str, outcome: Outcome) -> None:
    Webhook.objects.filter(pk=webhook_id).update(
        last_delivery_at=timezone.now(),
        last_delivery_event=kind,
        last_delivery_status=outcome.status,
        last_delivery_error=outcome.error[:300],
    )


def deliver(webhook_id: int, payload: dict[str, Any], delivery_id: str) -> Outcome | None:
    """One attempt to deliver `payload`, recorded on the webhook; None when the webhook was
    deleted or disabled since the delivery was queued."""
    webhook = Webhook.objects.filter(pk=webhook_id, enabled=True).first()
    if webhook is None:
        return None
    outcome = post(webhook.url, webhook.format, webhook.secret, payload, delivery_id)
    record(webhook.pk, payload["event"], outcome)
    return outcome


def enabled_webhook_ids(user_id: int) -> list[int]:
    return list(Webhook.objects.filter(user_id=user_id, enabled=True).values_list("pk", flat=True))


def has_enabled_webhook(user: Any) -> bool:
    return Webhook.objects.filter(user=user, enabled=True).exists()


def send_test(webhook: Webhook, actor: Any, delivery_id: str) -> Outcome:
    """A test delivery, at once and once (the user waits for its outcome), enabled or not;
    audited like a change, since it makes the portal send a request where the user says."""
    payload = event(
        TEST,
        "A test from the GPU Portal: this webhook works.",
        url=f"{settings.PORTAL_URL.rstrip('/')}/tokens",
    )
    outcome = post(webhook.url, webhook.format, webhook.secret, payload, delivery_id)
    record(webhook.pk, TEST, outcome)
    record_audit(actor, "webhook.test", webhook, detail=str(outcome.status or outcome.error)[:300])
    return outcome


# ---- write paths


@transaction.atomic
def create_webhook(
    user: Any, url: str, format: str = WebhookFormat.SLACK, secret: str = "", enabled: bool = True
) -> Webhook:
    """Registers a webhook (its URL already checked by the caller). The user's row is locked so
    that two requests at once cannot both pass the limit."""
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    if Webhook.objects.filter(user=user).count() >= settings.WEBHOOK_MAX_PER_USER:
        raise WebhookLimitReached(
            f"You have {settings.WEBHOOK_MAX_PER_USER} webhooks, the most allowed: delete one first."
        )
    webhook = Webhook.objects.create(
        user=user, url=url.strip(), format=format, secret=secret, enabled=enabled
    )
    record_audit(user, "webhook.create", webhook)
    return webhook


@transaction.atomic
def update_webhook(webhook: Webhook, actor: Any, **changes: Any) -> Webhook:
    """Changes what is given of url, format, secret (empty: none) and enabled."""
    if "url" in changes:
        changes["url"] = changes["url"].strip()
    for name, value in changes.items():
        setattr(webhook, name, value)
    webhook.save(update_fields=list(changes))
    record_audit(actor, "webhook.update", webhook, detail=", ".join(sorted(changes)))
    return webhook


@transaction.atomic
def delete_webhook(webhook: Webhook, actor: Any) -> None:
    record_audit(actor, "webhook.delete", webhook)
    webhook.delete()

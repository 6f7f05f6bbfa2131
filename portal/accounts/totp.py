"""Time-based one-time passwords (RFC 6238: HOTP of RFC 4226 over 30 s steps, HMAC-SHA1, six
digits), the second factor of Django admin. What authenticator apps expect by default.

Pure functions, no Django. `python -m portal.accounts.totp SECRET` prints the current code for a
base32 secret, like `oathtool --totp -b SECRET` (the demo's admin uses it; see docs/operations.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct
import sys
import time
from urllib.parse import quote, urlencode

STEP_S = 30
DIGITS = 6
# A code is accepted one step before and after the current one: clocks drift, people are slow.
WINDOW = 1


def new_secret() -> str:
    """160 random bits (RFC 4226's recommended length), base32 without padding, as apps take it."""
    return base64.b32encode(secrets.token_bytes(20)).decode("ascii").rstrip("=")


def _key(secret: str) -> bytes:
    cleaned = secret.replace(" ", "").upper()
    return base64.b32decode(cleaned + "=" * (-len(cleaned) % 8))


def step_at(unix_time: float | None = None) -> int:
    return int((time.time() if unix_time is None else unix_time) // STEP_S)


def code_at_step(secret: str, step: int, digits: int = DIGITS) -> str:
    digest = hmac.new(_key(secret), struct.pack(">Q", step), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    number = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(number % 10**digits).zfill(digits)


def matching_step(secret: str, code: str, now_step: int | None = None) -> int | None:
    """The step within the window whose code this is, or None. The caller refuses steps it has
    seen used already (no replay)."""
    code = code.strip().replace(" ", "")
    if len(code) != DIGITS or not code.isdigit():
        return None
    now_step = step_at() if now_step is None else now_step
    for step in range(now_step - WINDOW, now_step + WINDOW + 1):
        if hmac.compare_digest(code_at_step(secret, step), code):
            return step
    return None


def otpauth_uri(secret: str, account: str, issuer: str = "GPU Portal") -> str:
    """The URI authenticator apps import (as a QR code or pasted): Key Uri Format."""
    label = quote(f"{issuer}:{account}")
    query = urlencode(
        {"secret": secret, "issuer": issuer, "algorithm": "SHA1", "digits": DIGITS, "period": STEP_S}
    )
    return f"otpauth://totp/{label}?{query}"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m portal.accounts.totp BASE32_SECRET")
    print(code_at_step(sys.argv[1], step_at()))

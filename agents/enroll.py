"""Enrollment: on its first start the agent exchanges a one-time enrollment token for its
node's own token (``POST <portal>/agent/enroll/``) and keeps that in its state directory,
readable by its owner only. Later starts use the stored token; the enrollment token is
then spent and useless.

Standard library only (urllib): the agent needs no HTTP client otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

TOKEN_FILE = "node.token"
ENROLL_PATH = "/agent/enroll/"


class EnrollmentRefused(Exception):
    """The portal refused the enrollment token (unknown, used, expired, or not for this node).
    Trying again cannot help: an admin must create a new token."""


def enroll_url(agent_ws_url: str) -> str:
    """``ws(s)://host/[prefix/]ws/agent/`` -> ``http(s)://host/[prefix/]agent/enroll/``."""
    parts = urlsplit(agent_ws_url)
    scheme = {"ws": "http", "wss": "https"}[parts.scheme]
    prefix = parts.path.rstrip("/").removesuffix("/ws/agent")
    return urlunsplit((scheme, parts.netloc, prefix + ENROLL_PATH, "", ""))


def stored_token_path(state_dir: Path) -> Path:
    return state_dir / TOKEN_FILE


def read_stored_token(state_dir: Path) -> str:
    """The node token kept by an earlier enrollment, or ''."""
    try:
        return stored_token_path(state_dir).read_text().strip()
    except FileNotFoundError:
        return ""


def store_token(state_dir: Path, token: str) -> Path:
    """Writes the token with mode 0600 from the start (never world-readable, not even for a
    moment) and renames it into place, so a crash never leaves half a token."""
    path = stored_token_path(state_dir)
    temporary = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return path


def request_node_token(url: str, enroll_token: str, node_name: str, timeout_s: float = 30.0) -> str:
    """One enrollment request. Raises EnrollmentRefused on 400/401/403 and OSError (including
    urllib's errors) when the portal could not be reached or failed."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"node_name": node_name}).encode(),
        headers={"Authorization": f"Bearer {enroll_token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            token = json.loads(response.read()).get("token", "")
    except urllib.error.HTTPError as error:
        if error.code in (400, 401, 403):
            detail = error.read().decode(errors="replace")[:500]
            raise EnrollmentRefused(f"HTTP {error.code}: {detail}") from None
        raise
    if not isinstance(token, str) or not token:
        raise OSError("the portal's enrollment answer holds no token")
    return token


def enroll(
    agent_ws_url: str,
    enroll_token: str,
    node_name: str,
    state_dir: Path,
    next_delay: Callable[[], float],
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Enrolls, retrying while the portal cannot be reached (it may be starting too), stores
    the node token and returns it. A refusal ends the attempt with EnrollmentRefused."""
    url = enroll_url(agent_ws_url)
    while True:
        try:
            token = request_node_token(url, enroll_token, node_name)
        except OSError as error:  # not EnrollmentRefused, which ends the attempt
            delay = next_delay()
            log.warning("cannot enroll at %s (%s); retrying in %.1f s", url, error, delay)
            sleep(delay)
            continue
        path = store_token(state_dir, token)
        log.info("enrolled as node %s; the node token is kept in %s", node_name, path)
        return token

"""Where the CLI keeps the portal URL and the API token.

The file is ``$XDG_CONFIG_HOME/gpuportal/config.json`` (``~/.config/gpuportal/config.json``
by default), readable by its owner only, because the token acts as the user.
``GPUPORTAL_URL`` and ``GPUPORTAL_TOKEN`` override it, which is what CI jobs and
containers use.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV_URL = "GPUPORTAL_URL"
ENV_TOKEN = "GPUPORTAL_TOKEN"
ENV_CONFIG = "GPUPORTAL_CONFIG"


class ConfigError(Exception):
    """The configuration file exists but cannot be used."""


@dataclass(frozen=True)
class Settings:
    url: str | None
    token: str | None
    username: str | None = None
    source: str = "none"  # where the token came from: env, file or none


def config_path() -> Path:
    """The config file; ``GPUPORTAL_CONFIG`` names another one (for several portals)."""
    explicit = os.environ.get(ENV_CONFIG)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuportal" / "config.json"


def read_file(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return {str(k): str(v) for k, v in data.items() if v is not None}


def load(url_override: str | None = None) -> Settings:
    """The effective settings: command-line URL, then environment, then the file."""
    stored = read_file()
    env_url, env_token = os.environ.get(ENV_URL), os.environ.get(ENV_TOKEN)
    url = url_override or env_url or stored.get("url")
    if env_token:
        return Settings(url=_clean(url), token=env_token, source="env")
    token = stored.get("token")
    # A stored token belongs to the stored URL; never send it to another portal.
    if token and url and _clean(url) != _clean(stored.get("url")):
        token = None
    return Settings(
        url=_clean(url), token=token, username=stored.get("username"), source="file" if token else "none"
    )


def save(url: str, token: str, username: str | None = None, path: Path | None = None) -> Path:
    """Store the URL, the token and the user name (see :func:`_write` for how)."""
    path = path or config_path()
    data = {"url": _clean(url) or "", "token": token}
    if username:
        data["username"] = username
    _write(path, data)
    return path


def forget(path: Path | None = None) -> bool:
    """Remove the stored token and user name; True when there was a token.

    The URL stays, as `gpuportal login` documents it ("remembered, so later logins can leave
    it out"). A file that cannot be read is removed whole: it may hold a token, and nothing in
    it can be kept."""
    path = path or config_path()
    try:
        stored = read_file(path)
    except ConfigError:
        path.unlink(missing_ok=True)
        return True
    if "token" not in stored:
        return False
    kept = {key: value for key, value in stored.items() if key not in ("token", "username")}
    _write(path, kept)
    return True


def _write(path: Path, data: dict[str, str]) -> None:
    """Write the file with mode 600 from the start (never world-readable, even briefly), to a
    temporary file that is flushed to disk before it replaces the old one: a crash then leaves
    the old file or the new one, never an empty or half-written file where the rename reached
    the disk before the data."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o600)  # in case the file existed with wider permissions
    os.replace(temporary, path)


def _clean(url: str | None) -> str | None:
    return url.rstrip("/") if url else None

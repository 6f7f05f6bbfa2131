"""Typed readers for settings from environment variables.

Settings come from the environment only (12-factor). Each reader fails fast with the variable's
name when a value cannot be parsed, and `VAR_FILE` may point to a file holding a secret.
"""

from __future__ import annotations

import base64
import hashlib
import os
from urllib.parse import unquote, urlsplit


class ConfigError(RuntimeError):
    pass


def env_str(name: str, default: str | None = None) -> str:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        with open(file_path, encoding="utf-8") as f:
            return f.read().strip()
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ConfigError(f"environment variable {name} is required")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"environment variable {name} must be true or false, not {value!r}")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, not {value!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def parse_database_url(url: str) -> dict[str, object]:
    """Turns postgres://user:pass@host:port/name into a Django DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ConfigError(f"DATABASE_URL must be a postgres:// URL, not {parts.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }


def development_fernet_key(secret_key: str) -> str:
    """The throw-away encryption key of DEBUG settings, derived from SECRET_KEY so that `make up`
    needs none. Never used when DEBUG is off: FIELD_ENCRYPTION_KEYS is required there."""
    digest = hashlib.sha256(b"gpuportal field encryption\0" + secret_key.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()


def env_fernet_keys(name: str, default: str | None = None) -> list[str]:
    """Comma-separated Fernet keys (may come from NAME_FILE): the first encrypts, all decrypt.

    Each key must be 32 url-safe base64-encoded bytes, as `Fernet.generate_key()` makes them.
    """
    from cryptography.fernet import Fernet

    keys = [key.strip() for key in env_str(name, default).split(",") if key.strip()]
    if not keys:
        raise ConfigError(f"environment variable {name} needs at least one key")
    for position, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except ValueError:
            raise ConfigError(
                f"environment variable {name}: key {position} is not a Fernet key (32 url-safe "
                "base64-encoded bytes; make one with `python manage.py rotate_encryption_keys --new-key`)"
            ) from None
    return keys

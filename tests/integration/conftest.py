"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from portal.accounts.services import create_api_token


@pytest.fixture
def alice_api(live_stack: dict[str, Any], users: dict[str, Any]) -> httpx.Client:
    """The REST API of the live stack, as alice with an API token (as a script or the CLI)."""
    _, token = create_api_token(users["alice"], "e2e")
    return httpx.Client(base_url=live_stack["http"], headers={"Authorization": f"Bearer {token}"}, timeout=10)

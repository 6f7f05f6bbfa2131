"""Signing in through the single sign-on provider in the browser: the sign-in page offers it,
the provider (tests/oidc_provider.py, on loopback) sends the browser back, and the page that
asked for the sign-in opens with the new user signed in. A portal without a provider offers
only the password form (every other browser test signs in that way)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import BROWSER_TEST, LONG
from tests.conftest import free_port, web_server
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider

pytestmark = BROWSER_TEST


@pytest.fixture(scope="module")
def sso_portal(django_db_setup: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """A web server of its own (the live stack has no provider), set up for the provider."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    provider = OidcProvider(redirect_uris=[f"{base}/auth/oidc/callback/"])
    settings = {
        "PORTAL_URL": base,
        "OIDC_ISSUER": provider.issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_PROVIDER_NAME": "Lab SSO",
    }
    try:
        with web_server(tmp_path_factory.mktemp("sso-server"), port, **settings):
            yield {"http": base, "provider": provider}
    finally:
        provider.stop()


@sync_to_async
def linked_user(subject: str) -> str | None:
    from django.db import connection

    from portal.accounts.models import OidcIdentity

    try:
        identity = OidcIdentity.objects.select_related("user").filter(subject=subject).first()
        return identity.user.username if identity is not None else None
    finally:
        connection.close()


async def test_a_researcher_signs_in_with_the_provider(sso_portal: dict[str, Any], page: Page) -> None:
    provider = sso_portal["provider"]
    provider.account = {"sub": "lab-4711", "preferred_username": "hana", "email": "hana@lab.example"}
    await page.goto(sso_portal["http"] + "/jobs")
    await expect(page.get_by_label("Password")).to_be_visible(timeout=LONG)
    await page.get_by_role("link", name="Sign in with Lab SSO").click()
    await expect(page.get_by_role("heading", name="Jobs")).to_be_visible(timeout=LONG)
    assert page.url == sso_portal["http"] + "/jobs"
    await expect(page.get_by_role("banner").get_by_text("hana")).to_be_visible()
    assert await linked_user("lab-4711") == "hana"
    assert len(provider.token_requests) == 1


async def test_without_a_provider_the_page_offers_only_passwords(
    live_stack: dict[str, Any], page: Page
) -> None:
    async with page.expect_response(lambda r: r.url.endswith("/api/v1/session/sso/")) as answered:
        await page.goto(live_stack["http"] + "/")
    assert (await (await answered.value).json())["enabled"] is False
    await expect(page.get_by_label("Password")).to_be_visible(timeout=LONG)
    await expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    await expect(page.get_by_text("Sign in with")).to_have_count(0)

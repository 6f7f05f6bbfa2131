"""`gpuportal webhooks` against the live portal: add (with a secret from stdin), list, test
against a real receiver on loopback (signed; a failed test exits 1), remove; another user's
webhook reads as not found."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from portal.accounts.models import Webhook
from portal.accounts.services import create_api_token
from tests.webhook_receiver import running_receiver

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tokens(users: dict[str, Any]) -> dict[str, str]:
    return {name: create_api_token(users[name], "webhooks test")[1] for name in ("alice", "bob")}


def test_add_list_test_and_remove(run_cli: Any, tokens: dict[str, str]) -> None:
    alice = tokens["alice"]
    with running_receiver() as receiver:
        hook_url = receiver.url + "/cli"
        refused = run_cli(alice, "webhooks", "add", "ftp://example.org/hook")
        assert refused.returncode == 2, refused.stderr
        assert "url: Only http and https URLs can be webhooks." in refused.stderr

        added = run_cli(
            alice,
            "webhooks",
            "add",
            hook_url,
            "--format",
            "json",
            "--secret-stdin",
            "-o",
            "json",
            input="s3cret\n",
        )
        assert added.returncode == 0, added.stderr
        hook = json.loads(added.stdout)
        assert hook["url"] == hook_url and hook["format"] == "json" and hook["has_secret"] is True
        assert "secret" not in hook
        assert Webhook.objects.get(pk=hook["id"]).secret == "s3cret"

        listed = run_cli(alice, "webhooks", "list")
        assert listed.returncode == 0, listed.stderr
        assert hook_url in listed.stdout and "none yet" in listed.stdout

        tested = run_cli(alice, "webhooks", "test", str(hook["id"]))
        assert tested.returncode == 0, tested.stderr
        assert f"Test delivered to {hook_url}: ok, HTTP 200" in tested.stderr and not tested.stdout
        [delivery] = receiver.to("/cli")
        timestamp = delivery.headers["X-GPU-Portal-Timestamp"]
        mac = hmac.new(b"s3cret", timestamp.encode() + b"." + delivery.body, hashlib.sha256).hexdigest()
        assert delivery.headers["X-GPU-Portal-Signature"] == f"sha256={mac}"

        receiver.answer(404)
        failed = run_cli(alice, "webhooks", "test", str(hook["id"]))
        assert failed.returncode == 1
        assert "Test failed" in failed.stderr and "HTTP 404" in failed.stderr
        assert "failed, HTTP 404" in run_cli(alice, "webhooks", "list").stdout

        foreign = run_cli(tokens["bob"], "webhooks", "test", str(hook["id"]))
        assert foreign.returncode == 3 and f"webhook {hook['id']} not found" in foreign.stderr
        assert len(receiver.to("/cli")) == 2

        removed = run_cli(alice, "webhooks", "remove", str(hook["id"]))
        assert removed.returncode == 0 and f"Webhook {hook['id']} removed." in removed.stderr
        assert not removed.stdout
        assert not Webhook.objects.exists()
        assert "No webhooks" in run_cli(alice, "webhooks", "list").stderr

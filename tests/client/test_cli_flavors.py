"""`gpuportal flavors` and `gpuportal priority-classes` against a real portal: what a job spec's
`flavor` and `priority` may name, as the demo seed defines them, and the API's objects as JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from portal.accounts.services import create_api_token

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def alice_token(users: dict[str, Any]) -> str:
    return create_api_token(users["alice"], "flavors test")[1]


def rows(stdout: str) -> list[list[str]]:
    """Each line's cells; no cell of these tables but DESCRIPTION holds a space."""
    return [line.split() for line in stdout.splitlines()]


def from_api(user: Any, path: str) -> list[dict[str, Any]]:
    client = APIClient()
    client.force_authenticate(user)
    return client.get(path).json()["results"]


def test_flavors_lists_the_demo_flavors(run_cli, alice_token, users) -> None:  # type: ignore[no-untyped-def]
    shown = run_cli(alice_token, "flavors")
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""
    assert rows(shown.stdout) == [
        ["FLAVOR", "MODEL", "GPUS", "CPUS", "MEMORY", "GB", "MAX", "TIME", "LIMIT"],
        ["s-A100", "A100", "2", "64", "256", "72h"],
        ["m-A100", "A100", "4", "128", "512", "168h"],
        ["l-A100", "A100", "8", "256", "1024", "336h"],
        ["s-V100", "V100", "2", "20", "128", "72h"],
        ["m-V100", "V100", "4", "40", "256", "168h"],
        ["l-V100", "V100", "8", "80", "512", "336h"],
    ]
    as_json = run_cli(alice_token, "flavors", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == from_api(users["alice"], "/api/v1/flavors/")


def test_priority_classes_lists_the_demo_classes(run_cli, alice_token, users) -> None:  # type: ignore[no-untyped-def]
    shown = run_cli(alice_token, "priority-classes")
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""
    assert [row[:5] for row in rows(shown.stdout)[1:]] == [
        ["production", "1000", "no", "yes", "no"],
        ["training", "500", "yes", "no", "yes"],
        ["dev", "100", "yes", "no", "no"],
        ["opportunistic", "0", "yes", "no", "no"],
    ]
    assert "Serving and deadline work; never preempted. Tenant admins only." in shown.stdout
    as_json = run_cli(alice_token, "priority-classes", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == from_api(users["alice"], "/api/v1/priority-classes/")


def test_without_a_token_both_exit_4(run_cli) -> None:  # type: ignore[no-untyped-def]
    for command in ("flavors", "priority-classes"):
        refused = run_cli("gpp_made_up", command)
        assert refused.returncode == 4, refused.stderr
        assert refused.stdout == ""
        assert "Sign in again with `gpuportal login`." in refused.stderr

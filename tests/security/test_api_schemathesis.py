"""Property-based calls to every operation of the OpenAPI schema (/api/v1/schema/), generated
by Schemathesis, as a user of each tenant (reliability-security.md B2): no 5xx, answers that
match the schema, and nothing stored after a 4xx. Examples are derandomized, so a run is
repeatable, and few per operation, so it stays short."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance

pytestmark = pytest.mark.django_db

CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture
def api_schema(tokens: dict[str, str]) -> Iterator[Any]:
    """The schema, and calls, through the WSGI application in this process. As in Django's test
    client, requests do not close the database connection: it holds the test's transaction.
    (After the tokens: Django's test client, which makes them, connects the signals again.)"""
    from django.core import signals
    from django.db import close_old_connections

    from portal.wsgi import application

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/v1/schema/?format=json", application)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def operations() -> list[tuple[str, str]]:
    """(path, method) of every operation in the schema, as the portal generates it."""
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return [(path, method.upper()) for path, methods in paths.items() for method in methods]


@pytest.fixture
def tokens(users: dict[str, Any], small_job: dict[str, Any]) -> dict[str, str]:
    """A token for a user of each tenant, and a job of each, so that ids the examples try may
    name an object of the other tenant."""
    from rest_framework.test import APIClient

    from portal.accounts.services import create_api_token

    for username, vc, flavor in (("alice", "vision", "s-A100"), ("carol", "speech", "s-V100")):
        client = APIClient()
        client.force_authenticate(users[username])
        spec = {**small_job, "vc": vc, "flavor": flavor}
        assert client.post("/api/v1/jobs/", spec, format="json").status_code == 201
    return {username: create_api_token(users[username], "schemathesis")[1] for username in ("alice", "carol")}


def stored() -> tuple[Any, ...]:
    """Everything an API call could write, in a form that shows any change. A refused write
    leaves its audit entry, and repeated refusals an alert (portal.accounts.security): those
    are the only writes a 4xx may make."""
    from django.db.models import Q

    from portal.accounts.models import ApiToken, AuditEntry
    from portal.accounts.security import ALERT, DENIED
    from portal.cluster.models import Node
    from portal.jobs.models import Job, JobAttempt, JobEvent

    return (
        list(Job.objects.order_by("pk").values_list("pk", "state", "version")),
        JobEvent.objects.count(),
        JobAttempt.objects.count(),
        list(ApiToken.objects.order_by("pk").values_list("pk", "revoked_at")),
        AuditEntry.objects.exclude(Q(action__endswith=DENIED) | Q(action=ALERT)).count(),
        list(Node.objects.order_by("pk").values_list("pk", "state")),
    )


@pytest.mark.parametrize(("path", "method"), operations(), ids=[f"{m} {p}" for p, m in operations()])
def test_every_operation_as_a_user_of_each_tenant(api_schema, tokens, path, method) -> None:  # type: ignore[no-untyped-def]
    operation = api_schema[path][method]

    @given(case=operation.as_strategy())
    @settings(
        max_examples=8,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call_as_each_tenant(case: Any) -> None:
        for username in ("alice", "carol"):
            before = stored()
            response = case.call(headers={"Authorization": f"Bearer {tokens[username]}"})
            case.validate_response(response, checks=CHECKS)
            if 400 <= response.status_code < 500:
                what = f"{case.method} {case.formatted_path} as {username}: {response.status_code}"
                assert stored() == before, f"{what}, yet something was written"

    call_as_each_tenant()

"""Walks every API route and action as the job's owner, a member of the same tenant, a viewer,
a user of another tenant and an anonymous caller. A new route fails this test until it is added."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db

ROLES = [
    "alice",
    "bob",
    "victor",
    "carol",
    None,
]  # owner, same-tenant member, viewer, other tenant, anonymous

# (method, route, {role: expected status}); {job}, {token}, {flavor}, {pc} are filled in per test.
CASES: list[tuple[str, str, dict[str | None, int]]] = [
    ("get", "/api/v1/jobs/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("post", "/api/v1/jobs/", {"alice": 201, "bob": 201, "victor": 403, "carol": 400, None: 401}),
    ("post", "/api/v1/jobs/bulk/", {"alice": 201, "bob": 201, "victor": 403, "carol": 400, None: 401}),
    ("post", "/api/v1/jobs/dry-run/", {"alice": 200, "bob": 200, "victor": 403, "carol": 400, None: 401}),
    ("get", "/api/v1/jobs/{job}/", {"alice": 200, "bob": 200, "victor": 200, "carol": 404, None: 401}),
    ("get", "/api/v1/jobs/{job}/events/", {"alice": 200, "bob": 200, "victor": 200, "carol": 404, None: 401}),
    ("get", "/api/v1/jobs/{job}/logs/", {"alice": 200, "bob": 200, "victor": 200, "carol": 404, None: 401}),
    (
        "get",
        "/api/v1/jobs/{job}/telemetry/",
        {"alice": 200, "bob": 200, "victor": 200, "carol": 404, None: 401},
    ),
    (
        "post",
        "/api/v1/jobs/{job}/top/",
        {"alice": 200, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    (
        "post",
        "/api/v1/jobs/{job}/hold/",
        {"alice": 200, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    # The job is not held: its owner hears 409, everyone else what they hear for hold.
    (
        "post",
        "/api/v1/jobs/{job}/release/",
        {"alice": 409, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    # No body: the owner hears what is missing, everyone else what they hear for hold.
    (
        "post",
        "/api/v1/jobs/{job}/time-limit/",
        {"alice": 400, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    (
        "post",
        "/api/v1/jobs/{job}/cancel/",
        {"alice": 200, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    ("get", "/api/v1/templates/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("post", "/api/v1/templates/", {"alice": 201, "bob": 201, "victor": 403, "carol": 400, None: 401}),
    # alice's template is shared: her tenant's members see it, only she changes it.
    (
        "get",
        "/api/v1/templates/{template}/",
        {"alice": 200, "bob": 200, "victor": 200, "carol": 404, None: 401},
    ),
    (
        "put",
        "/api/v1/templates/{template}/",
        {"alice": 200, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    (
        "patch",
        "/api/v1/templates/{template}/",
        {"alice": 200, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    (
        "delete",
        "/api/v1/templates/{template}/",
        {"alice": 204, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    ("get", "/api/v1/virtual-clusters/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    (
        "get",
        "/api/v1/virtual-clusters/vision/",
        {"alice": 200, "bob": 200, "victor": 200, "carol": 404, None: 401},
    ),
    ("get", "/api/v1/flavors/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("get", "/api/v1/flavors/{flavor}/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("get", "/api/v1/priority-classes/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    (
        "get",
        "/api/v1/priority-classes/{pc}/",
        {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401},
    ),
    ("get", "/api/v1/nodes/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("get", "/api/v1/nodes/a100-node-1/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    (
        "post",
        "/api/v1/nodes/a100-node-1/state/",
        {"alice": 403, "bob": 403, "victor": 403, "carol": 403, None: 401},
    ),
    ("get", "/api/v1/tokens/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("post", "/api/v1/tokens/", {"alice": 201, "bob": 201, "victor": 201, "carol": 201, None: 401}),
    ("get", "/api/v1/tokens/{token}/", {"alice": 200, "bob": 404, "victor": 404, "carol": 404, None: 401}),
    ("delete", "/api/v1/tokens/{token}/", {"alice": 200, "bob": 404, "victor": 404, "carol": 404, None: 401}),
    ("get", "/api/v1/webhooks/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("post", "/api/v1/webhooks/", {"alice": 201, "bob": 201, "victor": 201, "carol": 201, None: 401}),
    (
        "get",
        "/api/v1/webhooks/{webhook}/",
        {"alice": 200, "bob": 404, "victor": 404, "carol": 404, None: 401},
    ),
    (
        "patch",
        "/api/v1/webhooks/{webhook}/",
        {"alice": 200, "bob": 404, "victor": 404, "carol": 404, None: 401},
    ),
    # The webhook's loopback URL is refused at delivery: its owner hears so, and nothing is sent.
    (
        "post",
        "/api/v1/webhooks/{webhook}/test/",
        {"alice": 200, "bob": 404, "victor": 404, "carol": 404, None: 401},
    ),
    (
        "delete",
        "/api/v1/webhooks/{webhook}/",
        {"alice": 204, "bob": 404, "victor": 404, "carol": 404, None: 401},
    ),
    # Nobody signed in is an answer here (204), not a refusal; /me/ below still refuses.
    ("get", "/api/v1/session/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 204}),
    ("get", "/api/v1/session/sso/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 200}),
    ("get", "/api/v1/usage/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("get", "/api/v1/me/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    ("get", "/api/v1/tenants/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 401}),
    (
        "get",
        "/api/v1/tenants/vision/members/",
        {"alice": 200, "bob": 200, "victor": 200, "carol": 404, None: 401},
    ),
    # Only the tenant's admins change its members (tests/portal/test_tenant_members.py).
    (
        "post",
        "/api/v1/tenants/vision/members/",
        {"alice": 403, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    (
        "patch",
        "/api/v1/tenants/vision/members/{member}/",
        {"alice": 403, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    (
        "delete",
        "/api/v1/tenants/vision/members/{member}/",
        {"alice": 403, "bob": 403, "victor": 403, "carol": 404, None: 401},
    ),
    ("get", "/api/v1/schema/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 200}),
    ("get", "/api/v1/docs/", {"alice": 200, "bob": 200, "victor": 200, "carol": 200, None: 200}),
]

BODIES = {
    "/api/v1/jobs/": {"name": "x", "vc": "vision", "flavor": "s-A100", "command": "true"},
    "/api/v1/jobs/dry-run/": {"name": "x", "vc": "vision", "flavor": "s-A100", "command": "true"},
    "/api/v1/jobs/bulk/": {
        "job": {"name": "x", "vc": "vision", "flavor": "s-A100", "command": "true"},
        "array": 2,
    },
    "/api/v1/templates/": {
        "name": "x",
        "spec": {"name": "x", "vc": "vision", "flavor": "s-A100", "command": "true"},
    },
    # Its own name: a GET sends this body as its query, and `name` filters.
    "/api/v1/templates/{template}/": {
        "name": "train",
        "spec": {"name": "y", "vc": "vision", "flavor": "s-A100", "command": "true"},
    },
    "/api/v1/tokens/": {"name": "ci"},
    "/api/v1/webhooks/": {"url": "https://93.184.215.14/hook"},  # registration looks nothing up
    "/api/v1/webhooks/{webhook}/": {"enabled": False},
    "/api/v1/nodes/a100-node-1/state/": {"action": "cordon"},
    "/api/v1/tenants/vision/members/": {"username": "dave", "role": "member"},
    "/api/v1/tenants/vision/members/{member}/": {"role": "admin"},
}


@pytest.fixture
def objects(api_for: Any, users: Any, small_job: dict[str, Any]) -> dict[str, Any]:
    from portal.accounts.models import Webhook
    from portal.cluster.models import Flavor, PriorityClass
    from tests.conftest import free_port

    job = api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"]
    token = api_for("alice").post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()["id"]
    webhook = Webhook.objects.create(user=users["alice"], url=f"http://127.0.0.1:{free_port()}/hook")
    template = api_for("alice").post(
        "/api/v1/templates/", {"name": "train", "spec": small_job, "shared": True}, format="json"
    )
    return {
        "template": template.json()["id"],
        "job": job,
        "token": token,
        "webhook": webhook.pk,
        "flavor": Flavor.objects.first().pk,
        "pc": PriorityClass.objects.first().pk,
        "member": "bob",
    }


def case_id(case: tuple[str, str, Any]) -> str:
    return f"{case[0].upper()} {case[1]}"


@pytest.mark.parametrize("role", ROLES, ids=[r or "anonymous" for r in ROLES])
@pytest.mark.parametrize(("method", "route", "expected"), CASES, ids=[case_id(c) for c in CASES])
def test_every_route_answers_each_role_as_expected(api_for, objects, role, method, route, expected) -> None:  # type: ignore[no-untyped-def]
    url = route.format(**objects)
    response = getattr(api_for(role), method)(url, BODIES.get(route), format="json")
    assert response.status_code == expected[role], (url, role, response.content[:300])
    if response.status_code == 404:  # in the API's words, not Django's ("No Job matches ...")
        assert b"matches the given query" not in response.content, (url, role, response.content)


def test_other_tenants_see_nothing_of_vision_in_lists(api_for, objects) -> None:  # type: ignore[no-untyped-def]
    carol = api_for("carol")
    assert carol.get("/api/v1/jobs/").json()["count"] == 0
    assert [vc["name"] for vc in carol.get("/api/v1/virtual-clusters/").json()["results"]] == ["speech"]
    assert carol.get(f"/api/v1/jobs/?q={objects['job']}").json()["count"] == 0
    assert carol.get("/api/v1/tokens/").json()["count"] == 0
    assert carol.get("/api/v1/webhooks/").json()["count"] == 0
    assert carol.get("/api/v1/templates/").json()["count"] == 0
    # A job id of another tenant answers exactly like an id that does not exist.
    missing = carol.get("/api/v1/jobs/999999/")
    foreign = carol.get(f"/api/v1/jobs/{objects['job']}/")
    assert (missing.status_code, missing.json()) == (404, {"detail": "No job 999999."})
    assert (foreign.status_code, foreign.json()) == (404, {"detail": f"No job {objects['job']}."})
    # Submitting to another tenant's VC reads the same as a VC that does not exist.
    spec = {"name": "x", "flavor": "s-A100", "command": "true"}
    foreign_vc = carol.post("/api/v1/jobs/", {**spec, "vc": "vision"}, format="json").json()["vc"][0]
    missing_vc = carol.post("/api/v1/jobs/", {**spec, "vc": "nope"}, format="json").json()["vc"][0]
    assert foreign_vc.replace("'vision'", "X") == missing_vc.replace("'nope'", "X")


def test_another_tenants_object_answers_exactly_as_once_it_is_gone(api_for, objects) -> None:  # type: ignore[no-untyped-def]
    """The 404 names what was asked for in the API's words, from the URL alone: the same status
    and body before and after the object is deleted, so nobody learns whether it exists."""
    from portal.accounts.models import ApiToken, Webhook
    from portal.jobs.models import Job, JobTemplate

    job, template, token, webhook = (objects[k] for k in ("job", "template", "token", "webhook"))
    asked = {
        ("carol", "get", f"/api/v1/jobs/{job}/"): f"No job {job}.",
        ("carol", "post", f"/api/v1/jobs/{job}/cancel/"): f"No job {job}.",
        ("carol", "get", f"/api/v1/jobs/{job}/logs/"): f"No job {job}.",
        ("carol", "get", f"/api/v1/templates/{template}/"): f"No job template {template}.",
        ("carol", "delete", f"/api/v1/templates/{template}/"): f"No job template {template}.",
        ("bob", "get", f"/api/v1/tokens/{token}/"): f"No API token {token}.",
        ("bob", "patch", f"/api/v1/webhooks/{webhook}/"): f"No webhook {webhook}.",
        ("carol", "get", "/api/v1/virtual-clusters/vision/"): "No virtual cluster named 'vision'.",
    }

    def answers() -> dict[tuple[str, str, str], tuple[int, Any]]:
        out = {}
        for user, method, url in asked:
            response = getattr(api_for(user), method)(url, {}, format="json")
            out[user, method, url] = (response.status_code, response.json())
        return out

    foreign = answers()
    assert foreign == {key: (404, {"detail": words}) for key, words in asked.items()}
    Job.objects.filter(pk=job).delete()
    JobTemplate.objects.filter(pk=template).delete()
    ApiToken.objects.filter(pk=token).delete()
    Webhook.objects.filter(pk=webhook).delete()
    gone = answers()
    vc = ("carol", "get", "/api/v1/virtual-clusters/vision/")
    assert {k: v for k, v in gone.items() if k != vc} == {k: v for k, v in foreign.items() if k != vc}
    missing = api_for("carol").get("/api/v1/virtual-clusters/nope/")
    assert (missing.status_code, missing.json()) == (404, {"detail": "No virtual cluster named 'nope'."})
    # Objects every user sees: a missing one is named the same way.
    for url, words in (
        ("/api/v1/nodes/nope/", "No node named 'nope'."),
        ("/api/v1/flavors/999999/", "No flavor 999999."),
        ("/api/v1/priority-classes/999999/", "No priority class 999999."),
        ("/api/v1/jobs/abc/", "No job 'abc'."),
    ):
        response = api_for("alice").get(url)
        assert (response.status_code, response.json()) == (404, {"detail": words}), url


def test_node_listing_shows_allocation_but_not_whose(api_for, objects) -> None:  # type: ignore[no-untyped-def]
    """A GPU names its job only to that job's tenant (tests/portal/test_node_readings.py)."""
    node = api_for("carol").get("/api/v1/nodes/a100-node-1/").json()
    assert set(node["gpus"][0]) >= {"uuid", "model", "allocated", "healthy"}
    assert not any(key in node["gpus"][0] for key in ("owner", "tenant"))
    assert all(gpu["job"] is None for gpu in node["gpus"])


def api_routes() -> set[str]:
    """Every route under /api/v1/ as a pattern string, taken from the URL resolver."""
    found: set[str] = set()

    def walk(patterns: Any, prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                found.add(prefix + str(p.pattern))

    walk(get_resolver().url_patterns, "")
    return {r for r in found if r.startswith("api/v1/") and "format" not in r}


def test_the_table_covers_every_api_route() -> None:
    import re

    def normalise(route: str) -> str:
        route = route.replace("^", "").replace("$", "")
        return re.sub(r"\(\?P<[^>]+>[^)]*\)|<[^>]+>", "{}", route)

    covered = {normalise(re.sub(r"\{[a-z]+\}|vision|a100-node-1", "{}", c[1].lstrip("/"))) for c in CASES}
    missing = {normalise(r) for r in api_routes()} - covered
    assert not missing, f"routes without an isolation case: {sorted(missing)}"


def test_session_auth_requires_csrf(users) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(users["alice"])
    spec = {"name": "x", "vc": "vision", "flavor": "s-A100", "command": "true"}
    assert client.post("/api/v1/jobs/", spec, content_type="application/json").status_code == 403
    client.get("/api/v1/me/")  # any page; the CSRF cookie comes from get_token below
    from django.middleware.csrf import _get_new_csrf_string

    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    response = client.post("/api/v1/jobs/", spec, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201


def test_signing_in_needs_the_csrf_token_too(users: dict[str, Any]) -> None:
    """Login CSRF: another site's HTML form posting the attacker's name and password would
    sign the visitor in as the attacker. The web app and `gpuportal login` GET the session
    first for the cookie and send it back in X-CSRFToken."""
    from django.test import Client

    users["alice"].set_password("alice-pass")
    users["alice"].save()
    credentials = {"username": "alice", "password": "alice-pass"}
    victim = Client(enforce_csrf_checks=True)
    cross_site = victim.post("/api/v1/session/", credentials)  # form-encoded, no cookie, no header
    assert cross_site.status_code == 403 and "CSRF" in cross_site.json()["detail"]
    assert victim.get("/api/v1/session/").status_code == 204  # nobody signed in; sets the CSRF cookie
    as_the_app_does = victim.post(
        "/api/v1/session/",
        credentials,
        content_type="application/json",
        HTTP_X_CSRFTOKEN=victim.cookies["csrftoken"].value,
    )
    assert as_the_app_does.status_code == 200 and as_the_app_does.json()["username"] == "alice"

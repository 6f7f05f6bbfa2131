"""A typed client of the portal's REST API (``/api/v1/``), used by the CLI.

Every failure the caller can act on is a :class:`PortalError` subclass with an ``exit_code``,
so scripts can catch one class and the CLI can turn it into a message and an exit status
without a stack trace.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from datetime import date
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import httpx
import yaml
from pydantic import BaseModel

from gpuportal.models import (
    TERMINAL_STATES,
    ApiToken,
    DryRun,
    Flavor,
    Job,
    JobDetail,
    JobEvent,
    JobTemplate,
    LogLine,
    Me,
    Node,
    PriorityClass,
    Tenant,
    TenantMember,
    UsageReport,
    VirtualCluster,
    Webhook,
)

API = "/api/v1"
DEFAULT_TIMEOUT_S = 30.0
USER_AGENT = "gpuportal-client/0.1"
# The most jobs one job array may have: the portal's MAX_BULK_JOBS; the CLI refuses more before sending.
MAX_ARRAY_JOBS = 1000

T = TypeVar("T", bound=BaseModel)


class PortalError(Exception):
    """Base of every error the client reports; ``exit_code`` is the CLI's exit status."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class BadRequest(PortalError):
    """HTTP 400: the portal names the fields it refused, ``errors`` maps field -> messages."""

    exit_code = 2

    def __init__(self, message: str, errors: dict[str, list[str]], status: int = 400) -> None:
        super().__init__(message, status)
        self.errors = errors


class NotFound(PortalError):
    """HTTP 404, which is also what another tenant's job looks like."""

    exit_code = 3


class AuthError(PortalError):
    """HTTP 401 (no or a bad token) or 403 (signed in but not allowed)."""

    exit_code = 4


class Unreachable(PortalError):
    """No answer (connection refused, DNS, timeout) or a server error (5xx)."""

    exit_code = 5


class Conflict(PortalError):
    """HTTP 409: the request does not fit the resource's state, e.g. cancelling an ended job."""

    exit_code = 6


def flatten_errors(body: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF error bodies nest (``{"retries": {"limit": [...]}}``, lists per mount); this gives
    one dotted field name per message so that each can be printed on its own line."""
    out: dict[str, list[str]] = {}
    if isinstance(body, dict):
        for key, value in body.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            for field, messages in flatten_errors(value, name).items():
                out.setdefault(field, []).extend(messages)
    elif isinstance(body, list):
        if all(isinstance(item, str) for item in body):
            if body:
                out[prefix or "detail"] = [str(item) for item in body]
        else:
            for index, item in enumerate(body):
                for field, messages in flatten_errors(item, f"{prefix}[{index}]").items():
                    out.setdefault(field, []).extend(messages)
    elif body not in (None, ""):
        out[prefix or "detail"] = [str(body)]
    return out


class PortalClient:
    """One portal, one identity. Use as a context manager or call :meth:`close`.

    ``token`` is an API token (``Authorization: Bearer``). Without one, only
    :meth:`login_with_password` works, which signs in with the browser session to create a
    token.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> PortalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- transport ----------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request; returns the decoded JSON body (None for an empty one)."""
        return self._decode(self._send(method, path, **kwargs))

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path if path.startswith("http") else API + path, **kwargs)
        except httpx.TimeoutException as error:
            raise Unreachable(f"{self.url} did not answer in time ({error.__class__.__name__})") from None
        except httpx.HTTPError as error:
            if "WRONG_VERSION_NUMBER" in str(error) and self.url.lower().startswith("https://"):
                # What TLS says when the other end answers in plain HTTP, as a portal run
                # without TLS (the demo) does.
                plain = "http://" + self.url.split("://", 1)[1]
                raise Unreachable(
                    f"{self.url} does not answer over TLS; if it serves plain HTTP, use {plain}"
                ) from None
            raise Unreachable(f"cannot reach {self.url}: {error}") from None

    def websocket_url(self, path: str, params: dict[str, Any] | None = None) -> str:
        """The address of one of the portal's websockets (``/ws/...``): ``ws://`` for an
        ``http://`` portal, ``wss://`` for ``https://``, under the portal's own path as the REST
        API is."""
        scheme, _, rest = self.url.partition("://")
        secure = {"http": False, "https": True}.get(scheme.lower())
        if secure is None:
            raise PortalError(f"{self.url} is not an http:// or https:// address")
        query = f"?{urlencode(params)}" if params else ""
        return f"{'wss' if secure else 'ws'}://{rest}{path}{query}"

    def _decode(self, response: httpx.Response) -> Any:
        status = response.status_code
        if 300 <= status < 400:
            raise self._redirected(response)
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
            if status < 400:
                # A proxy's sign-in page, the web app's index.html or another server: decoding
                # it as "no body" would fail later, far from the cause, as a crash.
                raise self._not_the_api(response) from None
        if status < 400:
            return body
        detail = body.get("detail") if isinstance(body, dict) else None
        if status == 400:
            errors = flatten_errors(body) or {"detail": [response.text[:500] or "bad request"]}
            raise BadRequest(str(detail or "the portal refused the request"), errors)
        if status == 401:
            raise AuthError(str(detail or "not signed in"), status)
        if status == 403:
            raise AuthError(str(detail or "not allowed"), status)
        if status == 404:
            raise NotFound(str(detail or "not found"), status)
        if status == 409:
            raise Conflict(str(detail or "conflict"), status)
        if status >= 500:
            raise Unreachable(f"the portal failed with HTTP {status}", status)
        raise PortalError(str(detail or f"HTTP {status}"), status)

    def _redirected(self, response: httpx.Response) -> PortalError:
        """The API never redirects; a proxy does (http:// to https://, another host or path).
        Following it would resend the token wherever the proxy points, so the user is told
        where it leads, and which URL to use instead."""
        location = response.headers.get("Location", "")
        if not location:
            return Unreachable(
                f"{self.url} answered with a redirect (HTTP {response.status_code}) to nowhere:"
                f" is {self.url} the portal?",
                response.status_code,
            )
        target = response.request.url.join(location)
        # The same API path under another address: that address is the portal's URL.
        tail = response.request.url.path[len(httpx.URL(self.url).path.rstrip("/")) :]
        suggestion = str(target.copy_with(query=None, fragment=None))
        if tail and target.path.endswith(tail):
            suggestion = str(
                target.copy_with(path=target.path[: -len(tail)] or "/", query=None, fragment=None)
            )
        return Unreachable(
            f"{self.url} redirects to {target} (HTTP {response.status_code}): use that URL,"
            f" gpuportal login --url {suggestion.rstrip('/')}",
            response.status_code,
        )

    def _not_the_api(self, response: httpx.Response) -> PortalError:
        kind = response.headers.get("Content-Type", "no content type").split(";")[0].strip()
        return Unreachable(
            f"the answer from {response.request.url} is not the portal's API"
            f" (HTTP {response.status_code}, {kind}): is {self.url} the portal?",
            response.status_code,
        )

    def _page(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """One page of a list (``count``, ``next``, ``results``); any other JSON is not this API."""
        page = self.request("GET", path, **kwargs)
        if not isinstance(page, dict) or not isinstance(page.get("results"), list):
            where = path if path.startswith("http") else f"{self.url}{API}{path}"
            raise Unreachable(
                f"the answer from {where} is not a page of the portal's API: is {self.url} the portal?"
            )
        return page

    def _pages(
        self, path: str, params: dict[str, Any] | None = None, limit: int | None = None
    ) -> Iterator[Any]:
        """Follow limit/offset pages until ``limit`` items (or all of them) were read."""
        query: dict[str, Any] = dict(params or {})
        query.setdefault("limit", min(limit or 200, 200))
        page = self._page(path, params=query)
        seen = 0
        while True:
            for item in page["results"]:
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if not page.get("next"):
                return
            # Only the link's query is used, on the list's own path under the configured portal
            # URL: the link is built from what the portal believes its address is (a proxy may
            # say http://, another host, or drop the path prefix it serves the portal under),
            # and following it as given could send the bearer token elsewhere, in clear text.
            page = self._page(path, params=httpx.URL(str(page["next"])).params.multi_items())

    @staticmethod
    def _parse(model: type[T], items: Iterable[Any]) -> list[T]:
        return [model.model_validate(item) for item in items]

    # -- identity and tokens ------------------------------------------------------------

    @classmethod
    def login_with_password(
        cls,
        url: str,
        username: str,
        password: str,
        token_name: str,
        expires_in_days: int = 90,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> ApiToken:
        """Sign in with a user name and password and create an API token (shown once).

        The password is used for this one exchange and never stored: the session exists
        only to call ``POST /tokens/`` with its CSRF token, then it is signed out.
        """
        client = cls(url, transport=transport)
        try:
            client._prime_csrf()
            try:
                client.request(
                    "POST",
                    "/session/",
                    json={"username": username, "password": password},
                    headers=client._csrf(),
                )
            except BadRequest as error:
                raise AuthError(sign_in_refusal(error), 400) from None
            created = client.request(
                "POST",
                "/tokens/",
                json={"name": token_name, "expires_in_days": expires_in_days},
                headers=client._csrf(),
            )
            # The token exists; a session left behind would expire on its own.
            with contextlib.suppress(PortalError):
                client.request("DELETE", "/session/", headers=client._csrf())
            return ApiToken.model_validate(created)
        finally:
            client.close()

    def _prime_csrf(self) -> None:
        """GET /session/ sets the CSRF cookie; signed out it answers 204 (portals before that
        answered 401, and set the cookie all the same)."""
        with contextlib.suppress(AuthError):
            self.request("GET", "/session/")

    def _csrf(self) -> dict[str, str]:
        token = self._http.cookies.get("csrftoken")
        return {"X-CSRFToken": token, "Referer": self.url + "/"} if token else {}

    def me(self) -> Me:
        return Me.model_validate(self.request("GET", "/me/"))

    # -- jobs ---------------------------------------------------------------------------

    def list_jobs(
        self,
        *,
        state: str | Iterable[str] | None = None,
        vc: str | None = None,
        owner: str | None = None,
        q: str | None = None,
        limit: int | None = 50,
    ) -> list[Job]:
        """Jobs of your tenants, newest first. ``owner="me"`` for your own."""
        params: dict[str, Any] = {}
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        if vc:
            params["vc"] = vc
        if owner:
            params["owner"] = owner
        if q:
            params["q"] = q
        return self._parse(Job, self._pages("/jobs/", params, limit))

    def get_job(self, job_id: int) -> JobDetail:
        return JobDetail.model_validate(self.request("GET", f"/jobs/{int(job_id)}/"))

    def submit_job(self, spec: str | dict[str, Any]) -> JobDetail:
        """Submit a job spec: YAML text exactly as the web form takes it, or a mapping."""
        return JobDetail.model_validate(self.request("POST", "/jobs/", **spec_body(spec)))

    def dry_run(self, spec: str | dict[str, Any]) -> DryRun:
        """Test a job spec as :meth:`submit_job` takes it, without submitting it: what the next
        scheduling cycle would do with it. A spec the portal would refuse raises as there."""
        return DryRun.model_validate(self.request("POST", "/jobs/dry-run/", **spec_body(spec)))

    def submit_job_array(self, spec: str | dict[str, Any], count: int) -> list[int]:
        """Submit ``count`` copies of one job spec as a job array, all or none: copy i is named
        NAME-i and finds i in its environment variable ``ARRAY_INDEX``. Returns the job ids,
        copy 0 first.

        ``spec`` is YAML text or a mapping, as for :meth:`submit_job`, and a refused spec raises
        :class:`BadRequest` with the same field names: the portal checks the one spec, so its
        errors name the spec's fields, not a copy.
        """
        if isinstance(spec, str):
            # The spec goes inside the array request: parsed here as the portal parses YAML, and
            # sent back as YAML, so that dates and other YAML types arrive unchanged.
            body = yaml.safe_dump({"job": parse_yaml_spec(spec), "array": count}, sort_keys=False)
            request: dict[str, Any] = {
                "content": body.encode(),
                "headers": {"Content-Type": "application/yaml"},
            }
        else:
            request = {"json": {"job": spec, "array": count}}
        try:
            created = self.request("POST", "/jobs/bulk/", **request)
        except BadRequest as error:
            errors = {field.removeprefix("job."): messages for field, messages in error.errors.items()}
            raise BadRequest(error.message, errors) from None
        if not isinstance(created, dict) or not isinstance(created.get("ids"), list):
            raise Unreachable(f"the answer to a job array is not the portal's API: is {self.url} the portal?")
        return [int(job_id) for job_id in created["ids"]]

    def cancel_job(self, job_id: int) -> Job:
        return self.change_job(job_id, "cancel")

    def change_job(self, job_id: int, change: str) -> Job:
        """`cancel`, `top` (before its owner's other pending jobs), `hold` (a running job with
        checkpointing: pause) or `release` (resume) a job."""
        return Job.model_validate(self.request("POST", f"/jobs/{int(job_id)}/{change}/"))

    def change_time_limit(self, job_id: int, time_limit: int | str) -> Job:
        """Seconds or text such as '36h': lower your job's limit, or (as a tenant admin) raise it
        up to its flavor's limit."""
        body = {"time_limit": time_limit}
        return Job.model_validate(self.request("POST", f"/jobs/{int(job_id)}/time-limit/", json=body))

    def job_events(self, job_id: int) -> list[JobEvent]:
        return self._parse(JobEvent, self._pages(f"/jobs/{int(job_id)}/events/", limit=None))

    def job_logs(
        self, job_id: int, *, attempt: int | None = None, after: int | None = None, limit: int = 500
    ) -> list[LogLine]:
        """One page of output lines (oldest first) of an attempt, the latest by default."""
        params: dict[str, Any] = {"limit": limit}
        if attempt is not None:
            params["attempt"] = attempt
        if after is not None:
            params["after"] = after
        page = self._page(f"/jobs/{int(job_id)}/logs/", params=params)
        return self._parse(LogLine, page["results"])

    def all_job_logs(self, job_id: int, *, attempt: int | None = None) -> list[LogLine]:
        """Every line of an attempt, paging with ``after`` so lines arriving meanwhile are kept."""
        lines: list[LogLine] = []
        after = None
        while True:
            page = self.job_logs(job_id, attempt=attempt, after=after)
            lines += page
            if len(page) < 500:
                return lines
            after = page[-1].id

    def follow_logs(
        self, job_id: int, *, poll_s: float = 1.0, from_attempt: int | None = None, events: bool = False
    ) -> Iterator[LogLine | JobDetail | JobEvent]:
        """Yield log lines as they arrive, across attempts, until the job has ended.

        Also yields the job (a :class:`JobDetail`) whenever its state, attempt or pending
        reason changes, or what its attempt's replicas report (a start's progress, such as an
        image pull's), and with ``events=True`` every new :class:`JobEvent` (polling the job
        alone can miss a state that lasted less than one poll). Lines of an attempt are drained
        before moving on to the next attempt, and once more after the job ended, because the
        agent may deliver the last lines after the final status; the event that ended the job
        comes after them.
        """
        attempt = from_attempt
        after: dict[int, int] = {}  # attempt number -> last line id shown
        events_seen = 0
        last_seen: tuple[Any, ...] | None = None
        ended_polls = 0
        # The job's end is told after the output it ended with, which may arrive a poll later.
        ending: list[JobEvent] = []
        while True:
            # Events first, then the job: the job read is then the newer of the two, so a
            # waiting reason never shows after the event that ended the wait.
            if events:
                while True:
                    page = self._page(
                        f"/jobs/{int(job_id)}/events/", params={"offset": events_seen, "limit": 200}
                    )
                    for item in page["results"]:
                        events_seen += 1
                        event = JobEvent.model_validate(item)
                        if event.to_state in TERMINAL_STATES:
                            ending.append(event)
                            continue
                        yield from ending  # not the end after all: in order
                        ending.clear()
                        yield event
                    if not page.get("next"):
                        break
            job = self.get_job(job_id)
            current = job.latest_attempt
            latest = current.number if current else None
            replicas = [(r.state, r.message) for r in current.replicas_status] if current else []
            seen = (job.state, latest, job.pending_reason, job.pending_message, replicas)
            if seen != last_seen:
                last_seen = seen
                yield job
            if attempt is None:
                attempt = min((a.number for a in job.attempts), default=None)
            while attempt is not None:
                lines = self.job_logs(job_id, attempt=attempt, after=after.get(attempt))
                for line in lines:
                    after[attempt] = line.id
                    yield line
                if len(lines) == 500:
                    continue
                if latest is not None and attempt < latest:
                    attempt += 1
                    continue
                break
            if job.ended:
                ended_polls += 1
                if ended_polls > 1:  # one more look for lines that trail the final status
                    yield from ending
                    return
            time.sleep(poll_s)

    # -- the cluster --------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        return self._parse(Node, self._pages("/nodes/", limit=None))

    def virtual_clusters(self) -> list[VirtualCluster]:
        return self._parse(VirtualCluster, self._pages("/virtual-clusters/", limit=None))

    def virtual_cluster(self, name: str) -> VirtualCluster:
        """One virtual cluster of your tenants by name. Another tenant's raises
        :class:`NotFound`, exactly as one that does not exist."""
        return VirtualCluster.model_validate(
            self.request("GET", f"/virtual-clusters/{quote(name, safe='')}/")
        )

    def flavors(self) -> list[Flavor]:
        return self._parse(Flavor, self._pages("/flavors/", limit=None))

    def priority_classes(self) -> list[PriorityClass]:
        return self._parse(PriorityClass, self._pages("/priority-classes/", limit=None))

    # -- accounting ---------------------------------------------------------------------

    def usage(
        self, since: date | str | None = None, until: date | str | None = None, group: str = "vc"
    ) -> UsageReport:
        """Allocated GPU-hours, utilization-weighted GPU-hours and energy of the jobs you may
        see within the period (time outside it is not counted), per ``job``, ``vc``, ``tenant`` or
        ``user``, largest first. ``since`` and ``until``
        are dates (midnight UTC), datetimes or ISO text; ``until`` is now by default, ``since``
        30 days before ``until``."""
        return UsageReport.model_validate(
            self.request("GET", "/usage/", params=usage_params(since, until, group))
        )

    def usage_csv(
        self, since: date | str | None = None, until: date | str | None = None, group: str = "vc"
    ) -> str:
        """The same report as the portal's CSV file (a header line, then one line per row)."""
        params = usage_params(since, until, group)
        response = self._send(
            "GET", "/usage/", params={**params, "format": "csv"}, headers={"Accept": "text/csv"}
        )
        if response.status_code >= 300:
            self._decode(
                response
            )  # a refusal is JSON: raises with the portal's message; a redirect says where
        return response.text

    # -- webhooks -----------------------------------------------------------------------

    def webhooks(self) -> list[Webhook]:
        return self._parse(Webhook, self._pages("/webhooks/", limit=None))

    def add_webhook(self, url: str, format: str = "slack", secret: str = "", enabled: bool = True) -> Webhook:
        body = {"url": url, "format": format, "secret": secret, "enabled": enabled}
        return Webhook.model_validate(self.request("POST", "/webhooks/", json=body))

    def remove_webhook(self, webhook_id: int) -> None:
        self.request("DELETE", f"/webhooks/{webhook_id}/")

    def test_webhook(self, webhook_id: int) -> Webhook:
        """Sends a test delivery at once; the webhook comes back with its outcome."""
        return Webhook.model_validate(self.request("POST", f"/webhooks/{webhook_id}/test/"))

    # -- tenants and their members ------------------------------------------------------

    def tenants(self) -> list[Tenant]:
        """The tenants you belong to, by name, each with your own role in it."""
        return self._parse(Tenant, self._pages("/tenants/", limit=None))

    def members(self, tenant: str) -> list[TenantMember]:
        """The members of one of your tenants, by user name; any member may list them. A tenant
        you do not belong to raises :class:`NotFound`, exactly as one that does not exist."""
        return self._parse(TenantMember, self._pages(members_path(tenant), limit=None))

    def add_member(self, tenant: str, username: str, role: str = "member") -> TenantMember:
        """Tenant admins: add an existing user account to the tenant. A user the portal does not
        know (or whose account is deactivated), or one already a member, raises
        :class:`BadRequest` on ``username``."""
        body = {"username": username, "role": role}
        return TenantMember.model_validate(self.request("POST", members_path(tenant), json=body))

    def set_member_role(self, tenant: str, username: str, role: str) -> TenantMember:
        """Tenant admins: change a member's role. Demoting the tenant's last admin (deactivated
        accounts do not count) raises :class:`BadRequest` on ``role``; a user who is not a
        member, :class:`NotFound`."""
        path = members_path(tenant, username)
        return TenantMember.model_validate(self.request("PATCH", path, json={"role": role}))

    def remove_member(self, tenant: str, username: str) -> None:
        """Tenant admins: remove a member (their jobs stay with the tenant). Removing the last
        admin raises :class:`BadRequest` (``non_field_errors``)."""
        self.request("DELETE", members_path(tenant, username))

    # -- job templates ------------------------------------------------------------------

    def templates(self, name: str | None = None) -> list[JobTemplate]:
        """Your templates and those shared in your tenants; `name` only those of that name."""
        params = {"name": name} if name is not None else None
        return self._parse(JobTemplate, self._pages("/templates/", params, limit=None))

    def save_template(
        self, name: str, spec: dict[str, Any], *, description: str = "", shared: bool = False
    ) -> JobTemplate:
        """Save a job spec (a mapping, e.g. parsed from YAML) as a template named ``name``.

        A template's spec is stored as JSON, which has no dates, and YAML reads an unquoted
        2026-01-01 as one: such a value is refused here, naming the field, as the portal names a
        value that is not text, instead of failing to encode."""
        dated = date_fields(spec, "spec")
        if dated:
            raise BadRequest("a job spec cannot hold a date", dated)
        body = {"name": name, "spec": spec, "description": description, "shared": shared}
        return JobTemplate.model_validate(self.request("POST", "/templates/", json=body))

    def delete_template(self, template_id: int) -> None:
        self.request("DELETE", f"/templates/{template_id}/")


def sign_in_refusal(error: BadRequest) -> str:
    """The portal's reason for refusing a sign-in, in one line: its message ("Wrong user name or
    password."), or each field it refused with the field's name (a blank or too long one)."""
    if set(error.errors) <= {"detail"}:
        return error.message
    fields = "; ".join(
        f"{field}: {message}" for field, messages in error.errors.items() for message in messages
    )
    return f"the portal refused the sign-in: {fields}"


def members_path(tenant: str, username: str | None = None) -> str:
    """``/tenants/NAME/members/`` or ``.../USERNAME/``, each part quoted: a user name may hold
    characters such as ``@`` or ``+``."""
    path = f"/tenants/{quote(tenant, safe='')}/members/"
    return path if username is None else f"{path}{quote(username, safe='')}/"


def date_fields(value: Any, path: str) -> dict[str, list[str]]:
    """Every date (or datetime) in a parsed spec, by dotted field name, with what to do: no field
    of a job spec takes a date, and only YAML makes one of text such as 2026-01-01."""
    found: dict[str, list[str]] = {}
    if isinstance(value, date):  # a datetime is a date too
        name = path.rpartition(".")[2]
        found[path] = [
            f"{name} must be text, not the date {value.isoformat()}: in YAML put the value in quotes."
        ]
    elif isinstance(value, dict):
        for key, item in value.items():
            found.update(date_fields(item, f"{path}.{key}"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.update(date_fields(item, f"{path}[{index}]"))
    return found


def spec_body(spec: str | dict[str, Any]) -> dict[str, Any]:
    """A job spec as a request body: YAML text as it is, a mapping as JSON."""
    if isinstance(spec, str):
        return {"content": spec.encode(), "headers": {"Content-Type": "application/yaml"}}
    return {"json": spec}


def parse_yaml_spec(text: str) -> dict[str, Any]:
    """A job spec from YAML text, refused with the words the portal uses for a bad document."""
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as error:
        message = f"YAML parse error: {error}"
        raise BadRequest(message, {"detail": [message]}) from None
    except RecursionError:
        message = "YAML parse error: The document is nested too deeply."
        raise BadRequest(message, {"detail": [message]}) from None
    if not isinstance(spec, dict):
        message = "A job spec must be a YAML mapping."
        raise BadRequest(message, {"detail": [message]})
    return spec


def usage_params(since: date | str | None, until: date | str | None, group: str) -> dict[str, str]:
    """The query of GET /usage/; dates and datetimes go as ISO text, None leaves the default."""
    params = {"group": group}
    for name, value in (("since", since), ("until", until)):
        if value is not None:
            params[name] = value if isinstance(value, str) else value.isoformat()
    return params

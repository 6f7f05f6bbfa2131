from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.test import Client
from django.utils import timezone

from agents.protocol import GpuSample
from portal.accounts.models import AuditEntry
from portal.cluster.models import Gpu, Node, Quota
from portal.cluster.services import record_gpu_health
from tests.portal.store_helpers import placed_attempt, post_vc_change, run, vc_change_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_(cluster_admin_client) -> Client:  # type: ignore[no-untyped-def]
    return cluster_admin_client


ADMIN_PAGES = [
    "/admin/accounts/tenant/",
    "/admin/accounts/membership/",
    "/admin/accounts/apitoken/",
    "/admin/accounts/auditentry/",
    "/admin/cluster/virtualcluster/",
    "/admin/cluster/quota/",
    "/admin/cluster/flavor/",
    "/admin/cluster/priorityclass/",
    "/admin/cluster/node/",
    "/admin/cluster/gpu/",
    "/admin/cluster/gpuhealthevent/",
    "/admin/jobs/job/",
    "/admin/jobs/jobtemplate/",
    "/admin/auth/user/",
]


@pytest.mark.parametrize("url", ADMIN_PAGES)
def test_cluster_admins_see_every_admin_page(admin_client_, url) -> None:  # type: ignore[no-untyped-def]
    assert admin_client_.get(url).status_code == 200


@pytest.mark.parametrize("username", ["vision-admin", "alice", "carol"])
def test_tenant_users_are_kept_out_of_django_admin(users, username) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(users[username])
    response = client.get("/admin/jobs/job/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_quota_list_shows_use_against_guarantee_and_borrow_limit(admin_client_, api_for, small_job) -> None:  # type: ignore[no-untyped-def]
    from portal.cluster.models import Gpu
    from portal.jobs.models import Allocation, Job, JobAttempt

    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    attempt = JobAttempt.objects.create(job=job, number=1)
    for gpu in Gpu.objects.filter(node__name="a100-node-1")[:2]:
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=gpu.node)
    page = admin_client_.get("/admin/cluster/quota/").content.decode()
    assert "2 / 8 + 8" in page  # vision A100
    assert "0 / 8 + 4" in page  # vision V100, speech V100
    quota = Quota.objects.get(virtual_cluster__name="vision", gpu_model="A100")
    assert "2 / 8 + 8" in admin_client_.get(f"/admin/cluster/quota/{quota.pk}/change/").content.decode()
    vc = api_for("alice").get("/api/v1/virtual-clusters/vision/").json()
    assert {q["gpu_model"]: q["in_use"] for q in vc["quotas"]} == {"A100": 2, "V100": 0}


def quota_form(quota: Quota, **changes: object) -> dict[str, object]:
    """The quota's change form as Django admin posts it, with `changes`."""
    form = {
        "virtual_cluster": quota.virtual_cluster_id,
        "gpu_model": quota.gpu_model,
        "guaranteed": quota.guaranteed,
        "borrow_limit": quota.borrow_limit,
        "lending_limit": "" if quota.lending_limit is None else quota.lending_limit,
    }
    return {**form, **changes}


def test_a_lending_limit_is_at_most_the_guarantee_and_shows_in_the_api(admin_client_, api_for) -> None:  # type: ignore[no-untyped-def]
    quota = Quota.objects.get(virtual_cluster__name="vision", gpu_model="A100")
    url = f"/admin/cluster/quota/{quota.pk}/change/"
    refused = admin_client_.post(url, quota_form(quota, lending_limit=9))
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert list(errors) == ["lending_limit"]
    assert "a VC lends only GPUs of its guarantee" in errors["lending_limit"][0]
    # Lowering the guarantee under the limit is refused the same way.
    refused = admin_client_.post(url, quota_form(quota, guaranteed=2, lending_limit=3))
    assert list(refused.context["adminform"].form.errors) == ["lending_limit"]
    quota.refresh_from_db()
    assert (quota.guaranteed, quota.lending_limit) == (8, None)

    assert admin_client_.post(url, quota_form(quota, lending_limit=0)).status_code == 302
    quota.refresh_from_db()
    assert quota.lending_limit == 0  # lends none
    entry = AuditEntry.objects.filter(action="admin.change", object_id=str(quota.pk)).get()
    assert "Lending limit" in entry.detail

    page = admin_client_.get("/admin/cluster/quota/").content.decode()
    assert page.count('<td class="field-lends">0</td>') == 1  # vision A100
    assert page.count('<td class="field-lends">4</td>') == 1  # the demo's vision V100
    assert page.count('<td class="field-lends">all</td>') == 2  # speech's

    vision = api_for("alice").get("/api/v1/virtual-clusters/vision/").json()
    assert {q["gpu_model"]: q["lending_limit"] for q in vision["quotas"]} == {"A100": 0, "V100": 4}
    speech = api_for("carol").get("/api/v1/virtual-clusters/").json()["results"]
    assert [(vc["name"], [q["lending_limit"] for q in vc["quotas"]]) for vc in speech] == [
        ("speech", [None, None])
    ]

    assert admin_client_.post(url, quota_form(quota, lending_limit="")).status_code == 302
    quota.refresh_from_db()
    assert quota.lending_limit is None  # lends all again
    vision = api_for("alice").get("/api/v1/virtual-clusters/vision/").json()
    assert vision["quotas"][0]["lending_limit"] is None


def test_the_vc_page_refuses_a_lending_limit_above_the_guarantee_on_the_quota(admin_client_) -> None:  # type: ignore[no-untyped-def]
    from portal.cluster.models import VirtualCluster

    vc = VirtualCluster.objects.get(name="speech")
    quotas = list(vc.quotas.order_by("gpu_model"))
    form: dict[str, object] = {
        **vc_change_form("speech", **{"quotas-TOTAL_FORMS": len(quotas), "quotas-INITIAL_FORMS": len(quotas)})
    }
    for i, quota in enumerate(quotas):
        form.update({f"quotas-{i}-{field}": value for field, value in quota_form(quota).items()})
        form[f"quotas-{i}-id"] = quota.pk
    url = f"/admin/cluster/virtualcluster/{vc.pk}/change/"
    refused = admin_client_.post(url, {**form, "quotas-1-lending_limit": 9})  # V100, 8 guaranteed
    assert refused.status_code == 200
    formset = refused.context["inline_admin_formsets"][0].formset
    assert [list(errors) for errors in formset.errors] == [[], ["lending_limit"]]

    response = admin_client_.post(url, {**form, "quotas-1-lending_limit": 8})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert [q.lending_limit for q in vc.quotas.order_by("gpu_model")] == [None, 8]


def test_every_admin_change_writes_an_audit_entry(admin_client_) -> None:  # type: ignore[no-untyped-def]
    quota = Quota.objects.get(virtual_cluster__name="vision", gpu_model="A100")
    response = admin_client_.post(
        f"/admin/cluster/quota/{quota.pk}/change/",
        {
            "virtual_cluster": quota.virtual_cluster_id,
            "gpu_model": "A100",
            "guaranteed": 12,
            "borrow_limit": 4,
        },
    )
    assert response.status_code == 302
    quota.refresh_from_db()
    assert (quota.guaranteed, quota.borrow_limit) == (12, 4)
    entry = AuditEntry.objects.get(action="admin.change", object_id=str(quota.pk))
    assert entry.actor.username == "admin" and entry.tenant.name == "vision"
    assert "Guaranteed" in entry.detail

    response = admin_client_.post(
        "/admin/cluster/flavor/add/",
        {
            "name": "xs-A100",
            "gpu_model": "A100",
            "gpus": 1,
            "cpu": 8,
            "memory_gb": 64,
            "max_runtime_hours": 4,
        },
    )
    assert response.status_code == 302
    assert AuditEntry.objects.filter(action="admin.add", object_repr="xs-A100").exists()


@pytest.mark.parametrize(("action", "state"), [("cordon", "cordoned"), ("drain", "draining")])
def test_node_actions_change_state_and_are_audited(admin_client_, action, state) -> None:  # type: ignore[no-untyped-def]
    node = Node.objects.get(name="v100-node-1")
    response = admin_client_.post(
        "/admin/cluster/node/", {"action": action, "_selected_action": [node.pk], "index": 0}
    )
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.state == state
    assert AuditEntry.objects.filter(action=f"node.{action}", object_id=str(node.pk)).exists()
    admin_client_.post(
        "/admin/cluster/node/", {"action": "uncordon", "_selected_action": [node.pk], "index": 0}
    )
    node.refresh_from_db()
    assert node.state == "not-ready"  # no agent has said hello yet


def test_the_audit_log_is_read_only(admin_client_) -> None:  # type: ignore[no-untyped-def]
    entry = AuditEntry.objects.create(action="test")
    assert admin_client_.get("/admin/accounts/auditentry/add/").status_code == 403
    admin_client_.post(f"/admin/accounts/auditentry/{entry.pk}/change/", {"action": "edited"})
    admin_client_.post(f"/admin/accounts/auditentry/{entry.pk}/delete/", {"post": "yes"})
    entry.refresh_from_db()
    assert entry.action == "test"


def test_cluster_admins_see_every_tenants_job_templates_and_change_only_their_wording(
    admin_client_: Client, users: dict[str, Any]
) -> None:
    from portal.accounts.models import Tenant
    from portal.jobs.models import JobTemplate

    vision, speech = Tenant.objects.get(name="vision"), Tenant.objects.get(name="speech")
    spec = {"vc": "vision", "flavor": "s-A100", "command": "python sweep.py"}
    sweep = JobTemplate.objects.create(
        owner=users["alice"], tenant=vision, name="resnet-sweep", spec=spec, shared=True
    )
    JobTemplate.objects.create(
        owner=users["carol"], tenant=speech, name="whisper-tune", spec={"vc": "speech"}
    )

    listed = admin_client_.get("/admin/jobs/jobtemplate/").content.decode()
    assert "resnet-sweep" in listed and "whisper-tune" in listed
    by_tenant = admin_client_.get(f"/admin/jobs/jobtemplate/?tenant__id__exact={speech.pk}").content.decode()
    assert "whisper-tune" in by_tenant and "resnet-sweep" not in by_tenant
    by_owner = admin_client_.get("/admin/jobs/jobtemplate/?q=alice").content.decode()
    assert "resnet-sweep" in by_owner and "whisper-tune" not in by_owner
    url = f"/admin/jobs/jobtemplate/{sweep.pk}/change/"
    page = admin_client_.get(url)
    assert page.status_code == 200 and "python sweep.py" in page.content.decode()
    assert admin_client_.get("/admin/jobs/jobtemplate/add/").status_code == 403

    # Only the wording and the sharing change here: the spec passed the portal's checks once.
    posted = {"description": "a sweep", "spec": '{"vc": "vision", "secret_env": {"K": "v"}}', "name": "x"}
    assert admin_client_.post(url, posted).status_code == 302  # shared unticked
    sweep.refresh_from_db()
    assert (sweep.name, sweep.description, sweep.shared, sweep.spec) == (
        "resnet-sweep",
        "a sweep",
        False,
        spec,
    )
    entry = AuditEntry.objects.get(action="admin.change", object_id=str(sweep.pk))
    assert entry.tenant == vision
    # Sharing is the owner's choice: once private, the admin cannot share it again.
    assert admin_client_.post(url, {"description": "a sweep", "shared": "on"}).status_code == 302
    sweep.refresh_from_db()
    assert sweep.shared is False

    for username in ["vision-admin", "alice"]:  # tenant users, admins of theirs too, are kept out
        client = Client()
        client.force_login(users[username])
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def posted_as_shown(response: Any) -> dict[str, Any]:
    """What a browser posts back for a change page (and its inlines) as it was shown."""
    context = response.context
    shown = [context["adminform"].form]
    data: dict[str, Any] = {}
    for inline in context["inline_admin_formsets"]:
        management = inline.formset.management_form
        data.update({management.add_prefix(name): management[name].value() for name in management.fields})
        shown.extend(inline.formset.forms)
    for form in shown:
        for name, field in form.fields.items():
            value = form[name].value()
            if isinstance(field, forms.BooleanField):
                if value:
                    data[form.add_prefix(name)] = "on"
            else:
                data[form.add_prefix(name)] = "" if value is None else value
    return data


def test_saving_a_node_page_keeps_what_changed_since_it_was_shown(
    admin_client_, api_for, paused_loop
) -> None:  # type: ignore[no-untyped-def]
    """The node's state, desired revision, CPUs and memory and its GPUs' health are the portal's
    and the agent's: shown, never posted back. A page opened before a job was placed there and a
    GPU failed must not set the revision back (the agent would skip desired sets) nor return the
    GPU to service."""
    node = Node.objects.get(name="a100-node-1")
    url = f"/admin/cluster/node/{node.pk}/change/"
    page = admin_client_.get(url)
    assert page.status_code == 200
    assert not {"state", "desired_revision", "cpu", "memory_gb"} & set(page.context["adminform"].form.fields)
    node, attempt = placed_attempt(api_for)  # the revision moves on; the node is made ready
    run(attempt.job_id)
    gpu = Gpu.objects.get(node=node, index=7)
    record_gpu_health(
        node, [GpuSample(gpu_uuid=gpu.uuid, time=timezone.now(), healthy=False, health_reason="xid 48")]
    )
    Node.objects.filter(pk=node.pk).update(cpu=128, memory_gb=1024)  # as the agent's hello says
    before = Node.objects.get(pk=node.pk)

    data = posted_as_shown(page)
    data["rack"] = "rack-9"
    response = admin_client_.post(url, data)
    assert response.status_code == 302, response.content.decode()[-2000:]

    after = Node.objects.get(pk=node.pk)
    assert after.rack == "rack-9"
    assert (after.state, after.desired_revision, after.cpu, after.memory_gb) == (
        before.state,
        before.desired_revision,
        128,
        1024,
    )
    assert Gpu.objects.values_list("healthy", "health_reason").get(pk=gpu.pk) == (False, "xid 48")


@pytest.mark.parametrize("field", ["gpus", "cpu", "memory_gb", "max_runtime_hours"])
def test_a_flavor_of_zero_is_refused_by_the_form_and_the_database(admin_client_, field) -> None:  # type: ignore[no-untyped-def]
    """A flavor of 0 GPUs (CPUs, GB, hours) holds no job: submissions naming it were 500s."""
    from django.db import IntegrityError, transaction

    from portal.cluster.models import Flavor

    values = {"gpu_model": "A100", "gpus": 1, "cpu": 8, "memory_gb": 64, "max_runtime_hours": 4}
    response = admin_client_.post("/admin/cluster/flavor/add/", {**values, "name": "zero", field: 0})
    assert response.status_code == 200 and field in response.context["adminform"].form.errors
    assert not Flavor.objects.filter(name="zero").exists()
    with pytest.raises(IntegrityError), transaction.atomic():
        Flavor.objects.create(**{**values, "name": "zero", field: 0})  # not even past the form


def more_rows(job: Any, count: int) -> None:
    """`count` more rows on each list that names a related object per row: nodes with a GPU, an
    attempt of `job` holding it, a user with a webhook."""
    from django.contrib.auth.models import User

    from portal.accounts.models import Webhook
    from portal.jobs.models import Allocation, JobAttempt

    start = JobAttempt.objects.filter(job=job).count()
    for i in range(start, start + count):
        node = Node.objects.create(name=f"rows-{i}")
        gpu = Gpu.objects.create(node=node, index=0, uuid=f"GPU-rows-{i}", model="A100", memory_mb=81920)
        attempt = JobAttempt.objects.create(job=job, number=i + 1)
        Allocation.objects.create(attempt=attempt, gpu=gpu, node=node)
        user = User.objects.create_user(f"rows-{i}")
        Webhook.objects.create(user=user, url=f"https://hooks.example/{i}", secret="s")


@pytest.mark.parametrize(
    "url",
    [
        "/admin/cluster/node/",
        "/admin/cluster/gpu/",
        "/admin/jobs/jobattempt/",
        "/admin/jobs/allocation/",
        "/admin/accounts/webhook/",
    ],
)
def test_a_changelist_takes_as_many_queries_for_many_rows_as_for_few(
    admin_client_: Client, api_for: Any, small_job: dict[str, Any], url: str
) -> None:
    """A query per row (a node's GPU count, a GPU's or webhook's name from its node or user)
    made the lists of a big cluster slow to open."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from portal.jobs.models import Job

    job = Job.objects.get(pk=api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"])
    counts = []
    for rows in (2, 8):
        more_rows(job, rows)
        with CaptureQueriesContext(connection) as queries:
            assert admin_client_.get(url).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_node_list_counts_each_nodes_gpus(admin_client_: Client) -> None:
    page = admin_client_.get("/admin/cluster/node/?o=5").content.decode()
    assert page.count('<td class="field-gpu_count">8</td>') == Node.objects.filter(gpus__index=7).count()
    Node.objects.create(name="empty-node")
    page = admin_client_.get("/admin/cluster/node/").content.decode()
    assert '<td class="field-gpu_count">0</td>' in page


def test_jobs_attempts_and_allocations_are_neither_deleted_nor_added_in_admin(
    admin_client_: Client, api_for: Any, paused_loop: Any
) -> None:
    """Deleting a running job (or its attempt or allocation) freed its GPUs for the next cycle
    while its program went on, with no event and no audit entry; cancelling is the way."""
    from portal.jobs.models import Allocation, Job, JobAttempt

    node, attempt = placed_attempt(api_for)
    run(attempt.job_id)
    held = list(Allocation.objects.filter(attempt=attempt).values_list("pk", flat=True))
    assert len(held) == 2
    pages = {
        "job": attempt.job_id,
        "jobattempt": attempt.pk,
        "allocation": held[0],
    }
    for model, pk in pages.items():
        base = f"/admin/jobs/{model}/"
        assert admin_client_.get(f"{base}{pk}/delete/").status_code == 403, model
        assert admin_client_.post(f"{base}{pk}/delete/", {"post": "yes"}).status_code == 403, model
        assert admin_client_.get(f"{base}add/").status_code == 403, model
        changelist = admin_client_.get(base)
        assert changelist.status_code == 200
        assert "delete_selected" not in changelist.content.decode(), model
        admin_client_.post(base, {"action": "delete_selected", "_selected_action": [pk], "post": "yes"})
    assert Job.objects.get(pk=attempt.job_id).state == "running"
    assert JobAttempt.objects.filter(pk=attempt.pk).exists()
    assert sorted(Allocation.objects.holding().filter(node=node).values_list("pk", flat=True)) == sorted(held)
    assert not AuditEntry.objects.filter(action="admin.delete").exists()

    # Cancelling, the way to free them, is still there, with its event and audit entry.
    response = admin_client_.post(
        "/admin/jobs/job/", {"action": "cancel", "_selected_action": [attempt.job_id], "index": 0}
    )
    assert response.status_code == 302
    assert Job.objects.get(pk=attempt.job_id).state == "cancelled"
    assert AuditEntry.objects.filter(action="job.cancel", object_id=str(attempt.job_id)).exists()
    assert not Allocation.objects.holding().filter(pk__in=held).exists()


def test_a_vcs_tenant_is_fixed_once_it_exists(admin_client_: Client, api_for: Any) -> None:
    """Moved to another tenant, the VC took the old tenant's GPU use and monthly GPU-hours to the
    new one's members, who could also submit to it, while its jobs stayed the old tenant's."""
    from portal.accounts.models import Tenant
    from portal.cluster.models import VirtualCluster

    speech = Tenant.objects.get(name="speech")
    page = admin_client_.get(
        f"/admin/cluster/virtualcluster/{VirtualCluster.objects.get(name='vision').pk}/change/"
    )
    assert "tenant" not in page.context["adminform"].form.fields
    response = post_vc_change(admin_client_, "vision", tenant=speech.pk, description="moved?")
    assert response.status_code == 302, response.content.decode()[-2000:]
    vision = VirtualCluster.objects.get(name="vision")
    assert (vision.tenant.name, vision.description) == ("vision", "moved?")
    names = [vc["name"] for vc in api_for("carol").get("/api/v1/virtual-clusters/").json()["results"]]
    assert names == ["speech"]

    # A new VC still gets its tenant.
    form = {**vc_change_form("vision"), "name": "speech-batch", "tenant": speech.pk}
    assert admin_client_.post("/admin/cluster/virtualcluster/add/", form).status_code == 302
    assert VirtualCluster.objects.get(name="speech-batch").tenant == speech


def test_cancelling_jobs_of_which_one_ended_meanwhile_cancels_the_others(
    admin_client_: Client, api_for: Any, small_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The action reads the jobs that have not ended, then locks them one by one; one that ended
    in between (an agent's report) made the whole action a 500, leaving the rest running."""
    from portal.jobs import admin as jobs_admin
    from portal.jobs.models import Job
    from portal.jobs.services import transition_job

    client = api_for("alice")
    first, second = (client.post("/api/v1/jobs/", small_job, format="json").json()["id"] for _ in range(2))
    real_cancel = jobs_admin.cancel_job

    def agent_report_lands_first(job: Job, *args: Any, **kwargs: Any) -> Job:
        if job.pk == second:
            assert transition_job(Job.objects.get(pk=second), "failed", label="test")
        return real_cancel(job, *args, **kwargs)

    monkeypatch.setattr(jobs_admin, "cancel_job", agent_report_lands_first)
    response = admin_client_.post(
        "/admin/jobs/job/", {"action": "cancel", "_selected_action": [first, second], "index": 0}, follow=True
    )
    assert response.status_code == 200
    assert f"Ended meanwhile, not cancelled: #{second}" in response.content.decode()
    assert dict(Job.objects.filter(pk__in=[first, second]).values_list("pk", "state")) == {
        first: "cancelled",
        second: "failed",
    }
    assert AuditEntry.objects.filter(action="job.cancel", object_id=str(first)).exists()


def test_staff_without_model_permissions_see_no_model_nor_autocomplete(users: dict[str, Any]) -> None:
    """A staff account that is no superuser gets only the admin models it is given permissions
    on: none here, so no list, change page or autocomplete answers with a tenant's rows."""
    from django.contrib.auth.models import User

    from tests.conftest import pass_admin_second_factor

    ops = User.objects.create_user("ops", password="ops-pass", is_staff=True)
    client = Client()
    client.force_login(ops)
    pass_admin_second_factor(client, ops)
    index = client.get("/admin/")
    assert index.status_code == 200 and index.context["app_list"] == []
    for url in ADMIN_PAGES:
        assert client.get(url).status_code == 403, url
    for model, field in [("membership", "user"), ("membership", "tenant")]:
        url = f"/admin/autocomplete/?app_label=accounts&model_name={model}&field_name={field}&term=a"
        assert client.get(url).status_code == 403, url


@pytest.mark.parametrize("how", ["page", "action"])
def test_deleting_a_quota_asks_for_a_scheduling_cycle(
    admin_client_: Client, django_capture_on_commit_callbacks: Any, how: str
) -> None:
    """Saving a quota asked for a cycle, deleting one did not: the VC's jobs kept their
    admission (or their wait) until the next timed cycle."""
    from scheduler.tasks import request_cycle

    quota = Quota.objects.filter(guaranteed__gt=0).first()
    assert quota is not None
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        if how == "page":
            response = admin_client_.post(f"/admin/cluster/quota/{quota.pk}/delete/", {"post": "yes"})
        else:
            response = admin_client_.post(
                "/admin/cluster/quota/",
                {"action": "delete_selected", "_selected_action": [quota.pk], "post": "yes"},
            )
    assert response.status_code == 302
    assert not Quota.objects.filter(pk=quota.pk).exists()
    assert request_cycle in callbacks

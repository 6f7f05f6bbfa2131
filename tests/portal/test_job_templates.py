"""`/api/v1/templates/`: saved job specs. A template's spec is checked as a submission is, its
errors nested under `spec` in the same words; names are unique per owner; a shared template is
offered to its tenant's members, and another tenant's answers like one that does not exist."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.jobs.models import JobTemplate

pytestmark = pytest.mark.django_db

URL = "/api/v1/templates/"
SPEC = {"name": "train", "vc": "vision", "flavor": "s-A100", "command": "python train.py"}


def save(client: Any, name: str = "train", **fields: Any) -> Any:
    return client.post(URL, {"name": name, "spec": SPEC, **fields}, format="json")


def test_create_list_get_update_delete(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    created = save(alice, description="ResNet on one GPU")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["spec"] == SPEC
    assert (body["owner"], body["tenant"], body["shared"]) == ("alice", "vision", False)
    assert AuditEntry.objects.filter(action="job_template.create", object_id=str(body["id"])).exists()

    listed = alice.get(URL).json()
    assert [t["name"] for t in listed["results"]] == ["train"]
    assert alice.get(f"{URL}?name=train").json()["count"] == 1
    assert alice.get(f"{URL}?name=other").json()["count"] == 0
    assert alice.get(f"{URL}{body['id']}/").json()["description"] == "ResNet on one GPU"

    bigger = {**SPEC, "flavor": "m-A100"}
    changed = alice.patch(f"{URL}{body['id']}/", {"spec": bigger, "shared": True}, format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["spec"], changed.json()["shared"]) == (bigger, True)
    assert (
        alice.put(f"{URL}{body['id']}/", {"name": "train2", "spec": SPEC}, format="json").status_code == 200
    )
    assert JobTemplate.objects.get().name == "train2"

    assert alice.delete(f"{URL}{body['id']}/").status_code == 204
    assert not JobTemplate.objects.exists()
    assert AuditEntry.objects.filter(action="job_template.delete").count() == 1


def test_the_stored_spec_submits(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    spec = {**SPEC, "command": ["python", "train.py"], "env": {"EPOCHS": "3"}, "time_limit": "2h"}
    template = alice.post(URL, {"name": "train", "spec": spec}, format="json").json()
    assert alice.post("/api/v1/jobs/", template["spec"], format="json").status_code == 201


def test_templates_saved_with_numbers_in_their_env_submit_again_after_the_migration(api_for) -> None:  # type: ignore[no-untyped-def]
    """Templates saved before submissions refused non-text values may hold numbers (YAML reads
    `8` as one); the data migration stores the text a submission made of them."""
    import importlib

    from django.apps import apps

    alice = api_for("alice")
    saved = save(alice).json()
    old_spec = {**SPEC, "env": {"OMP_NUM_THREADS": 8, "LR": 0.5, "NAME": "resnet"}}
    JobTemplate.objects.filter(pk=saved["id"]).update(spec=old_spec)
    assert alice.post("/api/v1/jobs/", old_spec, format="json").status_code == 400
    migration = importlib.import_module("portal.jobs.migrations.0017_template_env_values_as_text")
    migration.numbers_as_text(apps, None)
    spec = alice.get(f"{URL}{saved['id']}/").json()["spec"]
    assert spec["env"] == {"OMP_NUM_THREADS": "8", "LR": "0.5", "NAME": "resnet"}
    assert alice.post("/api/v1/jobs/", spec, format="json").status_code == 201


def test_a_bad_spec_is_refused_under_spec_in_a_submission_s_words(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    bad = {**SPEC, "vc": "nope", "replicas": 0, "typo": 1}
    submitted = alice.post("/api/v1/jobs/", bad, format="json")
    saved = alice.post(URL, {"name": "bad", "spec": bad}, format="json")
    assert (submitted.status_code, saved.status_code) == (400, 400)
    assert saved.json() == {"spec": submitted.json()}
    missing = alice.post(URL, {"name": "bad", "spec": {**SPEC, "flavor": None}}, format="json")
    assert missing.status_code == 400 and set(missing.json()["spec"]) == {"flavor"}
    assert alice.post(URL, {"name": "bad", "spec": "no"}, format="json").json()["spec"]
    assert not JobTemplate.objects.exists()


def test_an_unknown_field_is_refused_with_every_other_bad_field_at_once(api_for) -> None:  # type: ignore[no-untyped-def]
    """A field a template does not have hid the template's other bad fields and its spec's
    errors until it was fixed; all of them come in one 400, and nothing is stored."""
    alice = api_for("alice")
    body = {"name": "bad name!", "created": 1, "spec": {**SPEC, "bogus": 1, "replicas": 0}}
    saved = alice.post(URL, body, format="json")
    assert saved.status_code == 400, saved.content
    errors = saved.json()
    assert set(errors) == {"name", "created", "spec"}, errors
    assert errors["created"] == ["Unknown field."]
    assert set(errors["spec"]) == {"bogus", "replicas"}
    assert errors["spec"]["bogus"] == ["Unknown field."]

    created = save(alice).json()
    changed = alice.patch(f"{URL}{created['id']}/", {"shared": "maybe", "typo": 1}, format="json")
    assert changed.status_code == 400, changed.content
    assert set(changed.json()) == {"shared", "typo"}
    assert JobTemplate.objects.get().shared is False  # the refused change wrote nothing
    assert JobTemplate.objects.count() == 1


def test_yaml_dates_are_refused_by_field_name_as_a_submission_refuses_them(api_for) -> None:  # type: ignore[no-untyped-def]
    """Unquoted, YAML reads 2026-01-01 as a date, which JSON cannot hold: the spec's check must
    still name each field, in a submission's words, rather than call the whole spec bad JSON."""
    alice = api_for("alice")

    def both(spec: str) -> dict[str, Any]:
        submitted = alice.post("/api/v1/jobs/", spec, content_type="application/yaml")
        indented = "".join(f"  {line}\n" for line in spec.splitlines())
        saved = alice.post(URL, f"name: train\nspec:\n{indented}", content_type="application/yaml")
        assert (submitted.status_code, saved.status_code) == (400, 400), saved.content
        assert saved.json() == {"spec": submitted.json()}
        return saved.json()["spec"]

    spec = "name: train\nvc: vision\nflavor: s-A100\ncommand: python train.py\n"
    assert both(spec + "created: 2026-01-01\n") == {"created": ["Unknown field."]}
    errors = both(spec.replace("train\n", "2026-01-01\n", 1) + "env:\n  RUN_DATE: 2026-01-01\n")
    assert set(errors) == {"name", "env"}
    assert errors["name"][0].startswith("name cannot be a date: YAML reads an unquoted 2026-01-01 as one")
    assert errors["env"]["RUN_DATE"][0].startswith("RUN_DATE must be text, not the date 2026-01-01")

    # The template's own fields too: a date is named, and so is a field a template does not have.
    body = "name: train\nspec: {name: train, vc: vision, flavor: s-A100, command: python train.py}\n"
    unknown = alice.post(URL, body + "created: 2026-01-01\n", content_type="application/yaml")
    assert (unknown.status_code, unknown.json()) == (400, {"created": ["Unknown field."]})
    dated = alice.post(URL, body + "description: 2026-01-01\n", content_type="application/yaml")
    assert dated.status_code == 400 and list(dated.json()) == ["description"]
    assert dated.json()["description"][0].startswith("description cannot be a date")
    assert not JobTemplate.objects.exists()


def test_values_json_cannot_hold_are_refused_by_field_name(api_for) -> None:  # type: ignore[no-untyped-def]
    """A template keeps its spec as written, in a JSON column: YAML's .nan passes as the text
    'nan' where a submission takes text, but no JSON document holds it. Refused by field, never
    stored (PostgreSQL would refuse the row)."""
    alice = api_for("alice")
    body = "name: train\nspec: {name: .nan, vc: vision, flavor: s-A100, command: python train.py}\n"
    saved = alice.post(URL, body, content_type="application/yaml")
    assert saved.status_code == 400, saved.content
    assert set(saved.json()) == {"spec"} and set(saved.json()["spec"]) == {"name"}
    assert ".nan" in saved.json()["spec"]["name"][0]
    assert not JobTemplate.objects.exists()


def test_a_template_keeps_no_secrets(api_for) -> None:  # type: ignore[no-untyped-def]
    answer = save(api_for("alice"), spec={**SPEC, "secret_env": {"KEY": "sk-1"}})
    assert answer.status_code == 400
    assert list(answer.json()["spec"]) == ["secret_env"]


def test_names_are_unique_per_owner(api_for) -> None:  # type: ignore[no-untyped-def]
    alice, bob = api_for("alice"), api_for("bob")
    assert save(alice).status_code == 201
    again = save(alice)
    assert again.status_code == 400
    assert again.json() == {"name": ["You already have a template named 'train'."]}
    assert save(bob).status_code == 201  # another owner may use the name
    other = save(alice, "other").json()
    renamed = alice.patch(f"{URL}{other['id']}/", {"name": "train"}, format="json")
    assert renamed.status_code == 400 and "name" in renamed.json()
    assert save(alice, "Not A Slug").json() == {
        "name": ["Use only letters, digits, '-' and '_' in a template's name."]
    }


def test_shared_templates_are_offered_within_the_tenant_only(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    private = save(alice, "private").json()
    shared = save(alice, "shared", shared=True).json()
    for peer in ("bob", "victor", "vision-admin"):
        names = [t["name"] for t in api_for(peer).get(URL).json()["results"]]
        assert names == ["shared"], peer
        assert api_for(peer).get(f"{URL}{private['id']}/").status_code == 404
        assert api_for(peer).get(f"{URL}{shared['id']}/").json()["owner"] == "alice"
    carol = api_for("carol")
    assert carol.get(URL).json()["count"] == 0
    missing = carol.get(f"{URL}999999/")
    foreign = carol.get(f"{URL}{shared['id']}/")
    assert (missing.status_code, missing.json()) == (404, {"detail": "No job template 999999."})
    assert (foreign.status_code, foreign.json()) == (404, {"detail": f"No job template {shared['id']}."})
    assert carol.delete(f"{URL}{shared['id']}/").status_code == 404

    # Only the owner changes a shared template; an admin of its tenant may delete it.
    bob = api_for("bob")
    assert bob.patch(f"{URL}{shared['id']}/", {"description": "mine"}, format="json").status_code == 403
    assert bob.delete(f"{URL}{shared['id']}/").status_code == 403
    assert api_for("vision-admin").delete(f"{URL}{shared['id']}/").status_code == 204
    assert list(JobTemplate.objects.values_list("name", flat=True)) == ["private"]


def test_a_member_removed_from_the_tenant_loses_its_templates(api_for) -> None:  # type: ignore[no-untyped-def]
    alice = api_for("alice")
    private = save(alice, "private").json()
    shared = save(alice, "shared", shared=True).json()
    admin = api_for("vision-admin")
    assert admin.delete("/api/v1/tenants/vision/members/alice/").status_code == 204

    assert alice.get(URL).json()["count"] == 0
    for template in (private, shared):
        gone = alice.get(f"{URL}{template['id']}/")
        assert (gone.status_code, gone.json()) == (404, {"detail": f"No job template {template['id']}."})
        assert alice.patch(f"{URL}{template['id']}/", {"description": "x"}, format="json").status_code == 404
        assert alice.delete(f"{URL}{template['id']}/").status_code == 404
    # The tenant keeps them: its members still use the shared one.
    assert [t["name"] for t in api_for("bob").get(URL).json()["results"]] == ["shared"]
    assert JobTemplate.objects.count() == 2


def test_a_viewer_may_not_save_a_template(api_for) -> None:  # type: ignore[no-untyped-def]
    refused = save(api_for("victor"))
    assert refused.status_code == 403
    assert not JobTemplate.objects.exists()
    # Another tenant's VC reads as a spec field to fix, as it does for a submission.
    assert save(api_for("carol")).json() == {
        "spec": {"vc": ["No virtual cluster named 'vision' that you can submit to."]}
    }


def test_anonymous_callers_get_nothing(api_for) -> None:  # type: ignore[no-untyped-def]
    assert api_for(None).get(URL).status_code == 401
    assert save(api_for(None)).status_code == 401

"""Job templates: saved job specs a user submits again, alone or shared with their tenant.

The spec was checked by JobSpecSerializer before it gets here (the API's serializer does it), so
a template holds a spec the portal accepted when it was saved. The rules here are who may save,
change and delete one, and what a template may not keep.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from portal.accounts.choices import SUBMIT_ROLES, Role
from portal.accounts.models import Membership, Tenant
from portal.accounts.services import record_audit
from portal.jobs.models import JobTemplate


class TemplateRejected(Exception):
    """The template cannot be stored as asked; `errors` is the API's body, {field: [message]}."""

    def __init__(self, errors: dict[str, Any]) -> None:
        super().__init__(str(errors))
        self.errors = errors


class TemplateDenied(Exception):
    """The user may not do this to the template (403)."""


def _role(user: Any, tenant: Tenant) -> str | None:
    membership = Membership.objects.filter(user=user, tenant=tenant).first()
    return membership.role if membership is not None else None


def _check(user: Any, tenant: Tenant, name: str, spec: dict[str, Any], template: JobTemplate | None) -> None:
    # A viewer may use a shared template but not save one: saving is a step towards submitting.
    if not user.is_staff and _role(user, tenant) not in SUBMIT_ROLES:
        raise TemplateDenied(f"You may not save templates for tenant {tenant.name}.")
    if spec.get("secret_env"):
        # A template is shown again, to others too when shared; secrets are given at submission.
        raise TemplateRejected(
            {"spec": {"secret_env": ["A template keeps no secrets: give them when you submit."]}}
        )
    clash = JobTemplate.objects.filter(owner=user, name=name)
    if template is not None:
        clash = clash.exclude(pk=template.pk)
    if clash.exists():
        raise TemplateRejected({"name": [f"You already have a template named {name!r}."]})


def _stored(template: JobTemplate) -> None:
    try:
        with transaction.atomic():
            template.save()
    except IntegrityError:  # the same name saved at the same moment by another request
        raise TemplateRejected({"name": [f"You already have a template named {template.name!r}."]}) from None


@transaction.atomic
def create_template(
    user: Any,
    *,
    name: str,
    spec: dict[str, Any],
    tenant: Tenant,
    description: str = "",
    shared: bool = False,
) -> JobTemplate:
    """Stores a new template of `user`; `tenant` is that of the spec's VC."""
    _check(user, tenant, name, spec, None)
    template = JobTemplate(
        owner=user, tenant=tenant, name=name, description=description, spec=spec, shared=shared
    )
    _stored(template)
    record_audit(user, "job_template.create", template, tenant=tenant)
    return template


@transaction.atomic
def update_template(user: Any, template: JobTemplate, **changes: Any) -> JobTemplate:
    """Changes the fields given (name, description, spec with its tenant, shared); only the
    owner may: a shared template is everyone's to use, not to change."""
    if template.owner_id != user.pk:
        raise TemplateDenied("Only the owner of a template may change it.")
    for field, value in changes.items():
        setattr(template, field, value)
    _check(user, template.tenant, template.name, template.spec, template)
    _stored(template)
    record_audit(user, "job_template.update", template, tenant=template.tenant)
    return template


@transaction.atomic
def delete_template(user: Any, template: JobTemplate) -> None:
    """Its owner may delete a template; an admin of its tenant a shared one too (as they may
    cancel any job of the tenant)."""
    admin = template.shared and (user.is_staff or _role(user, template.tenant) == Role.ADMIN)
    if template.owner_id != user.pk and not admin:
        raise TemplateDenied("Only the owner of a template, or an admin of its tenant, may delete it.")
    record_audit(user, "job_template.delete", template, tenant=template.tenant)
    template.delete()

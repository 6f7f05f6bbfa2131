"""Changes of what a user may see, told to the user's open live sockets (publish_access_change).

A sign-out closes the sockets of that session; a membership added, changed or removed, and any
change an admin makes to the account (deactivated, made staff or not, a new password), close all
of the user's sockets. Saving only `last_login`, which every sign-in does, changes nothing. An API
token deleted (revoking one publishes itself: portal.accounts.services.revoke_api_token) closes
the sockets it opened."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from portal.accounts.models import ApiToken, Membership
from portal.live.publish import publish_access_change, token_key


@receiver(user_logged_out)
def signed_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        publish_access_change(user.pk, request.session.session_key or "")


@receiver(post_save, sender=Membership)
@receiver(post_delete, sender=Membership)
def membership_changed(sender: Any, instance: Membership, **kwargs: Any) -> None:
    publish_access_change(instance.user_id, tenant_id=instance.tenant_id)


@receiver(post_save, sender=get_user_model())
def account_changed(
    sender: Any, instance: Any, created: bool, update_fields: Any = None, **kwargs: Any
) -> None:
    if not created and set(update_fields or ()) != {"last_login"}:
        publish_access_change(instance.pk)


@receiver(post_delete, sender=ApiToken)
def token_deleted(sender: Any, instance: ApiToken, **kwargs: Any) -> None:
    publish_access_change(instance.user_id, token_key(instance.pk))

"""The second factor of Django admin (S13): rules for enrolling an authenticator and for
accepting its codes. The views in portal.accounts.views only call these.

A session passes the second factor once per sign-in: the session remembers the device that
passed, and admin access ends when that device is deleted (a reset) or the session ends.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from portal.accounts import totp
from portal.accounts.models import TotpDevice
from portal.accounts.services import record_audit

SESSION_KEY = "admin_mfa_device"


def confirmed_device(user: Any) -> TotpDevice | None:
    return TotpDevice.objects.filter(user=user, confirmed_at__isnull=False).first()


def admin_mfa_passed(request: HttpRequest) -> bool:
    """True when this session's user gave a valid code of their (still enrolled) device."""
    device_id = request.session.get(SESSION_KEY)
    if device_id is None or not request.user.is_authenticated:
        return False
    return TotpDevice.objects.filter(pk=device_id, user=request.user, confirmed_at__isnull=False).exists()


def needs_second_factor(request: HttpRequest) -> bool:
    """A cluster admin (active staff) who has not passed the second factor in this session."""
    user = request.user
    return bool(user.is_active and user.is_staff) and not admin_mfa_passed(request)


def pending_device(user: Any) -> TotpDevice:
    """The device being enrolled: a new secret, kept until the user confirms it with a code."""
    device, _ = TotpDevice.objects.get_or_create(
        user=user, confirmed_at__isnull=True, defaults={"secret": totp.new_secret()}
    )
    return device


def _use_code(device: TotpDevice, code: str) -> bool:
    """Accepts a code of the device once: its step must be newer than the last step used.
    Compare-and-set, so two requests with the same code cannot both pass."""
    step = totp.matching_step(device.secret, code)
    if step is None or step <= device.last_used_step:
        return False
    now = timezone.now()
    accepted = TotpDevice.objects.filter(pk=device.pk, last_used_step__lt=step).update(
        last_used_step=step, last_used_at=now
    )
    if accepted:
        device.last_used_step, device.last_used_at = step, now
    return bool(accepted)


def _pass(request: HttpRequest, device: TotpDevice) -> None:
    request.session.cycle_key()  # a new session id for the raised privilege
    request.session[SESSION_KEY] = device.pk


@transaction.atomic
def confirm_enrollment(request: HttpRequest, device: TotpDevice, code: str) -> bool:
    """Confirms a pending device with its first code; that code also passes this session."""
    if not _use_code(device, code):
        record_audit(request.user, "admin.mfa-failed", device, detail="enrollment")
        return False
    TotpDevice.objects.filter(pk=device.pk).update(confirmed_at=timezone.now())
    record_audit(request.user, "admin.mfa-enroll", device)
    _pass(request, device)
    return True


@transaction.atomic
def verify_second_factor(request: HttpRequest, device: TotpDevice, code: str) -> bool:
    if not _use_code(device, code):
        record_audit(request.user, "admin.mfa-failed", device)
        return False
    _pass(request, device)
    return True

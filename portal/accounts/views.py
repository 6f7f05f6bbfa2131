"""The second-factor pages of Django admin (enroll an authenticator, then give a code after the
password at every sign-in; rules in portal.accounts.mfa), the browsable API's sign-in page and
the single sign-on round trip (rules in portal.accounts.oidc)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import REDIRECT_FIELD_NAME, login
from django.contrib.auth.views import LoginView, redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters

from portal.accounts import mfa, oidc, totp
from portal.lib.throttling import form_post_allowed

WRONG_CODE = "That code is not valid, or it was used already. Wait for the next one."


def next_url(request: HttpRequest) -> str:
    """Where to go after the second factor: the admin page asked for, if it is on this site."""
    target = request.POST.get(REDIRECT_FIELD_NAME) or request.GET.get(REDIRECT_FIELD_NAME, "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return reverse("admin:index")


def second_factor_redirect(request: HttpRequest) -> HttpResponse:
    """To enrollment when the user has no authenticator yet, otherwise to the code form."""
    name = "admin:mfa_verify" if mfa.confirmed_device(request.user) else "admin:mfa_enroll"
    return redirect(f"{reverse(name)}?{urlencode({REDIRECT_FIELD_NAME: next_url(request)})}")


def _code_form(
    request: HttpRequest, template: str, context: dict[str, Any], accept: Callable[[str], bool]
) -> HttpResponse:
    """The code form both pages share: throttled POSTs, `accept` judges the code."""
    if request.method == "POST":
        if not form_post_allowed(request, "admin-mfa"):
            context["error"] = "Too many codes tried. Wait a minute, then try again."
            return render(request, template, context, status=429)
        if accept(request.POST.get("code", "")):
            return redirect(next_url(request))
        context["error"] = WRONG_CODE
    return render(request, template, context)


def _staff_only(request: HttpRequest) -> HttpResponse | None:
    if request.user.is_active and request.user.is_staff:
        return None
    return redirect_to_login(request.get_full_path(), reverse("admin:login"))


@never_cache
@sensitive_post_parameters("code")
def mfa_verify(request: HttpRequest) -> HttpResponse:
    if (refused := _staff_only(request)) is not None:
        return refused
    device = mfa.confirmed_device(request.user)
    if device is None:
        return second_factor_redirect(request)
    context = {**admin.site.each_context(request), "title": "One-time code", "next": next_url(request)}
    return _code_form(
        request,
        "admin/mfa_verify.html",
        context,
        lambda code: mfa.verify_second_factor(request, device, code),
    )


@never_cache
@sensitive_post_parameters("code")
def mfa_enroll(request: HttpRequest) -> HttpResponse:
    if (refused := _staff_only(request)) is not None:
        return refused
    if mfa.confirmed_device(request.user) is not None:
        return second_factor_redirect(request)
    device = mfa.pending_device(request.user)
    context = {
        **admin.site.each_context(request),
        "title": "Set up your authenticator",
        "next": next_url(request),
        "secret": device.secret,
        "otpauth_uri": totp.otpauth_uri(device.secret, request.user.get_username()),
    }
    return _code_form(
        request, "admin/mfa_enroll.html", context, lambda code: mfa.confirm_enrollment(request, device, code)
    )


class ThrottledLoginView(LoginView):
    """The browsable API's sign-in page (`/api-auth/login/`, DRF's own form and template). A
    password form like the others, so its POSTs count against the same `sign-in` limit as
    `POST /api/v1/session/` and Django admin's: otherwise it would be the one place to guess
    passwords at full speed."""

    template_name = "rest_framework/login.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not form_post_allowed(request, "sign-in"):
            return HttpResponse(
                "Too many sign-in attempts. Wait a minute.", status=429, content_type="text/plain"
            )
        return super().post(request, *args, **kwargs)


def _sso_refused(request: HttpRequest, error: oidc.SsoRefused) -> HttpResponse:
    context = {"message": str(error), "provider": settings.OIDC_PROVIDER_NAME}
    return render(request, "accounts/sso_refused.html", context, status=400)


@never_cache
def oidc_login(request: HttpRequest) -> HttpResponse:
    """Off to the sign-on provider; `next` is where to land afterwards."""
    if not oidc.enabled():
        raise Http404("Single sign-on is not set up.")
    try:
        return redirect(oidc.begin(request, request.GET.get("next")))
    except oidc.SsoRefused as error:
        return _sso_refused(request, error)


@never_cache
def oidc_callback(request: HttpRequest) -> HttpResponse:
    """Back from the sign-on provider: sign the user in, or say why not."""
    if not oidc.enabled():
        raise Http404("Single sign-on is not set up.")
    try:
        user, next_path = oidc.complete(request, request.GET)
    except oidc.SsoRefused as error:
        return _sso_refused(request, error)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect(next_path)

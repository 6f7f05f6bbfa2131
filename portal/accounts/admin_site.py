"""Django admin for cluster admins only, and only with a second factor (S13).

The site replaces Django's default one (INSTALLED_APPS names portal.accounts.apps.PortalAdminConfig
instead of django.contrib.admin), so every ModelAdmin registered with `admin.register` is behind it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path

from portal.accounts import mfa, views
from portal.lib.throttling import form_post_allowed


class PortalAdminSite(admin.AdminSite):
    site_header = "GPU Portal administration"
    site_title = "GPU Portal admin"

    def has_permission(self, request: HttpRequest) -> bool:
        """Active staff who passed the second factor in this session; nobody else, whatever
        their role in a tenant."""
        return super().has_permission(request) and mfa.admin_mfa_passed(request)

    def get_urls(self) -> list[URLPattern | URLResolver]:
        return [
            path("mfa/", views.mfa_verify, name="mfa_verify"),
            path("mfa/enroll/", views.mfa_enroll, name="mfa_enroll"),
            *super().get_urls(),
        ]

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The password form, throttled like the API's sign-in; a cluster admin who got past it
        goes on to the second factor instead of the page asked for."""
        if request.method == "POST" and not form_post_allowed(request, "sign-in"):
            return HttpResponse(
                "Too many sign-in attempts. Wait a minute.", status=429, content_type="text/plain"
            )
        if request.method == "GET" and mfa.needs_second_factor(request):
            return views.second_factor_redirect(request)
        response = super().login(request, extra_context)
        if request.method == "POST" and mfa.needs_second_factor(request):
            return views.second_factor_redirect(request)
        return response

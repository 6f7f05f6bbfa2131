from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class AccountsConfig(AppConfig):
    name = "portal.accounts"
    label = "accounts"
    verbose_name = "Tenants and accounts"


class PortalAdminConfig(admin_apps.AdminConfig):
    """Django admin with the portal's site: cluster admins only, with a second factor.
    INSTALLED_APPS names it in place of django.contrib.admin."""

    default = False  # not the accounts app's own config
    default_site = "portal.accounts.admin_site.PortalAdminSite"

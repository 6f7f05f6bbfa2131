from django.urls import path
from rest_framework.routers import SimpleRouter

from portal.accounts.api import views

router = SimpleRouter()
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")
router.register("webhooks", views.WebhookViewSet, basename="webhook")
router.register("tenants", views.TenantViewSet, basename="tenant")

# Nested under a tenant, so mapped by hand; the basename names its refusals in the audit log.
members = views.TenantMemberViewSet

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("session/", views.SessionView.as_view(), name="session"),
    path("session/sso/", views.SsoView.as_view(), name="session-sso"),
    path(
        "tenants/<str:tenant>/members/",
        members.as_view({"get": "list", "post": "create"}, basename="tenant-member", detail=False),
        name="tenant-member-list",
    ),
    path(
        "tenants/<str:tenant>/members/<str:username>/",
        members.as_view(
            {"patch": "partial_update", "delete": "destroy"}, basename="tenant-member", detail=True
        ),
        name="tenant-member-detail",
    ),
    *router.urls,
]

from django.contrib import admin
from django.contrib.auth.views import LogoutView
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from portal.accounts.views import ThrottledLoginView, oidc_callback, oidc_login
from portal.agentgw.views import enroll
from portal.lib.views import healthz
from portal.metrics.views import metrics

# DRF's sign-in and sign-out pages for the browsable API (rest_framework.urls), but with the
# sign-in throttled like every other password form.
api_auth = (
    [
        path("login/", ThrottledLoginView.as_view(), name="login"),
        path("logout/", LogoutView.as_view(), name="logout"),
    ],
    "rest_framework",
)

api_v1 = [
    path("", include("portal.accounts.api.urls")),
    path("", include("portal.cluster.api.urls")),
    path("", include("portal.jobs.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api-auth/", include(api_auth)),
    path("agent/enroll/", enroll, name="agent-enroll"),
    path("auth/oidc/login/", oidc_login, name="oidc-login"),
    path("auth/oidc/callback/", oidc_callback, name="oidc-callback"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("", include("portal.web.urls")),
]

from django.urls import path
from rest_framework.routers import SimpleRouter

from portal.accounts.api import views

router = SimpleRouter()
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")
router.register("webhooks", views.WebhookViewSet, basename="webhook")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("session/", views.SessionView.as_view(), name="session"),
    *router.urls,
]

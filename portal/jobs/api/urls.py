from django.urls import path
from rest_framework.routers import SimpleRouter

from portal.jobs.api import views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("templates", views.JobTemplateViewSet, basename="jobtemplate")

urlpatterns = [path("usage/", views.UsageView.as_view(), name="usage"), *router.urls]

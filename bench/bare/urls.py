from django.urls import path

from bench.bare.views import BareJobCreate
from portal.urls import urlpatterns as portal_urlpatterns

urlpatterns = [path("bench/bare-jobs/", BareJobCreate.as_view()), *portal_urlpatterns]

from django.urls import re_path

from portal.web.views import spa

# Last in portal/urls.py: anything that is not the API, admin, static files or a websocket.
urlpatterns = [
    re_path(r"^(?!api/|admin/|api-auth/|auth/|static/|ws/|healthz|metrics)(?P<path>.*)$", spa, name="spa")
]

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from portal.live.consumers import LiveConsumer

# Session auth, and only pages of this site may open the socket (origin checked).
websocket_urlpatterns = [
    path("ws/live/", AllowedHostsOriginValidator(AuthMiddlewareStack(LiveConsumer.as_asgi())))
]

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from portal.accounts.websocket import BearerTokenMiddleware
from portal.shell.consumers import ShellConsumer

# A client that is not a browser (Authorization, no Origin) signs in with an API token; a browser
# with its session, and only pages of this site may open the socket (origin checked), as /ws/live/.
shell = ShellConsumer.as_asgi()
websocket_urlpatterns = [
    path(
        "ws/jobs/<int:job_id>/shell/",
        BearerTokenMiddleware(shell, browsers=AllowedHostsOriginValidator(AuthMiddlewareStack(shell))),
    )
]

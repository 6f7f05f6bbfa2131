"""Websocket routes: agents on /ws/agent/ (node tokens), browsers on /ws/live/ and
/ws/jobs/<id>/shell/ (sessions); the shell also takes API tokens from clients that are not
browsers (the CLI)."""

from portal.agentgw.routing import websocket_urlpatterns as agent_routes
from portal.live.routing import websocket_urlpatterns as live_routes
from portal.shell.routing import websocket_urlpatterns as shell_routes

websocket_urlpatterns = [*agent_routes, *live_routes, *shell_routes]

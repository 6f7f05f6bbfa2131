"""Websocket routes: agents on /ws/agent/ (node tokens), browsers on /ws/live/ (sessions)."""

from portal.agentgw.routing import websocket_urlpatterns as agent_routes
from portal.live.routing import websocket_urlpatterns as live_routes

websocket_urlpatterns = [*agent_routes, *live_routes]

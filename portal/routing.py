"""Websocket routes. Agents and browsers each get their own consumers."""

from portal.agentgw.routing import websocket_urlpatterns as agent_routes

websocket_urlpatterns = [*agent_routes]

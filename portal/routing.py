"""Websocket routes. Agents and browsers each get their own consumers."""

websocket_urlpatterns: list = []

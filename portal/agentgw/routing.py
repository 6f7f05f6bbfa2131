from django.urls import path

from portal.agentgw.consumers import AgentConsumer

websocket_urlpatterns = [path("ws/agent/", AgentConsumer.as_asgi())]

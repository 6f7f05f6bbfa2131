from django.apps import AppConfig


class AgentGatewayConfig(AppConfig):
    name = "portal.agentgw"
    label = "agentgw"
    verbose_name = "Agent gateway"

"""ASGI entry point: HTTP through Django, websockets through Channels."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from portal.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

# What is loaded by now lives as long as the process, and with a socket per agent the default
# thresholds rescan the long-lived objects many times a second: with 1,000 agents streaming
# telemetry this cuts the event loop's CPU by about a fifth (python -m bench.telemetry).
gc.freeze()
gc.set_threshold(20_000, 50, 100)

"""ASGI entry point: HTTP through Django, websockets through Channels."""

import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Each request runs in a thread of its own here: without a pool, every request leaves a
# connection behind until the garbage collector finds it (settings.py, DATABASE_POOL_SIZE).
os.environ.setdefault("DATABASE_POOL_SIZE", "16")
django.setup(set_prefix=False)  # as get_asgi_application() does, for the handler below

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from portal.lib.asgi import PortalASGIHandler  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

# Django's handler, except that a request the client aborts still returns its pooled database
# connection (portal/lib/asgi.py).
django_asgi_app = PortalASGIHandler()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

# What is loaded by now lives as long as the process: frozen, the collector never rescans it
# (with 1,000 agents streaming telemetry the rescans took about a fifth of the event loop's CPU).
# The young generation stays small: a submission leaves some 330 objects in reference cycles
# (DRF's bound serializer fields, Django's model states), and a threshold of 20,000 let 16,000 of
# them pile up into one pass of 15-20 ms of CPU that every request and socket of the process
# waited for. At 1,000 the longest pass is under 3 ms for about the same CPU per submission
# (bench.submit_cpu); telemetry ingestion pays a few per cent more CPU (bench.telemetry).
gc.freeze()
gc.set_threshold(1_000, 20, 100)

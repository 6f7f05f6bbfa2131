from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from portal.cluster.services import mark_silent_nodes_not_ready


@shared_task
def check_node_heartbeats() -> list[str]:
    return mark_silent_nodes_not_ready(timezone.now(), settings.NODE_SILENT_AFTER_S)

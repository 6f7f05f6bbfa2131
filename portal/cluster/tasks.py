from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from portal.cluster.models import Node
from portal.cluster.services import lost_nodes, mark_silent_nodes_not_ready
from portal.jobs.services import request_scheduling_cycle, requeue_jobs_of_lost_node
from scheduler.tasks import loop_paused


@shared_task
def check_node_heartbeats() -> dict[str, list]:
    """Silent nodes become not-ready (no new work); nodes silent for longer are lost, and their
    jobs are requeued with a new attempt elsewhere. Paused with the loop, so that maintenance on
    the network does not turn into a storm of requeues."""
    if loop_paused():
        return {"paused": [True]}
    now = timezone.now()
    suspect = mark_silent_nodes_not_ready(now, settings.NODE_SILENT_AFTER_S)
    requeued = []
    for node in Node.objects.filter(name__in=lost_nodes(now, settings.NODE_LOST_AFTER_S)):
        requeued += requeue_jobs_of_lost_node(node)
    if suspect:
        request_scheduling_cycle()
    return {"not_ready": suspect, "requeued": requeued}

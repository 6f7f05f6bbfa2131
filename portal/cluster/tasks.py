from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.utils import timezone

from portal.accounts import webhooks
from portal.cluster import budgets
from portal.cluster.models import Node, VirtualCluster
from portal.cluster.services import lost_nodes, mark_silent_nodes_not_ready
from portal.jobs.notifications import portal_url, tenant_admins
from portal.jobs.services import request_scheduling_cycle, requeue_jobs_of_lost_node
from portal.jobs.tasks import MAIL_RETRY, post_to_webhooks
from portal.lib.redis import get_redis
from scheduler.tasks import loop_paused

CHECKED_AT_KEY = "cluster:heartbeats-checked-at"
GRACE_KEY = "cluster:heartbeats-grace"


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
    if silence_is_the_nodes(now):
        for node in Node.objects.filter(name__in=lost_nodes(now, settings.NODE_LOST_AFTER_S)):
            requeued += requeue_jobs_of_lost_node(node)
    if suspect:
        request_scheduling_cycle()
    return {"not_ready": suspect, "requeued": requeued}


def silence_is_the_nodes(now: datetime) -> bool:
    """Whether a silent node may be declared lost. Not when the portal itself was not listening:
    when no node at all was heard lately (the agent gateway is down or cut off; Kubernetes stops
    evicting on a full disruption for the same reason), or when this check had not run for
    longer than a node may be silent (the portal was stopped or the loop paused). After either,
    agents get NODE_LOST_AFTER_S to reconnect before any node is lost, so that an outage of the
    portal does not requeue every running job. The marks live in Redis: losing them only delays
    a verdict by one grace period."""
    redis = get_redis()
    previous = redis.set(CHECKED_AT_KEY, now.timestamp(), get=True)
    period = settings.CELERY_BEAT_SCHEDULE["check-node-heartbeats"]["schedule"]
    away = previous is None or now.timestamp() - float(previous) > max(settings.NODE_LOST_AFTER_S, 2 * period)
    heard = Node.objects.filter(
        last_heartbeat_at__gte=now - timedelta(seconds=settings.NODE_SILENT_AFTER_S)
    ).exists()
    if away or not heard:
        redis.set(GRACE_KEY, 1, ex=settings.NODE_LOST_AFTER_S)
        return False
    return not redis.exists(GRACE_KEY)


@shared_task
def check_budgets() -> Any:
    """Tells tenant admins when a VC has used most or all of its monthly GPU-hour budget."""
    if loop_paused():
        return {"paused": True}
    return budgets.notify_budgets(timezone.now())


@shared_task(**MAIL_RETRY)
def mail_budget_notice(vc_id: int, text: str) -> int:
    """Mails the admins of the VC's tenant who have an address; returns how many mails."""
    vc = VirtualCluster.objects.filter(pk=vc_id).first()
    to = [admin.email for admin in tenant_admins(vc.tenant_id) if admin.email] if vc else []
    if vc is None or not settings.MAIL_ENABLED or not to:
        return 0
    body = f"{text}.\n\n{vc_url(vc.name)}\n"
    return send_mail(f"VC {vc.name}: GPU-hour budget", body, None, to)


@shared_task(bind=True)
def post_budget_notice(self: Any, vc_id: int, text: str) -> int:
    """Posts the notice to each enabled webhook of the tenant's admins; returns how many."""
    vc = VirtualCluster.objects.filter(pk=vc_id).first()
    if vc is None:
        return 0
    payload = webhooks.event(webhooks.VC_BUDGET, text, vc=vc.name, reason=text, url=vc_url(vc.name))
    return sum(post_to_webhooks(self.request.id, admin.pk, payload) for admin in tenant_admins(vc.tenant_id))


def vc_url(name: str) -> str:
    return portal_url(f"/vcs/{name}")

"""`/ws/live/`: the browser's live view of jobs, logs and GPU telemetry.

The browser signs in with its session. It subscribes to "jobs" (every job of its tenants) or to
one job; a job it may not see is answered exactly like one that does not exist. What it may see
is checked when it subscribes; when that changes (a sign-out, a membership removed or changed,
the account changed by an admin: portal.live.signals), and when the session expires, the socket
is closed with code 4403 and a browser still signed in reconnects and subscribes again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import timezone

from portal.accounts.models import Tenant
from portal.accounts.websocket import credential_expiry, ends_access
from portal.jobs.models import Job
from portal.lib.db import database_sync_to_async
from portal.live.hub import hub
from portal.live.publish import ALL_JOBS_GROUP, job_group, tenant_group, user_group

MAX_SUBSCRIPTIONS = 50


def visible_job(user: Any, job_id: Any) -> bool:
    return isinstance(job_id, int) and Job.objects.for_user(user).filter(pk=job_id).exists()


def tenant_groups(user: Any) -> list[str]:
    if user.is_staff:
        return [ALL_JOBS_GROUP]
    return [tenant_group(pk) for pk in Tenant.objects.for_user(user).values_list("pk", flat=True)]


class LiveConsumer(AsyncJsonWebsocketConsumer):
    expiry_watch: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined: set[str] = set()
        await self.accept()
        await hub().join(user_group(user.pk), self.access_changed)
        if (expiry := await database_sync_to_async(credential_expiry)(self.scope)) is not None:
            self.expiry_watch = asyncio.create_task(self.close_at((expiry - timezone.now()).total_seconds()))

    async def close_at(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
        await self.close(code=4403)

    async def send_text(self, text: str) -> None:
        await self.send(text_data=text)

    async def access_changed(self, text: str) -> None:
        if ends_access(self.scope, text):
            await self.close(code=4403)

    async def disconnect(self, code: int) -> None:
        if self.expiry_watch is not None:
            self.expiry_watch.cancel()
        for group in getattr(self, "groups_joined", set()):
            await hub().leave(group, self.send_text)
        user = self.scope.get("user")
        if user is not None and user.is_authenticated:
            await hub().leave(user_group(user.pk), self.access_changed)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        user = self.scope["user"]
        if not isinstance(content, dict):
            await self.send_json({"error": "send a JSON object"})
            return
        topic = content.get("subscribe")
        if topic == "jobs":
            groups = await database_sync_to_async(tenant_groups)(user)
        elif topic == "job":
            if not await database_sync_to_async(visible_job)(user, content.get("id")):
                await self.send_json({"error": "not found", "subscribe": "job", "id": content.get("id")})
                return
            groups = [job_group(content["id"])]
        else:
            await self.send_json({"error": "subscribe to 'jobs' or to a 'job' with an 'id'"})
            return
        if len(self.groups_joined) + len(groups) > MAX_SUBSCRIPTIONS:
            await self.send_json({"error": f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection"})
            return
        for group in groups:
            await hub().join(group, self.send_text)
            self.groups_joined.add(group)
        await self.send_json({"subscribed": topic, "id": content.get("id")})

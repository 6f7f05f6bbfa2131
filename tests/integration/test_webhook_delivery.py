"""Webhooks through the live stack's real Celery worker: a job's transition queues the notice after
commit, the worker delivers it to a receiver on loopback (the live stack allows loopback hosts),
a 503 is tried again later, and the outcome is recorded."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from portal.accounts.models import Webhook
from tests.conftest import wait_for
from tests.webhook_receiver import running_receiver

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "hooked", "vc": "vision", "flavor": "s-A100", "command": "sleep 600", "notify": ["cancelled"]}


def test_the_worker_delivers_a_notified_state_and_retries_a_503(live_stack: Any, users: Any) -> None:
    alice = APIClient()
    alice.force_authenticate(users["alice"])
    with running_receiver() as receiver:
        receiver.answer(503)
        webhook = Webhook.objects.create(user=users["alice"], url=receiver.url + "/live", format="json")
        job = alice.post("/api/v1/jobs/", SPEC, format="json").json()["id"]
        assert alice.post(f"/api/v1/jobs/{job}/cancel/").status_code == 200
        # the first try gets the 503; the next, 10 s later, gets through
        tries = wait_for(lambda: len(receiver.to("/live")) >= 2 and receiver.to("/live"), 60, "two tries")
        assert [t.json()["state"] for t in tries] == ["cancelled", "cancelled"]
        assert tries[0].headers["X-GPU-Portal-Delivery"] == tries[1].headers["X-GPU-Portal-Delivery"]
        recorded = wait_for(
            lambda: Webhook.objects.filter(pk=webhook.pk, last_delivery_status=200).first(), 10, "the outcome"
        )
        assert recorded.last_delivery_event == "job.state" and recorded.last_delivery_error == ""

"""An admin stops a virtual cluster (Kueue's stopPolicy) in Django admin: held, none of its jobs
starts (they wait with reason vc-stopped and no place in the queue) while other VCs' jobs do;
held and drained, its running jobs are checkpointed and requeued too; reopened, its jobs start."""

from __future__ import annotations

from typing import Any

import pytest

from portal.accounts.models import AuditEntry
from portal.cluster.models import Node, VirtualCluster
from portal.jobs.choices import JobState
from portal.jobs.models import Job
from scheduler.tasks import run_cycle
from tests.portal.store_helpers import live_profile, post_vc_change, run, submit

pytestmark = pytest.mark.django_db(transaction=True)


def stop(client: Any, policy: str) -> None:
    response = post_vc_change(client, stop_policy=policy)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert VirtualCluster.objects.get(name="vision").stop_policy == policy


def test_a_held_vc_starts_nothing_a_drained_one_empties_and_reopened_it_starts(
    api_for: Any, cluster_admin_client: Any, paused_loop: Any
) -> None:
    Node.objects.update(state="ready")
    running = submit(api_for("alice"), "running", flavor="s-A100")
    run_cycle(live_profile())
    run(running)

    stop(cluster_admin_client, "hold")
    waiting = submit(api_for("alice"), "waiting", flavor="s-A100")
    elsewhere = submit(api_for("carol"), "elsewhere", vc="speech", flavor="s-A100")
    run_cycle(live_profile())
    job = Job.objects.get(pk=waiting)
    assert (job.state, job.pending_reason, job.queue_position) == (JobState.PENDING, "vc-stopped", None)
    assert (
        job.pending_message
        == "VC vision was stopped by an admin: none of its jobs starts until it is open again"
    )
    assert Job.objects.get(pk=elsewhere).state == JobState.SCHEDULED
    assert Job.objects.get(pk=running).state == JobState.RUNNING  # a hold lets it run on

    stop(cluster_admin_client, "hold-and-drain")
    run_cycle(live_profile())
    drained = Job.objects.get(pk=running)
    assert drained.state == JobState.CHECKPOINTING
    assert drained.events.filter(data__preemption="vc-drain").exists()
    assert (
        AuditEntry.objects.filter(action="admin.change", object_id=str(drained.virtual_cluster_id)).count()
        == 2
    )

    stop(cluster_admin_client, "")
    run_cycle(live_profile())
    assert Job.objects.get(pk=waiting).state == JobState.SCHEDULED

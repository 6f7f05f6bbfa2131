"""The agents of a test cluster, scripted: what the portal hears from them, through the service
their gateway calls."""

from __future__ import annotations

import itertools

from django.utils import timezone

from agents.protocol import AttemptState, AttemptStatus, ExitReason
from portal.agentgw.desired import agent_attempt_id, desired_set_for
from portal.cluster.choices import NodeState
from portal.cluster.models import Node
from portal.jobs.choices import JobState
from portal.jobs.models import Allocation, Job
from portal.jobs.services import record_attempt_status


class ScriptedAgents:
    """The agents of every node, reduced to what the portal hears from them: each does what
    its node's desired set asks and reports it, as the agent's reconcile loop would. The agent
    of a node that is not ready is silent."""

    def __init__(self) -> None:
        self._generation = itertools.count(1)

    def report(
        self,
        node: Node,
        attempt_id: str,
        job_id: int,
        state: AttemptState,
        reason: ExitReason | None = None,
        exit_code: int | None = None,
    ) -> None:
        status = AttemptStatus(
            attempt_id=attempt_id,
            job_id=str(job_id),
            state=state,
            generation=next(self._generation),
            time=timezone.now(),
            reason=reason,
            exit_code=exit_code,
        )
        record_attempt_status(node, status)

    def converge(self) -> None:
        for node in Node.objects.filter(state=NodeState.READY):
            desired_set = desired_set_for(node).attempts
            # Not desired but still live here (a stop without a checkpoint): SIGTERM, then gone.
            wanted = {desired.attempt_id for desired in desired_set}
            live = Allocation.objects.filter(node=node, released_at__isnull=True)
            for attempt_id, job_id, replica in live.values_list(
                "attempt_id", "attempt__job_id", "replica"
            ).distinct():
                if f"{attempt_id}.{replica}" not in wanted:
                    self.report(
                        node, f"{attempt_id}.{replica}", job_id, AttemptState.EXITED, ExitReason.STOPPED, 143
                    )
            for desired in desired_set:
                job_id, attempt_id = int(desired.job_id), desired.attempt_id
                if Job.objects.values_list("state", flat=True).get(pk=job_id) == JobState.CHECKPOINTING:
                    if desired.checkpoint_and_stop:
                        self.report(node, attempt_id, job_id, AttemptState.EXITED, ExitReason.CHECKPOINTED, 0)
                elif desired.run_state == "suspended":
                    self.report(node, attempt_id, job_id, AttemptState.SUSPENDED)
                else:
                    self.report(node, attempt_id, job_id, AttemptState.RUNNING)

    def end(self, job: Job, reason: ExitReason, exit_code: int) -> None:
        """Every replica of the job's current attempt exits."""
        attempt = job.current_attempt()
        held = Allocation.objects.filter(attempt=attempt, released_at__isnull=True)
        for node_id, replica in held.values_list("node_id", "replica").distinct():
            node, replica_id = Node.objects.get(pk=node_id), agent_attempt_id(attempt, replica)
            self.report(node, replica_id, job.pk, AttemptState.EXITED, reason, exit_code)

"""Reconcile: the portal's desired set vs. what runs on the node -> the actions that converge them.

A pure function, run on every desired set (so after every reconnect too). The rules:

- desired, unknown here          -> Start (an attempt runs at most once: see below)
- desired, live here             -> Watch (make sure logs stream), and Suspend or Resume
                                    until the live state matches ``run_state``; with
                                    ``checkpoint_and_stop`` set: Checkpoint instead, unless
                                    the agent is busy with the attempt already
- desired, ended here            -> Report its terminal state again; never restart it,
                                    the portal makes a new attempt if it wants another run
- not desired, live here         -> Stop with the attempt's grace period (moved elsewhere,
                                    cancelled or preempted); left alone while the agent is
                                    busy stopping or checkpointing it, which ends in a stop
                                    anyway (a stop that failed, or that an agent restart
                                    interrupted, is not busy: it is stopped again)
- not desired, ended here        -> Report once more, then Remove (forget it)

Stops come first in the returned list. The agent begins them before it starts anything, each
in a task of its own, and a start that was given a GPU of an attempt still being stopped waits
for that stop: GPUs freed by a stop are free before an attempt that was given them starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.protocol import AttemptState, DesiredAttempt


@dataclass(frozen=True)
class LocalAttempt:
    """What the agent knows about one attempt on its node."""

    attempt_id: str
    state: AttemptState
    grace_s: float
    busy: bool = False  # a stop or checkpoint of the agent is in progress right now


@dataclass(frozen=True)
class Start:
    attempt: DesiredAttempt


@dataclass(frozen=True)
class Stop:
    attempt_id: str
    grace_s: float


@dataclass(frozen=True)
class Suspend:
    attempt_id: str


@dataclass(frozen=True)
class Resume:
    attempt_id: str


@dataclass(frozen=True)
class Checkpoint:
    attempt_id: str


@dataclass(frozen=True)
class Watch:
    attempt_id: str


@dataclass(frozen=True)
class Report:
    attempt_id: str


@dataclass(frozen=True)
class Remove:
    attempt_id: str


Action = Start | Stop | Checkpoint | Suspend | Resume | Watch | Report | Remove

# A checkpoint interrupted by an agent restart is started again; a stop is never undone.
_CHECKPOINTABLE = frozenset({AttemptState.RUNNING, AttemptState.SUSPENDED, AttemptState.CHECKPOINTING})
_PHASE = {Stop: 0, Checkpoint: 1, Suspend: 2, Resume: 3, Start: 4, Watch: 5, Report: 6, Remove: 7}


def reconcile(desired: Sequence[DesiredAttempt], local: Sequence[LocalAttempt]) -> list[Action]:
    """The actions, stops first, each phase in attempt-id order (deterministic)."""
    actions: list[Action] = []
    local_by_id = {item.attempt_id: item for item in local}
    desired_ids = set()
    for attempt in desired:
        desired_ids.add(attempt.attempt_id)
        here = local_by_id.get(attempt.attempt_id)
        if here is None:
            actions.append(Start(attempt))
        elif here.state.is_terminal:
            actions.append(Report(attempt.attempt_id))
        else:
            actions.append(Watch(attempt.attempt_id))
            if attempt.checkpoint_and_stop:
                if not here.busy and here.state in _CHECKPOINTABLE:
                    actions.append(Checkpoint(attempt.attempt_id))
            elif attempt.run_state == "suspended" and here.state == AttemptState.RUNNING:
                actions.append(Suspend(attempt.attempt_id))
            elif attempt.run_state == "running" and here.state == AttemptState.SUSPENDED:
                actions.append(Resume(attempt.attempt_id))
    for here in local:
        if here.attempt_id in desired_ids:
            continue
        if here.state.is_terminal:
            actions += [Report(here.attempt_id), Remove(here.attempt_id)]
        elif not here.busy:
            actions.append(Stop(here.attempt_id, here.grace_s))
    return sorted(actions, key=lambda action: (_PHASE[type(action)], _attempt_id(action)))


def _attempt_id(action: Action) -> str:
    return action.attempt.attempt_id if isinstance(action, Start) else action.attempt_id

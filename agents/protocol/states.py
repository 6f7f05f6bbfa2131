"""Attempt states as the agent observes them, with a total order.

The agent reports an attempt's state many times: after every change, in every hello,
again after a reconnect. Messages can arrive twice, late or out of order. The receiver
therefore keeps, per attempt, the last accepted ``(state, generation)`` and accepts a new
report only if :func:`supersedes` says so. One comparison makes duplicates and late
messages harmless (Determined's ``cproto.State.Before``).

Why a generation as well as a rank: suspend and resume move an attempt back and forth
between ``running`` and ``suspended``, so the state alone cannot be monotone. Both share
one rank; the agent's per-attempt ``generation`` (incremented on every change and kept
on disk) orders reports within a rank. Terminal states are absorbing: nothing, not even
a report with a larger generation, moves an attempt out of ``exited`` or ``vanished``.
"""

from __future__ import annotations

from enum import StrEnum


class AttemptState(StrEnum):
    """Where an attempt is on its node, from the agent's point of view."""

    STARTING = "starting"
    RUNNING = "running"
    SUSPENDED = "suspended"
    CHECKPOINTING = "checkpointing"
    STOPPING = "stopping"
    EXITED = "exited"
    VANISHED = "vanished"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def is_live(self) -> bool:
        """True while a process or container for the attempt may exist."""
        return self not in TERMINAL_STATES


_RANK: dict[AttemptState, int] = {
    AttemptState.STARTING: 0,
    AttemptState.RUNNING: 1,
    AttemptState.SUSPENDED: 1,
    AttemptState.CHECKPOINTING: 2,
    AttemptState.STOPPING: 3,
    AttemptState.EXITED: 4,
    AttemptState.VANISHED: 4,
}

TERMINAL_STATES = frozenset({AttemptState.EXITED, AttemptState.VANISHED})


class ExitReason(StrEnum):
    """Why an attempt reached a terminal state; set only on terminal reports."""

    SUCCEEDED = "succeeded"  # the command exited 0 on its own
    FAILED = "failed"  # the command exited non-zero on its own
    STOPPED = "stopped"  # stopped by a stop request or because it left the desired set
    CHECKPOINTED = "checkpointed"  # stopped after a checkpoint request
    START_FAILED = "start_failed"  # the runtime could not start it (bad image, policy, ...)
    VANISHED = "vanished"  # it was running here and disappeared without an exit code


def order_key(state: AttemptState, generation: int) -> tuple[int, int]:
    """The sort key of a status report: rank first, then the agent's generation."""
    return (state.rank, generation)


def supersedes(
    new_state: AttemptState,
    new_generation: int,
    old_state: AttemptState | None,
    old_generation: int = -1,
) -> bool:
    """Whether a report ``(new_state, new_generation)`` replaces the stored one.

    ``old_state`` is None when nothing was stored yet. A terminal stored state is never
    replaced; otherwise the report wins if its order key is strictly greater, so an
    exact duplicate returns False.
    """
    if old_state is None:
        return True
    if old_state.is_terminal:
        return False
    return order_key(new_state, new_generation) > order_key(old_state, old_generation)

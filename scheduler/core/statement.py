"""Statement: tentative changes to the working state that are committed or discarded as one.

This is what makes gangs all-or-nothing (Volcano's Statement): every replica of a gang is
reserved through the same statement, and if one replica finds no room the whole statement is
discarded, so no partial hold survives into the plan or blocks a later job. Preemption uses
the same mechanism to give back a victim's GPUs tentatively while it searches for a fit.

Operations are typed (`GpuHold` + an explicit kind) rather than named by strings, so an undo
cannot be wired to the wrong inverse.
"""

from __future__ import annotations

from enum import Enum

from scheduler.core.state import ClusterState, GpuHold


class _Op(Enum):
    TAKE = 1
    GIVE = 2


class Statement:
    """Records takes and gives on a ClusterState. After `commit` or `discard` it is empty and
    may be reused. Discard undoes in reverse order, which restores the state exactly even
    when the same GPUs were given and then taken again within the statement."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._ops: list[tuple[_Op, GpuHold]] = []

    def reserve(self, hold: GpuHold) -> None:
        self._state.take(hold)
        self._ops.append((_Op.TAKE, hold))

    def release(self, hold: GpuHold) -> None:
        self._state.give(hold)
        self._ops.append((_Op.GIVE, hold))

    def reserved(self) -> list[GpuHold]:
        return [hold for op, hold in self._ops if op is _Op.TAKE]

    def absorb(self, other: Statement) -> None:
        """Take over `other`'s operations (after ours), so one commit or discard covers both."""
        self._ops.extend(other._ops)
        other._ops.clear()

    def commit(self) -> None:
        self._ops.clear()

    def discard(self) -> None:
        for op, hold in reversed(self._ops):
            if op is _Op.TAKE:
                self._state.give(hold)
            else:
                self._state.take(hold)
        self._ops.clear()

    def __len__(self) -> int:
        return len(self._ops)

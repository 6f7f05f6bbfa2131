"""Reconcile is a pure function: a table of (desired, local) -> actions."""

from __future__ import annotations

import pytest
from agent_builders import make_attempt

from agents.protocol import AttemptState as S
from agents.reconcile import (
    Checkpoint,
    LocalAttempt,
    Remove,
    Report,
    Resume,
    Start,
    Stop,
    Suspend,
    Watch,
    reconcile,
)

A = make_attempt("a")
B = make_attempt("b")
A_SUSPENDED = make_attempt("a", run_state="suspended")
A_CKPT = make_attempt("a", run_state="suspended", checkpoint_and_stop=True)
CKPT = Checkpoint("a")


def local(attempt_id: str, state: S, grace_s: float = 30.0, busy: bool = False) -> LocalAttempt:
    return LocalAttempt(attempt_id, state, grace_s, busy)


CASES = [
    ("nothing to do", [], [], []),
    ("new attempt starts", [A], [], [Start(A)]),
    ("running and desired is watched", [A], [local("a", S.RUNNING)], [Watch("a")]),
    ("starting and desired is watched", [A], [local("a", S.STARTING)], [Watch("a")]),
    ("not desired any more is stopped with its grace", [], [local("a", S.RUNNING, 12)], [Stop("a", 12)]),
    ("suspended and not desired is stopped", [], [local("a", S.SUSPENDED)], [Stop("a", 30.0)]),
    ("being stopped is left alone", [], [local("a", S.STOPPING, busy=True)], []),
    ("being checkpointed is left alone", [], [local("a", S.CHECKPOINTING, busy=True)], []),
    ("a stop that failed or was interrupted is retried", [], [local("a", S.STOPPING, 7)], [Stop("a", 7)]),
    ("an interrupted checkpoint ends in a stop", [], [local("a", S.CHECKPOINTING, 7)], [Stop("a", 7)]),
    ("exited and desired is reported, never restarted", [A], [local("a", S.EXITED)], [Report("a")]),
    ("vanished and desired is reported, never restarted", [A], [local("a", S.VANISHED)], [Report("a")]),
    (
        "exited and not desired is reported then removed",
        [],
        [local("a", S.EXITED)],
        [Report("a"), Remove("a")],
    ),
    ("desired suspended while running", [A_SUSPENDED], [local("a", S.RUNNING)], [Suspend("a"), Watch("a")]),
    ("desired running while suspended", [A], [local("a", S.SUSPENDED)], [Resume("a"), Watch("a")]),
    ("desired suspended and suspended", [A_SUSPENDED], [local("a", S.SUSPENDED)], [Watch("a")]),
    ("no suspend while checkpointing", [A_SUSPENDED], [local("a", S.CHECKPOINTING, busy=True)], [Watch("a")]),
    (
        "checkpoint_and_stop checkpoints a running attempt",
        [A_CKPT],
        [local("a", S.RUNNING)],
        [Checkpoint("a"), Watch("a")],
    ),
    (
        "... and a suspended one (no resume first)",
        [A_CKPT],
        [local("a", S.SUSPENDED)],
        [Checkpoint("a"), Watch("a")],
    ),
    ("... not twice", [A_CKPT], [local("a", S.CHECKPOINTING, busy=True)], [Watch("a")]),
    (
        "... again after an agent restart",
        [A_CKPT],
        [local("a", S.CHECKPOINTING)],
        [Checkpoint("a"), Watch("a")],
    ),
    ("... never undoing a stop", [A_CKPT], [local("a", S.STOPPING)], [Watch("a")]),
    ("... not before it started", [A_CKPT], [local("a", S.STARTING)], [Watch("a")]),
    ("... and never a new one", [A_CKPT], [], [Start(A_CKPT)]),
    (
        "moved: stop the old one before starting the new one",
        [B],
        [local("a", S.RUNNING, 5)],
        [Stop("a", 5), Start(B)],
    ),
    (
        "a full resync",
        [make_attempt("c"), make_attempt("d"), make_attempt("e")],
        [local("b", S.RUNNING), local("c", S.RUNNING), local("d", S.VANISHED), local("f", S.EXITED)],
        [
            Stop("b", 30.0),
            Start(make_attempt("e")),
            Watch("c"),
            Report("d"),
            Report("f"),
            Remove("f"),
        ],
    ),
]


@pytest.mark.parametrize(
    ("desired", "here", "expected"), [case[1:] for case in CASES], ids=[c[0] for c in CASES]
)
def test_reconcile(desired, here, expected) -> None:
    assert reconcile(desired, here) == expected


def test_reconcile_is_idempotent_once_converged() -> None:
    """After the actions are carried out, the same desired set asks for nothing but watching."""
    desired = [A, B]
    assert reconcile(desired, [local("a", S.RUNNING), local("b", S.RUNNING)]) == [Watch("a"), Watch("b")]

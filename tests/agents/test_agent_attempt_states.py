"""The monotone order of attempt states makes duplicate and late reports harmless."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.protocol import AttemptState as S
from agents.protocol import supersedes


@pytest.mark.parametrize(
    ("old", "new", "accepted"),
    [
        (None, (S.STARTING, 0), True),
        ((S.STARTING, 0), (S.RUNNING, 1), True),
        ((S.RUNNING, 1), (S.RUNNING, 1), False),  # exact duplicate
        ((S.RUNNING, 1), (S.STARTING, 0), False),  # late
        ((S.RUNNING, 1), (S.SUSPENDED, 2), True),
        ((S.SUSPENDED, 2), (S.RUNNING, 3), True),  # resume after suspend
        ((S.RUNNING, 3), (S.SUSPENDED, 2), False),  # late suspend after resume
        ((S.RUNNING, 3), (S.EXITED, 4), True),
        ((S.EXITED, 4), (S.RUNNING, 9), False),  # terminal is absorbing
        ((S.EXITED, 4), (S.VANISHED, 5), False),
        ((S.RUNNING, 7), (S.EXITED, 0), True),  # terminal wins even with a reset generation
        ((S.CHECKPOINTING, 4), (S.RUNNING, 5), False),
        ((S.CHECKPOINTING, 4), (S.STOPPING, 5), True),
    ],
    ids=lambda value: str(value),
)
def test_supersedes(old, new, accepted) -> None:
    old_state, old_generation = old if old else (None, -1)
    assert supersedes(new[0], new[1], old_state, old_generation) is accepted


def apply(sequence):
    kept = None
    for state, generation in sequence:
        if supersedes(state, generation, kept[0] if kept else None, kept[1] if kept else -1):
            kept = (state, generation)
    return kept


# What one agent can emit for one attempt: a new generation for every change, and at most
# one terminal report (the last word).
live_states = st.sampled_from([state for state in S if not state.is_terminal])
histories = st.lists(
    st.tuples(live_states, st.integers(0, 50)), min_size=1, max_size=10, unique_by=lambda r: r[1]
)


@given(histories, st.sampled_from([None, S.EXITED, S.VANISHED]), st.data())
def test_any_delivery_order_with_duplicates_ends_at_the_same_report(history, terminal, data) -> None:
    reports = list(history)
    if terminal is not None:
        reports.append((terminal, max(generation for _, generation in history) + 1))
    delivered = data.draw(
        st.permutations(reports + data.draw(st.lists(st.sampled_from(reports), max_size=5)))
    )
    expected = reports[-1] if terminal is not None else max(history, key=lambda r: (r[0].rank, r[1]))
    assert apply(delivered) == expected

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


reports = st.tuples(st.sampled_from(list(S)), st.integers(min_value=0, max_value=20))


@given(st.lists(reports, min_size=1, max_size=12), st.permutations(range(12)))
def test_any_delivery_order_of_a_report_set_ends_at_the_same_kept_report(batch, _order) -> None:
    """Applying reports in any order keeps the maximum one, unless a terminal one came first."""

    def apply(sequence):
        kept = None
        for state, generation in sequence:
            if supersedes(state, generation, kept[0] if kept else None, kept[1] if kept else -1):
                kept = (state, generation)
        return kept

    kept = apply(batch)
    assert kept is not None
    assert kept == apply([*batch, *batch])  # duplicates change nothing
    if not any(state.is_terminal for state, _ in batch):
        assert kept[0].rank == max(state.rank for state, _ in batch)

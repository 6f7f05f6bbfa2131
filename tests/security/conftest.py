"""The security tests end, like the fault tests, with invariants I1-I6 checked."""

from __future__ import annotations

import pytest

from tests.integration.invariants import invariants_checked

__all__ = ["invariants_checked"]


@pytest.fixture(autouse=True)
def _invariants_after_each_test(invariants_checked: set[int]) -> set[int]:
    return invariants_checked

"""Table tests for VC quota and per-user admission."""

from __future__ import annotations

import pytest
from sched_builders import Snap, profile

from scheduler.core import ReasonCode, decide

QUOTA = profile(admission=["vc_quota", "user_limit"])
NO_BORROWING = profile(admission=["vc_quota"], plugin_args={"vc_quota": {"borrowing": False}})


def four_nodes() -> Snap:
    return Snap().nodes(4, 8)


CASES = [
    pytest.param(
        four_nodes().vc("vision", 8).pending("j", gpus_=8, vc="vision"), QUOTA, None, id="inside-guarantee"
    ),
    pytest.param(
        four_nodes()
        .vc("vision", 8)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5))], vc="vision")
        .pending("j", 4, vc="vision"),
        QUOTA,
        "VC vision: 6 of 8 guaranteed A100 in use, borrow limit 0; job needs 4",
        id="over-guarantee-no-borrow-limit",
    ),
    pytest.param(
        four_nodes()
        .vc("vision", 8, borrow=8)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5))], vc="vision")
        .pending("j", 4, vc="vision"),
        QUOTA,
        None,
        id="borrows-idle-capacity",
    ),
    pytest.param(
        four_nodes()
        .vc("vision", 8, borrow=2)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5))], vc="vision")
        .pending("j", 8, vc="vision"),
        QUOTA,
        "VC vision: 6 of 8 guaranteed A100 in use, borrow limit 2; job needs 8",
        id="beyond-borrow-limit",
    ),
    pytest.param(
        four_nodes()
        .vc("vision", 8, borrow=8)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5))], vc="vision")
        .pending("j", 4, vc="vision"),
        NO_BORROWING,
        "VC vision: 6 of 8 guaranteed A100 in use, borrow limit 0; job needs 4",
        id="borrowing-switched-off",
    ),
    pytest.param(
        four_nodes().vc("vision", 8, model="V100").pending("j", 1, vc="vision", gpu_model="A100"),
        QUOTA,
        "VC vision has no quota for A100",
        id="no-quota-for-model",
    ),
    pytest.param(
        four_nodes()
        .vc("vision", 16, max_gpus_per_user=4)
        .running("r", [("n0", (0, 1, 2))], vc="vision", user="alice")
        .pending("j", 2, vc="vision", user="alice"),
        QUOTA,
        "user alice holds 3 of 4 GPUs allowed per user in VC vision; job needs 2",
        id="per-user-limit",
    ),
    pytest.param(
        four_nodes()
        .vc("vision", 16, max_gpus_per_user=4)
        .running("r", [("n0", (0, 1, 2))], vc="vision", user="alice")
        .pending("j", 2, vc="vision", user="bob"),
        QUOTA,
        None,
        id="per-user-limit-is-per-user",
    ),
]


@pytest.mark.parametrize(("snap", "prof", "message"), CASES)
def test_admission(snap: Snap, prof: object, message: str | None) -> None:
    plan = decide(snap.build(), prof, now=10.0)  # type: ignore[arg-type]
    if message is None:
        assert [s.job_id for s in plan.starts] == ["j"]
    else:
        assert not plan.starts
        (status,) = plan.pending
        assert status.message == message
        assert status.reason in (ReasonCode.VC_QUOTA, ReasonCode.USER_LIMIT, ReasonCode.UNKNOWN_VC)


def test_start_reports_borrowed_gpus() -> None:
    snap = four_nodes().vc("vision", 8, borrow=8).running("r", [("n0", (0, 1, 2, 3, 4, 5))], vc="vision")
    plan = decide(snap.pending("j", 4, vc="vision").build(), QUOTA, now=0.0)
    (start,) = plan.starts
    assert start.borrowed_gpus == 2  # 6 + 4 = 10, two above the guarantee of 8

"""Table tests for VC quota and per-user admission."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import Snap, profile

from scheduler.core import ALL_MODELS, Quota, ReasonCode, Snapshot, VcName, VirtualCluster, decide

QUOTA = profile(admission=["vc_quota", "user_limit"])
NO_BORROWING = profile(admission=["vc_quota"], plugin_args={"vc_quota": {"borrowing": False}})


GB = 1024  # MiB


def four_nodes() -> Snap:
    return Snap().nodes(4, 8)


def capped(gpus: int | None = None, cpu: int | None = None, memory: int | None = None) -> Snap:
    """Four nodes (CPU and memory not tracked) and VC vision with these per-user caps."""
    return four_nodes().vc(
        "vision", 16, max_gpus_per_user=gpus, max_cpu_milli_per_user=cpu, max_memory_mib_per_user=memory
    )


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
        "VC vision: 6 of 8 guaranteed GPUs in use, borrow limit 0; job needs 4",
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
        "VC vision: 6 of 8 guaranteed GPUs in use, borrow limit 2; job needs 8",
        id="beyond-borrow-limit",
    ),
    pytest.param(
        four_nodes()
        .vc("vision", 8, borrow=8)
        .running("r", [("n0", (0, 1, 2, 3, 4, 5))], vc="vision")
        .pending("j", 4, vc="vision"),
        NO_BORROWING,
        "VC vision: 6 of 8 guaranteed GPUs in use, borrow limit 0; job needs 4",
        id="borrowing-switched-off",
    ),
    pytest.param(
        # The VC's one row covers every model: its 8 V100 in use bind, though the A100 are free.
        Snap()
        .node("a0", 4, "A100")
        .node("v0", 8, "V100")
        .vc("vision", 8)
        .running("r", [("v0", tuple(range(8)))], vc="vision")
        .pending("j", 2, vc="vision", gpu_model="A100"),
        QUOTA,
        "VC vision: 8 of 8 guaranteed GPUs in use, borrow limit 0; job needs 2",
        id="all-models-row-names-gpus-not-the-jobs-model",
    ),
    pytest.param(
        Snap()
        .node("a0", 4, "A100")
        .node("v0", 8, "V100")
        .vc("vision", 2, model="A100")
        .running("r", [("a0", (0, 1))], vc="vision")
        .pending("j", 2, vc="vision", gpu_model="A100"),
        QUOTA,
        "VC vision: 2 of 2 guaranteed A100 in use, borrow limit 0; job needs 2",
        id="model-row-names-its-model",
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
    pytest.param(
        capped(cpu=64_000)
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=48_000)
        .pending("j", 1, replicas=2, vc="vision", cpu_milli_per_replica=16_000),  # every replica counts
        QUOTA,
        "user alice holds 48 of 64 CPUs allowed per user in VC vision; job needs 32",
        id="per-user-cpu-cap",
    ),
    pytest.param(
        capped(cpu=2_500)
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=1_500)
        .pending("j", 1, vc="vision", cpu_milli_per_replica=1_500),
        QUOTA,
        "user alice holds 1.5 of 2.5 CPUs allowed per user in VC vision; job needs 1.5",
        id="per-user-cpu-cap-in-fractions-of-a-cpu",
    ),
    pytest.param(
        capped(cpu=64_000)
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=48_000, stopping=True)
        .pending("j", 1, vc="vision", cpu_milli_per_replica=32_000),
        QUOTA,
        "user alice holds 48 of 64 CPUs allowed per user in VC vision; job needs 32",
        id="per-user-cpu-cap-counts-a-stopping-job",
    ),
    pytest.param(
        capped(cpu=64_000)
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=48_000, gpu_share_milli=500)
        .pending("j", 1, vc="vision", cpu_milli_per_replica=32_000),
        QUOTA,
        "user alice holds 48 of 64 CPUs allowed per user in VC vision; job needs 32",
        id="per-user-cpu-cap-counts-a-share-of-a-gpu",
    ),
    pytest.param(
        capped(memory=1024 * GB)
        .running("r", [("n0", (0,))], vc="vision", memory_mib_per_replica=512 * GB)
        .pending("j", 1, replicas=2, vc="vision", memory_mib_per_replica=300 * GB),
        QUOTA,
        "user alice holds 512 GB of 1024 GB of memory allowed per user in VC vision; job needs 600 GB",
        id="per-user-memory-cap",
    ),
    pytest.param(
        capped(memory=3000)
        .running("r", [("n0", (0,))], vc="vision", memory_mib_per_replica=2000)
        .pending("j", 1, vc="vision", memory_mib_per_replica=1500),
        QUOTA,
        "user alice holds 2000 MiB of 3000 MiB of memory allowed per user in VC vision; job needs 1500 MiB",
        id="per-user-memory-cap-not-in-whole-gb",
    ),
    pytest.param(
        capped(cpu=64_000, memory=GB)
        .running("r", [("n0", (0,))], vc="vision", cpu_milli_per_replica=64_000)
        .pending("j", 1, vc="vision", cpu_milli_per_replica=1_000, memory_mib_per_replica=2 * GB),
        QUOTA,
        "user alice holds 64 of 64 CPUs allowed per user in VC vision; job needs 1",
        id="per-user-cpu-cap-named-before-memory",
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


PRIORITY = profile(queue_sort=["priority", "fifo"], admission=["vc_quota"], preemption=["priority"])
KEPT = (
    "VC borrower would borrow {b} A100: {free} free, {kept} of them kept free by VCs that do not "
    "lend them; job needs {n}"
)


def keeper_lends(lend: int | None, keeper_model: str = "*") -> Snap:
    """32 A100: VC keeper is guaranteed 16 and lends `lend` of them; VC borrower has no guarantee."""
    return four_nodes().vc("keeper", 16, model=keeper_model, lend=lend).vc("borrower", 0, borrow=32)


LENDING_CASES = [
    pytest.param(
        keeper_lends(None).pending("j", 8, replicas=3, vc="borrower"), None, id="lends-all-by-default"
    ),
    pytest.param(
        keeper_lends(0).pending("j", 8, replicas=2, vc="borrower"), None, id="borrows-what-is-not-kept"
    ),
    pytest.param(
        keeper_lends(0).pending("j", 8, replicas=3, vc="borrower"),
        KEPT.format(b=24, free=32, kept=16, n=24),
        id="lends-none",
    ),
    pytest.param(
        keeper_lends(8).pending("j", 8, replicas=3, vc="borrower"), None, id="lends-part-of-its-guarantee"
    ),
    pytest.param(
        keeper_lends(4).pending("j", 8, replicas=3, vc="borrower"),
        KEPT.format(b=24, free=32, kept=12, n=24),
        id="keeps-the-rest",
    ),
    pytest.param(
        # The keeper uses 10 of its 16: it keeps the other 6 free, and 22 are free.
        keeper_lends(0)
        .running("k", [("n0", tuple(range(8))), ("n1", (0, 1))], vc="keeper")
        .pending("j", 8, replicas=2, vc="borrower"),
        None,
        id="kept-shrinks-as-the-keeper-uses-it",
    ),
    pytest.param(
        keeper_lends(0)
        .running("k", [("n0", tuple(range(8))), ("n1", (0, 1))], vc="keeper")
        .pending("j", 6, replicas=3, vc="borrower"),
        KEPT.format(b=18, free=22, kept=6, n=18),
        id="kept-counts-what-the-keeper-uses",
    ),
    pytest.param(
        # Within its own guarantee a VC is not borrowing: what others keep does not bind it.
        four_nodes().vc("keeper", 16, lend=0).vc("owner", 24).pending("j", 8, replicas=3, vc="owner"),
        None,
        id="a-guarantee-is-not-borrowed",
    ),
    pytest.param(
        keeper_lends(0, keeper_model="V100").pending("j", 8, replicas=4, vc="borrower"),
        None,
        id="kept-gpus-of-another-model",
    ),
    pytest.param(
        # What a VC keeps, it keeps from others: it may borrow on top of it.
        four_nodes().vc("keeper", 16, borrow=16, lend=0).pending("j", 8, replicas=3, vc="keeper"),
        None,
        id="the-keeper-itself-may-borrow",
    ),
]


@pytest.mark.parametrize(("snap", "message"), LENDING_CASES)
def test_lending_limit(snap: Snap, message: str | None) -> None:
    plan = decide(snap.build(), QUOTA, now=10.0)
    if message is None:
        assert [s.job_id for s in plan.starts] == ["j"]
    else:
        assert not plan.starts
        (status,) = plan.pending
        assert (status.reason, status.message) == (ReasonCode.NOT_LENT, message)


def keepers_of_two_models(a100: int, v100: int, keep_v100: bool = True) -> Snap:
    """A node of `a100` A100 and one of `v100` V100; VC keepall keeps 4 GPUs of any model, VC
    keepv (if `keep_v100`) 4 V100, neither lends any; VC borrower has no guarantee."""
    snap = Snap().node("a0", a100, "A100").node("v0", v100, "V100").vc("keepall", 4, lend=0)
    if keep_v100:
        snap.vc("keepv", 4, model="V100", lend=0)
    return snap.vc("borrower", 0, borrow=16)


KEPT_OF = (
    "VC borrower would borrow {n} {model}: {free} free, {kept} of them kept free by VCs that do "
    "not lend them; job needs {n}"
)

TWO_MODEL_LENDING_CASES = [
    pytest.param(
        # keepv's 4 V100 are the only V100, so keepall's 4 of any model must be the A100.
        keepers_of_two_models(4, 4).pending("j", 4, vc="borrower", gpu_model="A100"),
        KEPT_OF.format(n=4, model="A100", free=4, kept=4),
        id="a-single-model-row-leaves-the-all-models-row-no-other-gpus",
    ),
    pytest.param(
        keepers_of_two_models(4, 4).pending("j", 4, vc="borrower"),
        "",
        id="any-model-job-finds-every-gpu-kept",
    ),
    pytest.param(
        keepers_of_two_models(4, 8).pending("j", 6, vc="borrower", gpu_model="V100"),
        KEPT_OF.format(n=6, model="V100", free=8, kept=4),
        id="the-all-models-row-is-kept-on-the-other-model",
    ),
    pytest.param(
        keepers_of_two_models(4, 8).pending("j", 4, vc="borrower", gpu_model="A100"),
        None,
        id="spare-v100-cover-both-rows",
    ),
    pytest.param(
        keepers_of_two_models(4, 8).pending("j", 4, vc="borrower", gpu_model="V100"),
        None,
        id="borrows-the-v100-no-row-keeps",
    ),
    pytest.param(
        keepers_of_two_models(4, 4, keep_v100=False).pending("j", 4, vc="borrower", gpu_model="A100"),
        None,
        id="the-all-models-row-kept-on-v100",
    ),
]


@pytest.mark.parametrize(("snap", "message"), TWO_MODEL_LENDING_CASES)
def test_lending_limit_over_two_models(snap: Snap, message: str | None) -> None:
    """A row of one model keeps GPUs of that model only, a row of all models GPUs of any: a
    borrower may take GPUs only if, after it, the free GPUs of each model cover that model's
    rows and what is left over covers the all-model rows."""
    plan = decide(snap.build(), QUOTA, now=10.0)
    if message is None:
        assert [s.job_id for s in plan.starts] == ["j"]
    else:
        assert not plan.starts
        (status,) = plan.pending
        assert status.reason is ReasonCode.NOT_LENT
        assert not message or status.message == message


def test_a_borrower_is_estimated_by_what_is_kept_of_every_model() -> None:
    """8 A100 (4 held by another borrower until 3600) and 8 idle V100; a VC keeps 4 GPUs of any
    model, which the V100 cover: an 8-A100 borrower waits for GPUs only, and starts at 3600."""
    snap = (
        keepers_of_two_models(8, 8, keep_v100=False)
        .vc("other", 0, borrow=16)
        .running("r", [("a0", (0, 1, 2, 3))], vc="other", time_limit_s=3600.0)
        .pending("j", 8, vc="borrower", gpu_model="A100")
    )
    plan = decide(snap.build(), QUOTA, now=600.0)
    (status,) = plan.pending
    assert status.reason is ReasonCode.INSUFFICIENT_GPUS
    assert status.estimated_start == 3600.0


def test_a_borrower_blocked_by_kept_gpus_preempts_a_lower_priority_borrower() -> None:
    """The GPUs another borrower holds are not kept by anyone: a job of higher priority may
    take them, while the keeper's idle guarantee stays free."""
    snap = (
        keeper_lends(0)
        .vc("other", 0, borrow=32)
        .running("low", [("n2", tuple(range(8)))], vc="other", priority=0, preemptible=True)
        .pending("j", 8, replicas=2, vc="borrower", priority=100)
    )
    plan = decide(snap.build(), PRIORITY, now=10_000.0)
    assert [p.job_id for p in plan.preemptions] == ["low"]
    (status,) = plan.pending
    assert status.reason is ReasonCode.WAITING_FOR_PREEMPTION


def test_a_keeper_does_not_lend_to_reclaim_priority_either() -> None:
    """Preempting the keeper's own work frees GPUs it then keeps: no such victim is chosen."""
    snap = (
        keeper_lends(0)
        .running("mine", [("n0", tuple(range(8)))], vc="keeper", priority=0, preemptible=True)
        .pending("j", 8, replicas=3, vc="borrower", priority=100)
    )
    plan = decide(snap.build(), PRIORITY, now=10_000.0)
    assert not plan.preemptions and not plan.starts
    (status,) = plan.pending
    assert status.reason is ReasonCode.NOT_LENT


def test_a_borrower_blocked_by_kept_gpus_is_estimated_to_start_when_enough_is_free() -> None:
    """24 of 32 free and 16 of them kept: a 16-GPU borrower starts once the other borrower's
    8 GPUs come back at its time limit, not now."""
    snap = (
        keeper_lends(0)
        .vc("other", 0, borrow=32)
        .running("b", [("n2", tuple(range(8)))], vc="other", time_limit_s=3600.0)
        .pending("j", 8, replicas=2, vc="borrower")
    )
    plan = decide(snap.build(), QUOTA, now=600.0)
    (status,) = plan.pending
    assert status.reason is ReasonCode.NOT_LENT
    assert status.estimated_start == 3600.0
    # Kept for good (the keeper lends none and is idle): no start while quotas stay so.
    plan = decide(keeper_lends(0).pending("j", 8, replicas=3, vc="borrower").build(), QUOTA, now=600.0)
    assert plan.pending[0].estimated_start is None


def two_models_in_vision(rows: tuple[Quota, ...]) -> Snapshot:
    """Two 8-A100 nodes held by alice's jobs until 300 and 600 s, two 8-V100 nodes with bob's
    2-V100 job until 72 h, all in VC vision with the quota rows given; alice waits with a gang of
    two 8-A100 replicas."""
    snap = (
        Snap()
        .node("a0", 8, "A100")
        .node("a1", 8, "A100")
        .node("v0", 8, "V100")
        .node("v1", 8, "V100")
        .running("alice-1", [("a0", tuple(range(8)))], vc="vision", gpu_model="A100", time_limit_s=300.0)
        .running("alice-2", [("a1", tuple(range(8)))], vc="vision", gpu_model="A100", time_limit_s=600.0)
        .running(
            "bob-v100", [("v0", (0, 1))], vc="vision", user="bob", gpu_model="V100", time_limit_s=72 * 3600.0
        )
        .pending("gang", 8, replicas=2, vc="vision", gpu_model="A100", time_limit_s=3600.0)
        .build()
    )
    vision = VirtualCluster(VcName("vision"), rows, tenant="vision")
    speech = VirtualCluster(VcName("speech"), (Quota("A100", 8, 8), Quota("V100", 8, 4)), tenant="speech")
    return replace(snap, vcs=(vision, speech))


def test_a_quota_row_of_one_model_is_estimated_by_that_model_alone() -> None:
    """Admission counts an A100 row against the VC's A100 only; so does the estimate. It waited
    for the VC's V100 job too, 72 hours away, though the A100 come free at 600 s."""
    plan = decide(two_models_in_vision((Quota("A100", 8, 8), Quota("V100", 8, 4))), QUOTA, now=0.0)
    (status,) = plan.pending
    assert status.reason is ReasonCode.VC_QUOTA
    assert status.estimated_start == 600.0


def test_a_quota_row_of_all_models_waits_for_every_model() -> None:
    """A row for all models counts the VC's V100 as well: 16 A100 more fit only once bob's
    V100 job has gone too."""
    plan = decide(two_models_in_vision((Quota(ALL_MODELS, 8, 8),)), QUOTA, now=0.0)
    (status,) = plan.pending
    assert status.reason is ReasonCode.VC_QUOTA
    assert status.estimated_start == 72 * 3600.0

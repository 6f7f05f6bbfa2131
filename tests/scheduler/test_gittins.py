"""Table tests for the Gittins-index queue order (`gittins`): its index table, its queue
order and its preemptions, against plain LAS on the same snapshots."""

from __future__ import annotations

import pytest
from sched_builders import Snap, profile
from test_queue_sort_plugins import queue_ids

from scheduler.core import FinishedService, decide
from scheduler.core.service_history import FinishedHistory, gittins_table, remaining_gpu_s


def test_index_table_by_hand() -> None:
    # Half the jobs need 100 GPU-s, half 10,000. A fresh job: serving it to 1,000 finishes
    # half of them at an expected cost of 0.5 x 100 + 0.5 x 1,000 = 550 GPU-s; beyond 1,000
    # only the long ones remain, 9,000 GPU-s to go each.
    finished = FinishedService(((1, 100.0),) * 10 + ((1, 10_000.0),) * 10)
    tables, pooled = gittins_table(finished, (1000.0,), by_width=True, min_samples=5)
    assert pooled == pytest.approx((0.5 / 550, 1 / 9000))
    assert tables[1] == pooled


def test_a_queue_past_every_finished_job_is_expected_to_run_as_long_again() -> None:
    # No finished job ran past 10,000 GPU-s, so queues from 20,000 on have no sample. They
    # take the index of the last queue with samples (1,000: 1 / 9,000) scaled by 1,000 / t,
    # as if a job that attained t had as much to go: positive, and falling queue by queue.
    finished = FinishedService(((1, 100.0),) * 10 + ((1, 10_000.0),) * 10)
    _, pooled = gittins_table(finished, (1000.0, 20_000.0, 40_000.0), by_width=True, min_samples=5)
    assert pooled == pytest.approx((0.5 / 550, 1 / 9000, 1 / 180_000, 1 / 360_000))
    # Where only queue 0 has samples there is no attained service to scale from: 0.
    _, short = gittins_table(FinishedService(((1, 100.0),) * 10), (1000.0, 2000.0), True, 5)
    assert short == pytest.approx((1 / 100, 0.0, 0.0))


def test_widths_with_few_samples_use_the_pooled_table_and_no_history_means_none() -> None:
    finished = FinishedService(((1, 100.0),) * 10 + ((8, 800.0),) * 2)
    tables, pooled = gittins_table(finished, (1000.0,), by_width=True, min_samples=5)
    assert set(tables) == {1}
    assert pooled is not None
    assert gittins_table(FinishedService(((1, 100.0),) * 4), (1000.0,), True, 5) == ({}, None)


def _near_its_end(history: int = 60) -> Snap:
    # Every job of this kind needs 2,000 GPU-s, so one that has run 1,500 is the best use of
    # the GPU: LAS takes it off for the fresh job, the Gittins index keeps it running.
    return (
        Snap()
        .node("n0", 1)
        .running("r", [("n0", (0,))], attained_gpu_s=1500)
        .pending("fresh", gpus_=1, submitted_at=0)
        .finished(1, 2000.0, count=history)
    )


@pytest.mark.parametrize(
    ("policy", "preempted"),
    [pytest.param("las", ["r"], id="las-preempts"), pytest.param("gittins", [], id="gittins-keeps-it")],
)
def test_a_job_near_its_usual_end_keeps_its_gpu(policy: str, preempted: list[str]) -> None:
    p = profile(
        queue_sort=[policy],
        preemption=[policy],
        post_cycle=[policy],
        plugin_args={policy: {"thresholds": [1000]}},
    )
    plan = decide(_near_its_end().build(), p, now=100.0)
    assert [pr.job_id for pr in plan.preemptions] == preempted
    if not preempted:
        # It never falls behind a fresh job, so no cycle is asked for; the estimate is its end.
        assert plan.wake_at is None
        (status,) = plan.pending
        assert status.estimated_start is not None and status.estimated_start > 100.0


def test_without_history_it_is_las() -> None:
    snap = _near_its_end(history=0)
    args = {"thresholds": [1000]}
    p = profile(queue_sort=["gittins"], preemption=["gittins"], plugin_args={"gittins": args})
    plan = decide(snap.build(), p, now=100.0)
    assert [pr.job_id for pr in plan.preemptions] == ["r"]


def test_a_short_kind_goes_before_an_older_fresh_gang() -> None:
    snap = (
        Snap()
        .node("n0")
        .pending("wide-fresh", gpus_=8, submitted_at=1)
        .pending("narrow-served", gpus_=1, submitted_at=2, attained_gpu_s=50)
        .finished(1, 100.0, count=60)
        .finished(8, 80_000.0, count=60)
    )
    args = {"thresholds": [1000]}
    assert queue_ids(snap, queue_sort=["las", "fifo"], plugin_args={"las": args}) == [
        "wide-fresh",
        "narrow-served",
    ]
    assert queue_ids(snap, queue_sort=["gittins", "fifo"], plugin_args={"gittins": args}) == [
        "narrow-served",
        "wide-fresh",
    ]


def test_wakes_when_a_running_job_falls_behind() -> None:
    # 1-GPU jobs end at 2,000 or at 20,000 GPU-s. A running one past 2,000 (queue 1 of
    # thresholds 1,000 and 4,000) is likely a long one, but the fresh job has a better index
    # only from queue 2 on: the cycle asks to be woken when r crosses 4,000.
    snap = (
        Snap()
        .node("n0", 1)
        .running("r", [("n0", (0,))], attained_gpu_s=1500)
        .pending("fresh", gpus_=1, submitted_at=0)
        .finished(1, 2000.0, count=30)
        .finished(1, 20_000.0, count=30)
    )
    args = {"thresholds": [1000, 4000]}
    tables, _ = gittins_table(snap.build().finished, (1000.0, 4000.0), True, 50)
    index = tables[1]
    assert index[1] > index[0] > index[2]
    p = profile(
        queue_sort=["gittins"], preemption=["gittins"], post_cycle=["gittins"], plugin_args={"gittins": args}
    )
    plan = decide(snap.build(), p, now=100.0)
    assert plan.preemptions == ()
    assert plan.wake_at == pytest.approx(100.0 + 2500.0)


def test_preempt_ratio_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="preempt_ratio"):
        profile(queue_sort=["gittins"], plugin_args={"gittins": {"thresholds": [1000], "preempt_ratio": 0.5}})


@pytest.mark.parametrize(
    ("history", "expected_start"),
    [
        # Jobs of its width that ran past 1,000 GPU-s went on to 5,000: 4,000 s to go.
        pytest.param(60, 100.0 + 4000.0, id="median-of-what-finished-jobs-still-ran"),
        # Without history: about as long again as it has run (1,000 s).
        pytest.param(0, 100.0 + 1000.0, id="as-long-again-without-history"),
    ],
)
def test_a_running_job_is_expected_to_end_as_finished_jobs_of_its_width_did(
    history: int, expected_start: float
) -> None:
    snap = (
        Snap()
        .node("n0", 1)
        .running("r", [("n0", (0,))], attained_gpu_s=1000)
        .pending("p", gpus_=1, submitted_at=0)
        .finished(1, 5000.0, count=history)
        .finished(1, 500.0, count=history)  # ended before 1,000: says nothing about r
    )
    plan = decide(snap.build(), profile(queue_sort=["fifo"]), now=100.0)
    (status,) = plan.pending
    assert status.estimated_start == pytest.approx(expected_start)


def test_running_jobs_alike_release_one_after_another_not_all_at_their_median() -> None:
    # Ten 1-GPU jobs that have just started, and history where 1-GPU jobs ran 100 to 10,000
    # GPU-s (median 5,100). Each at its median would free all ten GPUs at 5,100; spread over
    # the middle half of the distribution, the first GPU comes free at its 27.5 % point
    # (2,800) and the next at its 32.5 % point (3,300).
    snap = Snap().node("n0", 10)
    for i in range(10):
        snap.running(f"r{i}", [("n0", (i,))], attained_gpu_s=0)
    snap.pending("p", gpus_=1, submitted_at=0).pending("q", gpus_=1, submitted_at=1)
    for k in range(1, 101):
        snap.finished(1, 100.0 * k)
    plan = decide(snap.build(), profile(queue_sort=["fifo"]), now=0.0)
    starts = {s.job_id: s.estimated_start for s in plan.pending}
    assert starts == {"p": pytest.approx(2800.0), "q": pytest.approx(3300.0)}


def test_estimates_past_the_kinds_limit_count_only_expected_ends() -> None:
    # r (LAS queue 1, time limit far off) yields at once to a (queue 0) and to b (queue 1)
    # only when it crosses into queue 2. With one kind estimated in full, b's estimate counts
    # r's end alone: later, never earlier.
    snap = (
        Snap()
        .node("n0", 1)
        .running("r", [("n0", (0,))], attained_gpu_s=5000, time_limit_s=1_000_000)
        .pending("a", gpus_=1, submitted_at=0, time_limit_s=100)
        .pending("b", gpus_=1, submitted_at=1, attained_gpu_s=2000, time_limit_s=100)
    )
    las = {"thresholds": [1000, 10_000]}

    def estimates(max_kinds: int) -> dict[str, float | None]:
        p = profile(
            queue_sort=["las", "fifo"],
            preemption=["las"],
            plugin_args={"las": las},
            cycle={"max_preemption_attempts": 0, "estimate_max_kinds": max_kinds},
        )
        return {s.job_id: s.estimated_start for s in decide(snap.build(), p, now=0.0).pending}

    full, capped = estimates(32), estimates(1)
    assert full["a"] == capped["a"] == pytest.approx(0.0)
    assert full["b"] == pytest.approx(5000.0)  # r crosses 10,000 GPU-s
    assert capped["b"] == pytest.approx(1_000_000.0)  # r's end


def test_the_jobs_own_vc_and_user_come_first_when_there_are_enough() -> None:
    # bob's 1-GPU jobs in VC a ran 5,000 GPU-s, VC a's others 3,000, everyone else's 2,000.
    def rest(bobs: int, others_in_a: int) -> float | None:
        jobs = ((1, 5000.0),) * bobs + ((1, 3000.0),) * others_in_a + ((1, 2000.0),) * 100
        owners = (("a", "bob"),) * bobs + (("a", "carol"),) * others_in_a + (("b", "dan"),) * 100
        return remaining_gpu_s(FinishedService(jobs, owners), 1, 1000.0, "a", "bob")

    assert rest(20, 0) == pytest.approx(4000.0)  # his own
    assert rest(19, 30) == pytest.approx(2000.0)  # his VC's: 49 jobs, median 3,000
    assert rest(19, 0) == pytest.approx(1000.0)  # everyone's of his width
    assert remaining_gpu_s(FinishedService(((1, 2000.0),) * 60), 1, 1000.0, "a", "bob") == 1000.0


def test_finished_service_wants_one_owner_per_job_or_none() -> None:
    with pytest.raises(ValueError, match="one owner per job"):
        FinishedService(((1, 10.0), (1, 20.0)), (("a", "bob"),))


def test_history_keeps_the_last_jobs_of_each_width_so_a_rare_width_keeps_its_table() -> None:
    history = FinishedHistory(per_width=3)
    assert history.service == FinishedService()
    history.record(8, 80_000.0, "vision", "ann")
    for k in range(5):
        history.record(1, 100.0 * (k + 1), "nlp", "bob")
    history.record(8, 90_000.0, "vision", "ann")
    service = history.service
    # Oldest first; the three newest 1-GPU jobs, and both 8-GPU jobs though five 1-GPU jobs
    # finished between them (one window of the last three jobs would hold a single 8-GPU job).
    assert service.jobs == ((8, 80_000.0), (1, 300.0), (1, 400.0), (1, 500.0), (8, 90_000.0))
    assert service.owners == (("vision", "ann"),) + (("nlp", "bob"),) * 3 + (("vision", "ann"),)
    assert history.service is service  # the same object until a job finishes: tables are cached on it
    history.record(1, 600.0, "nlp", "bob")
    assert history.service.jobs == ((8, 80_000.0), (1, 400.0), (1, 500.0), (8, 90_000.0), (1, 600.0))
    tables, _ = gittins_table(service, (1000.0,), True, 2)
    assert 8 in tables  # two 8-GPU jobs kept: enough (min_samples 2) for a table of its own


def test_history_looks_back_only_so_far_for_a_rare_width() -> None:
    history = FinishedHistory(per_width=3, lookback=4)
    history.record(8, 80_000.0, "vision", "ann")
    for k in range(3):
        history.record(1, 100.0 * (k + 1), "nlp", "bob")
    assert (8, 80_000.0) in history.service.jobs  # the 4th last job
    history.record(1, 400.0, "nlp", "bob")
    # Now it is the 5th last: out of sight, though its width has no other job.
    assert history.service.jobs == ((1, 200.0), (1, 300.0), (1, 400.0))


def _with_a_long_running_sibling() -> Snap:
    # 1-GPU jobs end at 100 or at 100,000 GPU-s, so a fresh job (queue 0) outranks one that
    # has run past 1,000 GPU-s (queue 1). "sibling" was submitted in the same minute as the
    # running job by the same user; "stranger" by another user, later.
    return (
        Snap()
        .node("n0", 1)
        .running("long", [("n0", (0,))], attained_gpu_s=5_000, submitted_at=100.0)
        .pending("sibling", gpus_=1, submitted_at=110.0)
        .pending("stranger", gpus_=1, user="bob", submitted_at=130.0)
        .finished(1, 100.0, count=30)
        .finished(1, 100_000.0, count=30)
    )


@pytest.mark.parametrize(
    ("window", "order"),
    [
        pytest.param(0, ["sibling", "stranger"], id="no-groups-by-arrival"),
        pytest.param(60, ["stranger", "sibling"], id="sibling-ranked-by-the-long-runner"),
        # Submitted at 110 and 100: different 5-second windows, so not one group.
        pytest.param(5, ["sibling", "stranger"], id="another-window-no-group"),
    ],
)
def test_a_job_is_ranked_by_the_longest_unfinished_job_submitted_with_it(
    window: int, order: list[str]
) -> None:
    args = {"thresholds": [1000], "group_window_s": window}
    assert (
        queue_ids(
            _with_a_long_running_sibling(), queue_sort=["gittins", "fifo"], plugin_args={"gittins": args}
        )
        == order
    )


@pytest.mark.parametrize(
    ("window", "preempted"),
    [
        pytest.param(0, ["long"], id="no-groups-the-fresh-sibling-preempts"),
        pytest.param(60, [], id="siblings-do-not-take-turns"),
    ],
)
def test_siblings_do_not_preempt_each_other(window: int, preempted: list[str]) -> None:
    snap = (
        Snap()
        .node("n0", 1)
        .running("long", [("n0", (0,))], attained_gpu_s=5_000, submitted_at=100.0)
        .pending("sibling", gpus_=1, submitted_at=110.0)
        .finished(1, 100.0, count=30)
        .finished(1, 100_000.0, count=30)
    )
    args = {"thresholds": [1000], "group_window_s": window}
    p = profile(
        queue_sort=["gittins"], preemption=["gittins"], post_cycle=["gittins"], plugin_args={"gittins": args}
    )
    plan = decide(snap.build(), p, now=1000.0)
    assert [pr.job_id for pr in plan.preemptions] == preempted
    (status,) = plan.pending
    assert status.reason is not None


def test_a_stranger_still_preempts_a_group_that_ran_long() -> None:
    snap = (
        Snap()
        .node("n0", 1)
        .running("long", [("n0", (0,))], attained_gpu_s=5_000, submitted_at=100.0)
        .pending("stranger", gpus_=1, user="bob", submitted_at=110.0)
        .finished(1, 100.0, count=30)
        .finished(1, 100_000.0, count=30)
    )
    args = {"thresholds": [1000], "group_window_s": 60}
    p = profile(queue_sort=["gittins"], preemption=["gittins"], plugin_args={"gittins": args})
    plan = decide(snap.build(), p, now=1000.0)
    assert [pr.job_id for pr in plan.preemptions] == ["long"]


def _a_group_running_beside_a_stranger(first_attained: float, bobs_attained: float) -> Snap:
    # alice's "second" was submitted with "first", which runs; bob's job runs on the other
    # GPU. Of the 1-GPU jobs before, 40 needed 1,000 GPU-s, 30 2,000 and 30 ten million: with
    # queues from 900, 1,800 and 3,600 GPU-s the Gittins index of queue 1 (6.9e-4) is above
    # that of queue 2 (5.0e-4), which is above that of queue 0 (3.4e-4).
    return (
        Snap()
        .node("n0", 2)
        .running(
            "first",
            [("n0", (0,))],
            attained_gpu_s=first_attained,
            submitted_at=100.0,
            started_at=1000 - first_attained,
        )
        .running(
            "bobs", [("n0", (1,))], attained_gpu_s=bobs_attained, user="bob", started_at=1000 - bobs_attained
        )
        .pending("second", gpus_=1, submitted_at=110.0)
        .finished(1, 1000.0, count=40)
        .finished(1, 2000.0, count=30)
        .finished(1, 1e7, count=30)
    )


@pytest.mark.parametrize(
    ("policy", "first_attained", "bobs_attained", "window", "expected"),
    [
        # Gittins: "second" is ranked by "first" (500 GPU-s, queue 0) and, fresh, would not
        # preempt bob's job in queue 2 before it reaches queue 3 (at 2,600): "first" ending
        # (at 2,500, by the history) comes sooner. Ranked with its group it reaches queue 1
        # when "first" passes 900 GPU-s, at 1,400, and then outranks bob's job.
        pytest.param("gittins", 500, 2000, 0, 2500.0, id="gittins-alone"),
        pytest.param("gittins", 500, 2000, 60, 1400.0, id="gittins-rises-and-preempts-sooner"),
        # LAS: fresh, it preempts bob's job when that passes 900 GPU-s (at 1,100; "first" is
        # its sibling and never preempted). Ranked with its group it is in queue 1 from
        # 1,050 and rises as fast as bob's job, 50 GPU-s ahead, so it never outranks it and
        # waits for its end (at 1,200, by the history).
        pytest.param("las", 850, 800, 0, 1100.0, id="las-alone"),
        pytest.param("las", 850, 800, 60, 1200.0, id="las-rises-and-waits-for-the-end"),
    ],
)
def test_a_waiting_job_is_estimated_to_rise_with_its_running_group(
    policy: str, first_attained: float, bobs_attained: float, window: int, expected: float
) -> None:
    args = {"thresholds": [900, 1800, 3600], "group_window_s": window, "sibling_window_s": 600}
    p = profile(queue_sort=[policy], preemption=[policy], post_cycle=[policy], plugin_args={policy: args})
    plan = decide(_a_group_running_beside_a_stranger(first_attained, bobs_attained).build(), p, now=1000.0)
    assert plan.preemptions == ()
    (status,) = plan.pending
    assert status.estimated_start == pytest.approx(expected)


def test_a_negative_group_window_is_refused() -> None:
    with pytest.raises(ValueError, match="group_window_s"):
        profile(queue_sort=["gittins"], plugin_args={"gittins": {"thresholds": [1000], "group_window_s": -1}})


def _a_sweep_that_did_not_fit() -> Snap:
    # alice's two runs of one sweep came in 10 s apart; one got the only GPU and has run past
    # the first threshold, so the waiting one, fresh, is in a better queue.
    return (
        Snap()
        .node("n0", 1)
        .running("first", [("n0", (0,))], attained_gpu_s=1_500, submitted_at=100.0, time_limit_s=9_000)
        .pending("second", gpus_=1, submitted_at=110.0)
    )


@pytest.mark.parametrize("policy", ["las", "gittins"])
@pytest.mark.parametrize(
    ("window", "preempted"),
    [
        pytest.param(0, ["first"], id="no-window-the-fresh-sibling-preempts"),
        pytest.param(600, [], id="siblings-wait-for-each-other"),
        # Submitted at 100 and 110: different 5-second windows, so not siblings.
        pytest.param(5, ["first"], id="another-window-not-siblings"),
    ],
)
def test_a_waiting_sibling_never_preempts_a_running_one(
    policy: str, window: int, preempted: list[str]
) -> None:
    args = {"thresholds": [1000], "sibling_window_s": window}
    p = profile(queue_sort=[policy], preemption=[policy], post_cycle=[policy], plugin_args={policy: args})
    plan = decide(_a_sweep_that_did_not_fit().build(), p, now=1000.0)
    assert [pr.job_id for pr in plan.preemptions] == preempted
    if not preempted:
        # It waits for its sibling's end (its time limit), not for a threshold crossing.
        (status,) = plan.pending
        assert status.estimated_start == pytest.approx(9_000.0)


@pytest.mark.parametrize("policy", ["las", "gittins"])
def test_siblings_spare_each_other_but_not_a_strangers_job(policy: str) -> None:
    # The sibling is looked at first and may not preempt; bob's job of the same kind (same
    # width, queue and priority) still may, in the same cycle, and its estimate is now.
    snap = _a_sweep_that_did_not_fit().pending("bobs", gpus_=1, user="bob", submitted_at=120.0)
    args = {"thresholds": [1000], "sibling_window_s": 600}
    p = profile(queue_sort=[policy, "fifo"], preemption=[policy], plugin_args={policy: args})
    plan = decide(snap.build(), p, now=1000.0)
    assert [pr.job_id for pr in plan.preemptions] == ["first"]
    starts = {s.job_id: s.estimated_start for s in plan.pending}
    assert starts["bobs"] == pytest.approx(1000.0 + 30.0)  # after the victim's grace period
    assert starts["second"] is not None and starts["second"] > starts["bobs"]


def test_a_negative_sibling_window_is_refused() -> None:
    with pytest.raises(ValueError, match="sibling_window_s"):
        profile(queue_sort=["las"], plugin_args={"las": {"thresholds": [1000], "sibling_window_s": -1}})

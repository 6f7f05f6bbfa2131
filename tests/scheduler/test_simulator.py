"""Simulator: trace parsers, gang shapes, and golden figures on a tiny trace.

The golden numbers are derived by hand in the comments (one node of 4 GPUs):
  j1 (3 GPUs, 100 s) at t=0, j2 (2 GPUs, 50 s) at t=10, j3 (1 GPU, 30 s) at t=20,
  j4 (8 GPUs) is wider than the cluster and dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.core import Profile, load_profile
from scheduler.sim import RuntimeHistory, Simulator, gang_shape, load_trace, summarize
from scheduler.sim.__main__ import load_vc_quotas, main
from scheduler.sim.cluster import load_topology, parse_cluster_spec, uniform_cluster

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny_itp.csv"


def run(profile: Profile, overhead: float = 0.0) -> dict[str, object]:
    trace = load_trace(TINY, "itp")
    return summarize(Simulator(uniform_cluster(1, 4), profile, trace.jobs, preempt_overhead_s=overhead).run())


def test_golden_fifo_with_backfill() -> None:
    # t=10: j2 needs 2, 1 free: blocked, reserved for t=100 when 4 are free (2 spare).
    # t=20: j3 (1 GPU, no estimate: 3600 s assumed) cannot finish before t=100 but fits in the
    #       spare GPUs: backfilled, runs 20..50. t=100: j1 ends, j2 runs 100..150.
    # JCT: j1 100, j2 140, j3 30. Busy GPU-time while a job waited (t=10..100):
    # 3*10 + 4*30 + 3*50 = 300 of 4*90 = 360.
    s = run(load_profile("fifo"))
    assert s["jobs"] == 4 and s["jobs_completed"] == 3 and s["jobs_dropped"] == 1
    assert s["avg_jct_s"] == pytest.approx(90.0)
    assert (s["p50_jct_s"], s["p95_jct_s"], s["p99_jct_s"]) == (100.0, 140.0, 140.0)
    assert s["avg_queue_s"] == pytest.approx(30.0)
    assert s["makespan_s"] == 150.0
    assert s["gpu_allocation"] == pytest.approx(300 / 360, abs=1e-4)
    assert s["zero_wait_bound_s"] == pytest.approx(60.0)
    assert s["preemptions"] == 0
    assert s["jobs_waited"] == 1


def test_golden_las_preempts_at_the_threshold() -> None:
    # LAS with one threshold at 60 GPU-seconds, free preemption.
    # t=10: j2 waits (j1 has 30 GPU-s, same queue); LAS asks for a cycle at t=20, when j1
    #       reaches 60 GPU-s (3 GPUs). t=20: j1 is demoted and preempted; j2 (2 GPUs, 20..70)
    #       and j3 (1 GPU, 20..50) start. j2 reaches 60 GPU-s at t=50: same queue as j1, no
    #       preemption. t=70: j2 ends; j1 resumes with 80 s left and ends at t=150.
    # JCT: j1 150, j2 60, j3 30.
    profile = Profile.from_dict(
        {
            "name": "las-test",
            "plugins": {"queue_sort": ["las", "fifo"], "preemption": ["las"], "post_cycle": ["las"]},
            "plugin_args": {"las": {"thresholds": [60]}},
        }
    )
    s = run(profile)
    assert s["preemptions"] == 1
    assert s["avg_jct_s"] == pytest.approx(80.0)
    assert s["p50_jct_s"] == 60.0
    assert s["makespan_s"] == 150.0


def test_preemption_overhead_delays_the_release() -> None:
    # With 30 s of checkpointing, j1's GPUs come free at t=50 instead of t=20: j2 runs 50..100,
    # j3 still gets the idle GPU at t=20.
    profile = Profile.from_dict(
        {
            "name": "las-test",
            "plugins": {"queue_sort": ["las", "fifo"], "preemption": ["las"], "post_cycle": ["las"]},
            "plugin_args": {"las": {"thresholds": [60]}},
        }
    )
    free = run(profile, overhead=0.0)
    costly = run(profile, overhead=30.0)
    assert costly["avg_jct_s"] > free["avg_jct_s"]
    # The cost is counted: j1 (3 GPUs) checkpointed for 30 s, by the LAS rule; nothing for free.
    assert costly["preemptions_by_reason"] == {"las": 1}
    assert costly["preemption_lost_gpu_s"] == pytest.approx(90.0)
    work = 3 * 100 + 2 * 50 + 1 * 30  # GPU-seconds the three jobs need
    assert costly["preemption_lost_share"] == pytest.approx(90.0 / work, abs=1e-5)
    assert free["preemption_lost_gpu_s"] == 0.0
    # The node has 4 GPUs and no job is that wide: no gangs.
    assert costly["gang_jobs"] == 0


def test_cli_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--trace", str(TINY), "--format", "itp", "--cluster", "1x4", "--profile", "fifo", "--json"])
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    for key in (
        "jobs",
        "jobs_completed",
        "jobs_dropped",
        "avg_jct_s",
        "p50_jct_s",
        "p95_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "makespan_s",
        "gpu_allocation",
        "preemptions",
        "per_vc",
        "estimate_within_2x",
        "zero_wait_bound_s",
        "wall_s",
    ):
        assert key in summary
    assert summary["avg_jct_s"] == pytest.approx(90.0)


def test_parsers_read_the_published_layouts(tmp_path: Path) -> None:
    philly = tmp_path / "philly.csv"
    philly.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-09-04 10:30:41,100.0,8,800.0,7f04ca\n"
        "2017-09-04 10:31:41,50.0,1,50.0,6214e9\n"
    )
    jobs = load_trace(philly, "philly").jobs
    assert [(j.submit, j.duration, j.gpus, j.vc) for j in jobs] == [
        (0.0, 100.0, 8, "7f04ca"),
        (60.0, 50.0, 1, "6214e9"),
    ]

    openb = tmp_path / "openb.csv"
    openb.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,12000,16384,1,460,,LS,Running,5,105,10\n"
        "p1,6000,12288,0,0,,BE,Running,1,50,1\n"
        "p2,6000,12288,2,1000,,BE,Pending,3,,\n"
    )
    trace = load_trace(openb, "openb")
    assert [(j.id, j.submit, j.duration, j.gpus, j.cpu_milli) for j in trace.jobs] == [
        ("p0", 5.0, 95.0, 1, 12000)
    ]
    assert trace.skipped == 2

    itp = load_trace(TINY, "itp")
    assert [j.gpus for j in itp.jobs] == [3, 2, 1, 8]


@pytest.mark.parametrize(
    ("gpus", "node", "shape"),
    [(4, 8, (1, 4)), (16, 8, (2, 8)), (16, 4, (4, 4)), (12, 8, (2, 6)), (64, 4, (16, 4))],
    ids=["fits-a-node", "two-full-nodes", "four-small-nodes", "uneven-splits-evenly", "wide-gang"],
)
def test_gang_shape(gpus: int, node: int, shape: tuple[int, int]) -> None:
    assert gang_shape(gpus, node) == shape


@pytest.mark.parametrize("spec", ["32", "0x4", "4x", "axb"])
def test_bad_cluster_spec(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_cluster_spec(spec)


def test_topology_file(tmp_path: Path) -> None:
    spec = tmp_path / "topology.json"
    spec.write_text(
        json.dumps(
            {
                "nodes": [
                    {
                        "name": "dgx",
                        "rack": "r0",
                        "gpus": 8,
                        "model": "A100",
                        "nvlink_group_size": 8,
                        "count": 2,
                    },
                    {"name": "t4box", "rack": "r1", "gpus": 2, "model": "T4"},
                ]
            }
        )
    )
    nodes = load_topology(spec)
    assert [n.name for n in nodes] == ["dgx0", "dgx1", "t4box"]
    assert {g.nvlink_group for g in nodes[0].gpus} == {0}
    assert [g.pcie_switch for g in nodes[0].gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert nodes[2].gpus[0].model == "T4" and nodes[2].rack == "r1"


def test_runtime_history_falls_back_from_user_to_all_jobs() -> None:
    history = RuntimeHistory(window=10, min_samples=2)
    assert history.estimate("vc", "alice", 1) is None
    history.record("vc", "alice", 1, 100.0)
    history.record("vc", "bob", 1, 300.0)
    assert history.estimate("vc", "alice", 1) == 200.0  # (vc, gpus): median of 100 and 300
    history.record("vc", "alice", 1, 120.0)
    assert history.estimate("vc", "alice", 1) == 110.0  # alice's own history now suffices
    assert history.estimate("other", "carol", 8) == 120.0  # nothing closer: all jobs


def test_cli_time_window_is_taken_before_the_vc_filter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-09-04 00:00:00,10.0,1,10.0,a\n"
        "2017-09-04 00:01:00,10.0,1,10.0,b\n"
        "2017-09-04 00:02:00,10.0,1,10.0,a\n"
    )
    base = ["--trace", str(trace), "--format", "philly", "--cluster", "1x1", "--profile", "fifo", "--json"]
    main([*base, "--until", "150", "--vc", "a"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["jobs"] == 2
    main([*base, "--until", "100", "--vc", "a"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["jobs"] == 1


def test_time_slicing_lets_a_short_job_through_a_long_one(tmp_path: Path) -> None:
    # One node of 4 GPUs; a (5,000 s) at t=0, b (50 s) at t=10, both 4 GPUs wide. Without
    # slicing b waits for a: JCT 5,040. With 100 s quanta and 5 s to save and restore a job:
    # at t=100 a is suspended and b runs 100..150 (JCT 140); a resumes at 150 with 4,900 s +
    # 5 s left and ends at 5,055. Only b is short (under an hour).
    trace = tmp_path / "two.csv"
    trace.write_text("job_id,submission_time,duration,num_gpu\na,0,5000,4\nb,10,50,4\n")
    jobs = load_trace(trace, "itp").jobs
    plain = Profile.from_dict({"name": "fifo", "plugins": {"queue_sort": ["fifo"]}})
    sliced = Profile.from_dict(
        {
            "name": "sliced",
            "plugins": {"queue_sort": ["fifo"], "post_cycle": ["timeslice"]},
            "plugin_args": {"timeslice": {"quantum_s": 100, "suspend_cost_s": 5}},
        }
    )
    before = summarize(Simulator(uniform_cluster(1, 4), plain, jobs).run())
    after = summarize(Simulator(uniform_cluster(1, 4), sliced, jobs).run())
    assert before["short_avg_jct_s"] == 5040.0
    assert after["short_avg_jct_s"] == 140.0
    assert after["avg_jct_s"] == pytest.approx((5055.0 + 140.0) / 2)
    assert after["preemptions_by_reason"] == {"timeslice": 1}
    assert after["preemption_lost_gpu_s"] == pytest.approx(5.0 * 4)


def test_without_quotas_the_vcs_share_one_pool_and_las_preempts_across_them(tmp_path: Path) -> None:
    # One node of 4 GPUs, the default profile (first threshold 900 GPU-s; with no job finished
    # yet, its Gittins order is LAS's), free preemption.
    # VC a: 4 GPUs for 1,000 s at t=0; VC b: 1 GPU for 50 s at t=300, when a has 1,200 GPU-s
    # (second queue). Pooled, b preempts a and runs 300..350 (JCT 50); a resumes with 700 s
    # left and ends at 1,050. Had each VC the whole cluster as its guarantee, b could not take
    # a's GPUs and would wait until 1,000 (JCT 750).
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-09-04 00:00:00,1000.0,4,4000.0,a\n"
        "2017-09-04 00:05:00,50.0,1,50.0,b\n"
    )
    jobs = load_trace(trace, "philly").jobs
    s = summarize(Simulator(uniform_cluster(1, 4), load_profile("default"), jobs).run())
    assert s["preemptions_by_reason"] == {"gittins": 1}
    assert s["per_vc"]["b"]["avg_jct_s"] == 50.0
    assert s["per_vc"]["a"]["avg_jct_s"] == 1050.0
    # With a quota file the guarantees hold: a owns the node, b may only borrow, so b waits.
    quotas = {"a": (4, 0), "b": (0, 4)}
    guarded = summarize(
        Simulator(uniform_cluster(1, 4), load_profile("default"), jobs, vc_quotas=quotas).run()
    )
    assert guarded["preemptions"] == 0
    assert guarded["per_vc"]["b"]["avg_jct_s"] == 750.0


def test_spread_after_waiting_relaxes_locality(tmp_path: Path) -> None:
    # Two nodes of 4 GPUs. a and b (3 GPUs, 1,000 s) at t=0 take 3 GPUs of each node; c (2
    # GPUs, 100 s) at t=10 finds one free GPU per node (fragmentation). d (1 GPU, 10 s) at
    # t=200. Topology required: d takes a free GPU at once (JCT 10), c waits for a and b and
    # runs 1,000..1,100 (JCT 1,090). With --spread-after 100: at t=200 c has waited 190 s, is
    # placed as 2x1 across the two nodes and runs 200..300 (JCT 290); d waits for it (JCT 110).
    trace = tmp_path / "frag.csv"
    trace.write_text(
        "job_id,submission_time,duration,num_gpu\na,0,1000,3\nb,0,1000,3\nc,10,100,2\nd,200,10,1\n"
    )
    jobs = load_trace(trace, "itp").jobs
    fifo = Profile.from_dict({"name": "fifo", "plugins": {"queue_sort": ["fifo"]}})
    required = summarize(Simulator(uniform_cluster(2, 4), fifo, jobs).run())
    spread = summarize(Simulator(uniform_cluster(2, 4), fifo, jobs, spread_after_s=100).run())
    assert required["avg_jct_s"] == pytest.approx((1000 + 1000 + 1090 + 10) / 4)
    assert spread["avg_jct_s"] == pytest.approx((1000 + 1000 + 290 + 110) / 4)
    # Not yet waited long enough at t=200: nothing changes.
    late = summarize(Simulator(uniform_cluster(2, 4), fifo, jobs, spread_after_s=500).run())
    assert late["avg_jct_s"] == required["avg_jct_s"]


@pytest.mark.parametrize("overhead", [0.0, 30.0])
def test_gpus_reclaimed_for_a_job_go_to_that_job(overhead: float) -> None:
    """One node of 2 GPUs, both borrowed by VC other (b1, b2). q (other, borrowing) waits from
    t=5; p (own, inside its guarantee of 2) comes at t=10 and reclaims one GPU. When it is
    free, q is ahead of p in FIFO order and would borrow it again, so p would have to reclaim
    once more: p goes first in line instead, and there is one preemption, not two."""
    from scheduler.sim.trace import TraceJob

    jobs = [
        TraceJob("b1", 0.0, 1000.0, 1, vc="other"),
        TraceJob("b2", 1.0, 1000.0, 1, vc="other"),
        TraceJob("q", 5.0, 1000.0, 1, vc="other"),
        TraceJob("p", 10.0, 100.0, 1, vc="own"),
    ]
    profile = Profile.from_dict(
        {
            "name": "fifo-reclaim",
            "plugins": {"queue_sort": ["fifo"], "admission": ["vc_quota"], "preemption": ["reclaim"]},
        }
    )
    result = Simulator(
        uniform_cluster(1, 2), profile, jobs, vc_quotas={"own": (2, 0)}, preempt_overhead_s=overhead
    ).run()
    by_id = {job.trace.id: job for job in result.jobs}
    assert by_id["p"].first_start == 10.0 + overhead
    assert result.preemptions == 1
    assert by_id["q"].preemptions == 0


def test_a_vc_that_lends_none_of_its_guarantee_starts_at_once(tmp_path: Path) -> None:
    # Two nodes of 4 GPUs; VC a is guaranteed 4, VC b only borrows. b1 (4 GPUs, 1,000 s) at
    # t=0 and b2 (2 GPUs, 100 s) at t=60, then a1 (4 GPUs, 100 s) at t=120. Lending all of its
    # guarantee, a finds b2 on it and waits for the reclaim's grace period; lending none, b2
    # waits for b1 to end and a1 starts at once.
    trace = tmp_path / "t.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-09-04 00:00:00,1000.0,4,4000.0,b\n"
        "2017-09-04 00:01:00,100.0,2,200.0,b\n"
        "2017-09-04 00:02:00,100.0,4,400.0,a\n"
    )
    quotas = tmp_path / "quotas.csv"
    quotas.write_text("vc,guaranteed,borrow_limit,lending_limit\na,4,0,0\nb,0,8,\n")
    keeps = load_vc_quotas(quotas)
    assert keeps == {"a": (4, 0, 0), "b": (0, 8, None)}
    lends = {vc: (g, b) for vc, (g, b, _) in keeps.items()}
    jobs = load_trace(trace, "philly").jobs
    profile = load_profile("fifo")
    lent = summarize(
        Simulator(uniform_cluster(2, 4), profile, jobs, vc_quotas=lends, preempt_overhead_s=30).run()
    )
    kept = summarize(
        Simulator(uniform_cluster(2, 4), profile, jobs, vc_quotas=keeps, preempt_overhead_s=30).run()
    )
    assert lent["preemptions_by_reason"] == {"reclaim": 1}
    assert lent["per_vc"]["a"]["avg_jct_s"] >= 130.0  # the reclaim's grace period
    assert kept["preemptions"] == 0
    assert kept["per_vc"]["a"]["avg_jct_s"] == 100.0
    assert kept["per_vc"]["b"]["avg_jct_s"] == (1000.0 + (1000.0 - 60.0 + 100.0)) / 2


def test_free_preemptions_at_one_instant_all_start_their_preemptors_then() -> None:
    """Eight long jobs fill the node; at t=100 five fresh ones (LAS queue 0) arrive, and with one
    preemption attempt per cycle each preemption takes a cycle of its own. Free preemption must
    start all five at t=100: the simulator once ran at most four cycles at an instant, and the
    GPUs the last of them freed stayed idle until a later event."""
    from scheduler.sim.trace import TraceJob

    long = [TraceJob(f"long{i}", 0.0, 1000.0, 1) for i in range(8)]
    fresh = [TraceJob(f"fresh{i}", 100.0, 50.0, 1) for i in range(5)]
    profile = Profile.from_dict(
        {
            "name": "las-one-attempt",
            "plugins": {"queue_sort": ["las", "fifo"], "preemption": ["las"], "post_cycle": ["las"]},
            "plugin_args": {"las": {"thresholds": [60]}},
            "cycle": {"max_preemption_attempts": 1, "grace_period_s": 0},
        }
    )
    result = Simulator(uniform_cluster(1, 8), profile, [*long, *fresh], preempt_overhead_s=0.0).run()
    starts = {job.trace.id: job.first_start for job in result.jobs if job.trace.id.startswith("fresh")}
    assert starts == {f"fresh{i}": 100.0 for i in range(5)}

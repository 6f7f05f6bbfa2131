"""Property tests: random sequences of submit, finish, cancel, node failure, node return and
quota change, applied the way the portal applies plans; invariants checked after every step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_builders import gpus

from scheduler.core import (
    FinishedService,
    JobId,
    Node,
    NodeName,
    NodeState,
    PendingJob,
    Plan,
    Profile,
    Quota,
    ReasonCode,
    ReplicaPlacement,
    RunningJob,
    Snapshot,
    UserName,
    VcName,
    VirtualCluster,
    decide,
    left_parked,
    load_profile,
)

VCS = ("vision", "speech", "nlp")
NODE_COUNT = 4

submit = st.tuples(
    st.just("submit"),
    st.sampled_from([1, 1, 2, 4, 8]),  # GPUs per replica
    st.sampled_from([1, 1, 1, 2, 3]),  # replicas
    st.sampled_from(VCS),
    st.sampled_from([0, 100, 1000]),  # priority
    st.sampled_from(["", "", "A100", "V100"]),  # GPU model ("" = any)
    st.sampled_from([0, 0, 16_000, 40_000]),  # mCPU per replica
)
submit_share = st.tuples(
    st.just("submit_share"),
    st.sampled_from([250, 300, 500, 700]),  # thousandths of one GPU
    st.sampled_from(VCS),
    st.sampled_from([0, 8192, 30000]),  # GPU memory (MiB) of the share
)
finish = st.tuples(st.just("finish"), st.integers(0, 50))
cancel = st.tuples(st.just("cancel"), st.integers(0, 50))
node_down = st.tuples(st.just("node_down"), st.integers(0, NODE_COUNT - 1))
node_up = st.tuples(st.just("node_up"), st.integers(0, NODE_COUNT - 1))
cordon = st.tuples(st.just("cordon"), st.integers(0, NODE_COUNT - 1))
quota = st.tuples(
    st.just("quota"),
    st.sampled_from(VCS),
    st.integers(0, 16),
    st.integers(0, 16),
    st.one_of(st.none(), st.integers(0, 16)),  # lending limit (None: lends its whole guarantee)
)
step = st.one_of(submit, submit, submit_share, finish, cancel, node_down, node_up, cordon, quota)


# Finished jobs of every width the tests submit, so that history-based plugins (the default
# profile's Gittins order) run on a learned distribution rather than their no-history rule.
HISTORY = tuple((gpus, gpus * 300.0 * (1 + k % 9) ** 2) for gpus in (1, 2, 4, 8, 16, 24) for k in range(60))


@dataclass
class Portal:
    """The part of the portal that applies plans, in memory."""

    nodes: list[Node]
    quotas: dict[str, tuple[int, int]]
    now: float = 0.0
    lending: dict[str, int] = field(default_factory=dict)  # VCs with a lending limit
    running: dict[str, RunningJob] = field(default_factory=dict)
    pending: dict[str, PendingJob] = field(default_factory=dict)
    next_id: int = 0
    finished: list[tuple[int, float]] = field(default_factory=lambda: list(HISTORY))
    moved: set[str] = field(default_factory=set)  # stopping for a migration
    # Suspended jobs told to leave the GPUs they are parked on, as they were when parked.
    evicted: dict[str, PendingJob] = field(default_factory=dict)

    def snapshot(self) -> Snapshot:
        vcs = tuple(
            VirtualCluster(VcName(v), (Quota("*", g, b, self.lending.get(v)),))
            for v, (g, b) in sorted(self.quotas.items())
        )
        return Snapshot(
            tuple(self.nodes),
            vcs,
            tuple(self.running.values()),
            tuple(self.pending.values()),
            finished=FinishedService(tuple(self.finished)),
        )

    def apply(self, op: tuple[object, ...]) -> None:
        # Jobs preempted in the previous step have used their grace period: they leave now.
        for job in [j for j in self.running.values() if j.stopping]:
            self._requeue(job)
        kind = op[0]
        if kind == "submit":
            _, per, replicas, vc, priority, model, cpu = op
            job_id = f"j{self.next_id}"
            self.next_id += 1
            self.pending[job_id] = PendingJob(
                JobId(job_id),
                VcName(str(vc)),
                UserName("u"),
                int(replicas),
                int(per),  # type: ignore[call-overload]
                submitted_at=self.now,
                priority=int(priority),  # type: ignore[call-overload]
                time_sliceable=self.next_id % 2 == 0,
                gpu_model=str(model),
                cpu_milli_per_replica=int(cpu),  # type: ignore[call-overload]
            )
        elif kind == "submit_share":
            _, share, vc, memory = op
            job_id = f"j{self.next_id}"
            self.next_id += 1
            self.pending[job_id] = PendingJob(
                JobId(job_id),
                VcName(str(vc)),
                UserName("u"),
                1,
                1,
                submitted_at=self.now,
                gpu_share_milli=int(share),  # type: ignore[call-overload]
                gpu_memory_mib=int(memory),  # type: ignore[call-overload]
            )
        elif kind in ("finish", "cancel"):
            pool = self.running if kind == "finish" else self.pending
            if pool:
                victim = sorted(pool)[int(op[1]) % len(pool)]  # type: ignore[call-overload]
                if kind == "finish":
                    ended = pool[victim]
                    self.finished.append((ended.gpus, max(ended.attained_gpu_s, 1.0)))
                del pool[victim]
        elif kind in ("node_down", "node_up", "cordon"):
            index = int(op[1])  # type: ignore[call-overload]
            state = {
                "node_down": NodeState.NOT_READY,
                "node_up": NodeState.READY,
                "cordon": NodeState.CORDONED,
            }[kind]
            node = self.nodes[index]
            self.nodes[index] = replace(node, state=state)
            if kind == "node_down":  # jobs on a lost node go back to the queue
                for job in [
                    j for j in self.running.values() if any(r.node == node.name for r in j.placement)
                ]:
                    self._requeue(job)
        elif kind == "quota":
            _, vc, guaranteed, borrow, *lending = op
            self.quotas[str(vc)] = (int(guaranteed), int(borrow))  # type: ignore[call-overload]
            lend = lending[0] if lending else None
            if lend is None:
                self.lending.pop(str(vc), None)
            else:
                self.lending[str(vc)] = min(int(lend), int(guaranteed))  # type: ignore[call-overload]

    def _requeue(self, job: RunningJob) -> None:
        del self.running[job.id]
        if job.id in self.evicted:  # back in the queue, parked nowhere
            self.pending[job.id] = replace(self.evicted.pop(job.id), suspended_on=(), queued_at=self.now)
            return
        self.pending[job.id] = PendingJob(
            job.id,
            job.vc,
            job.user,
            len(job.placement),
            len(job.placement[0].gpu_indices),
            submitted_at=job.submitted_at,
            priority=job.priority,
            attained_gpu_s=job.attained_gpu_s,
            queued_at=self.now,
            gpu_share_milli=job.gpu_share_milli,
            gpu_memory_mib=job.gpu_memory_mib,
            time_sliceable=job.time_sliceable,
            moved=job.id in self.moved,  # like the portal's pending code `moved`
            gpu_model=job.gpu_model,
            cpu_milli_per_replica=job.cpu_milli_per_replica,
        )
        self.moved.discard(job.id)

    def apply_plan(self, plan: Plan) -> None:
        evictions = []
        for suspend in plan.suspends:
            # Time-slicing: the job leaves its GPUs at once and waits to resume there.
            job = self.running.pop(suspend.job_id)
            assert job.time_sliceable, "a job that did not opt in was suspended"
            self.pending[job.id] = PendingJob(
                job.id,
                job.vc,
                job.user,
                len(job.placement),
                len(job.placement[0].gpu_indices),
                submitted_at=job.submitted_at,
                priority=job.priority,
                queued_at=self.now,
                time_sliceable=True,
                suspended_on=job.placement,
                gpu_model=job.gpu_model,
                cpu_milli_per_replica=job.cpu_milli_per_replica,
            )
        for status in plan.pending:
            # Like the portal: a job told to wait for its victims is first in line next time.
            if status.job_id in self.pending:
                first = status.reason is ReasonCode.WAITING_FOR_PREEMPTION
                self.pending[status.job_id] = replace(
                    self.pending[status.job_id], first_in_line=first, moved=False
                )
        for preemption in plan.preemptions:
            if preemption.job_id in self.pending:
                evictions.append(preemption)
                continue
            # Like the portal: signal, keep the GPUs through the grace period, then requeue.
            self.running[preemption.job_id] = replace(self.running[preemption.job_id], stopping=True)
            if preemption.reason == "defrag":
                self.moved.add(preemption.job_id)
        for start in plan.starts:
            job = self.pending.pop(start.job_id)
            self.running[job.id] = RunningJob(
                job.id,
                job.vc,
                job.user,
                start.placement,
                started_at=self.now,
                priority=job.priority,
                attained_gpu_s=job.attained_gpu_s,
                submitted_at=job.submitted_at,
                gpu_share_milli=start.gpu_share_milli,
                gpu_memory_mib=start.gpu_memory_mib,
                time_sliceable=job.time_sliceable,
                gpu_model=job.gpu_model,
                cpu_milli_per_replica=job.cpu_milli_per_replica,
            )
        for preemption in evictions:
            # A suspended job told to leave the GPUs it is parked on checkpoints on those that
            # no running job holds, as a stopping job through the grace period (the portal's
            # snapshot shows it so, once the plan is applied).
            parked = self.pending[preemption.job_id]
            assert parked.suspended_on and preemption.reason in ("time-slice-evict", "time-slice-move")
            held = [(r.node, i) for j in self.running.values() for r in j.placement for i in r.gpu_indices]
            left = left_parked(parked.suspended_on, held)
            if not left:  # its GPUs are all in use by its own tenant's jobs
                self.pending[parked.id] = replace(parked, suspended_on=(), queued_at=self.now)
                continue
            del self.pending[parked.id]
            self.evicted[parked.id] = parked
            self.running[parked.id] = RunningJob(
                parked.id,
                parked.vc,
                parked.user,
                left,
                started_at=self.now,
                priority=parked.priority,
                submitted_at=parked.submitted_at,
                time_sliceable=True,
                gpu_model=parked.gpu_model,
                stopping=True,
                parked=True,
            )


def cluster_nodes() -> list[Node]:
    """Two A100 and two V100 nodes of 8 GPUs (80 GB each) and 64 CPUs."""
    return [
        Node(
            NodeName(f"n{i}"),
            tuple(replace(g, memory_mib=80 * 1024) for g in gpus(8, "A100" if i < 2 else "V100")),
            rack=f"r{i // 2}",
            cpu_milli=64_000,
        )
        for i in range(NODE_COUNT)
    ]


def check_invariants(portal: Portal, before: Snapshot, plan: Plan) -> None:
    pending_before = {j.id: j for j in before.pending}
    nodes = {n.name: n for n in before.nodes}
    # Gangs whole or absent, on usable GPUs only.
    for start in plan.starts:
        job = pending_before[start.job_id]
        assert len(start.placement) == job.replicas
        for replica in start.placement:
            assert len(replica.gpu_indices) == job.gpus_per_replica
            node = nodes[replica.node]
            assert node.state == NodeState.READY
            assert all(node.gpus[i].healthy for i in replica.gpu_indices)
            assert job.gpu_model in ("", *(node.gpus[i].model for i in replica.gpu_indices))
    # No node gives out more CPU than it has.
    cpu: dict[str, int] = {}
    for job in portal.running.values():
        for replica in job.placement:
            cpu[replica.node] = cpu.get(replica.node, 0) + job.cpu_milli_per_replica
    for name, placed in cpu.items():
        assert placed <= nodes[name].cpu_milli, f"node {name}: {placed} mCPU placed"
    # No GPU in two whole placements; a shared GPU carries only shares, of one tenant (here
    # one VC), within its capacity and memory.
    held: set[tuple[str, int]] = set()
    shares: dict[tuple[str, int], list[RunningJob]] = {}
    for job in portal.running.values():
        for replica in job.placement:
            for index in replica.gpu_indices:
                if job.gpu_share_milli:
                    shares.setdefault((replica.node, index), []).append(job)
                    continue
                assert (replica.node, index) not in held, f"GPU {replica.node}/{index} given twice"
                held.add((replica.node, index))
    for gpu, holders in shares.items():
        assert gpu not in held, f"GPU {gpu} holds whole and fractional work"
        assert sum(j.gpu_share_milli for j in holders) <= 1000, f"GPU {gpu} shared beyond itself"
        assert sum(j.gpu_memory_mib for j in holders) <= 80 * 1024, f"GPU {gpu} memory over-committed"
        assert len({j.vc for j in holders}) == 1, f"GPU {gpu} shared across tenants"
    for start in plan.starts:
        job = pending_before[start.job_id]
        assert start.gpu_share_milli == job.gpu_share_milli
    # A suspended job's GPUs go to a job of the same VC, which started in the same plan.
    starts = {s.job_id: s for s in plan.starts}
    running_before = {j.id: j for j in before.running}
    for suspend in plan.suspends:
        assert suspend.for_job in starts
        assert pending_before[suspend.for_job].vc == running_before[suspend.job_id].vc
    # A suspended job's paused processes stay on its GPUs: no job of another tenant (here
    # another VC) starts there, not even in the plan that tells it to leave.
    parked = {
        (replica.node, index): job
        for job in before.pending
        for replica in job.suspended_on
        for index in replica.gpu_indices
    }
    for start in plan.starts:
        job = pending_before[start.job_id]
        for replica in start.placement:
            for index in replica.gpu_indices:
                there = parked.get((replica.node, index))
                assert there is None or there.vc == job.vc, f"{job.id} started on {there} parked GPUs"
    # A VC that started work is within guarantee + borrow limit afterwards (shares counted
    # as whole GPUs, rounded up; a parked job leaving its GPUs counts for none, see
    # RunningJob.parked).
    started_vcs = {pending_before[s.job_id].vc for s in plan.starts}
    for vc in started_vcs:
        guaranteed, borrow = portal.quotas[vc]
        mine = [j for j in portal.running.values() if j.vc == vc and not j.parked]
        share_milli = sum(j.gpu_share_milli for j in mine)
        used = sum(j.gpus for j in mine if not j.gpu_share_milli) + -(-share_milli // 1000)
        assert used <= guaranteed + borrow, f"VC {vc} holds {used} > {guaranteed} + {borrow}"
    check_lending(portal, before, plan)
    # Every job still pending has a reason.
    reasons = {p.job_id: p for p in plan.pending}
    started = {s.job_id for s in plan.starts}
    for job_id in pending_before:
        if job_id not in started:
            assert reasons[job_id].message and reasons[job_id].reason


def check_lending(portal: Portal, before: Snapshot, plan: Plan) -> None:
    """A start that borrows leaves free the GPUs other VCs keep for themselves (guarantee
    minus lending limit minus what they use), counted start by start in plan order, as the
    cycle decides them: a later start within its VC's guarantee may still take kept GPUs."""
    if not portal.lending:
        return
    models = {(n.name, g.index): g.model for n in before.nodes for g in n.gpus}
    held = {(r.node, i) for j in before.running for r in j.placement for i in r.gpu_indices}
    free = {
        (n.name, g.index)
        for n in before.nodes
        if n.state == NodeState.READY
        for g in n.gpus
        if g.healthy and (n.name, g.index) not in held
    }
    whole: dict[str, int] = {}
    share_milli: dict[tuple[str, str], int] = {}  # (VC, model) -> thousandths, as the core counts

    def charge(vc: str, gpus_: int, share: int, placement: tuple[ReplicaPlacement, ...]) -> None:
        if share:
            key = (vc, models[(placement[0].node, placement[0].gpu_indices[0])])
            share_milli[key] = share_milli.get(key, 0) + share
        else:
            whole[vc] = whole.get(vc, 0) + gpus_

    for job in before.running:
        if not job.parked:
            charge(job.vc, job.gpus, job.gpu_share_milli, job.placement)
    pending_before = {j.id: j for j in before.pending}
    for start in plan.starts:
        job = pending_before[start.job_id]
        free.difference_update((r.node, i) for r in start.placement for i in r.gpu_indices)
        charge(job.vc, job.gpus, start.gpu_share_milli, start.placement)
        if not start.borrowed_gpus:
            continue
        kept = 0
        for vc, lend in portal.lending.items():
            if vc == job.vc:
                continue
            used = whole.get(vc, 0) + sum(-(-m // 1000) for (v, _), m in share_milli.items() if v == vc)
            kept += max(0, portal.quotas[vc][0] - lend - used)
        assert len(free) >= kept, (
            f"{job.id} of VC {job.vc} borrowed GPUs kept by others: {len(free)} free, {kept} kept"
        )


def replay(portal: Portal, profile: Profile, steps: list[tuple[object, ...]]) -> None:
    """Each step a minute apart, then a cycle whose plan the portal applies, then the invariants."""
    for op in steps:
        portal.apply(op)
        portal.now += 60.0
        before = portal.snapshot()
        plan = decide(before, profile, portal.now)
        portal.apply_plan(plan)
        check_invariants(portal, before, plan)


PROFILES = {name: load_profile(name) for name in ("fifo", "tiresias", "default")}
# The default profile with time-slicing in quanta of two steps.
PROFILES["default-timeslice"] = replace(
    PROFILES["default"],
    post_cycle=(*PROFILES["default"].post_cycle, "timeslice"),
    plugin_args={**PROFILES["default"].plugin_args, "timeslice": {"quantum_s": 120}},
)


@pytest.mark.parametrize("profile_name", sorted(PROFILES))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=40))
def test_invariants_hold_after_every_step(profile_name: str, steps: list[tuple[object, ...]]) -> None:
    portal = Portal(cluster_nodes(), {"vision": (8, 8), "speech": (8, 4), "nlp": (4, 0)})
    replay(portal, PROFILES[profile_name], steps)


crowded_submit = st.tuples(
    st.just("submit"),
    st.sampled_from([2, 4]),
    st.just(1),
    st.just("nlp"),
    st.sampled_from([0, 100]),
    st.sampled_from(["", "A100"]),
    st.sampled_from([0, 40_000]),  # two of the larger do not fit one node's CPUs
)
crowded = st.one_of(crowded_submit, crowded_submit, finish, node_down, node_up)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(crowded, min_size=4, max_size=40))
def test_time_slicing_keeps_the_invariants_when_a_vc_is_crowded(steps: list[tuple[object, ...]]) -> None:
    """One VC with a 4-GPU guarantee and a stream of same-sized jobs: turns are taken often."""
    portal = Portal(cluster_nodes(), {"vision": (8, 8), "speech": (8, 4), "nlp": (4, 0)})
    replay(portal, PROFILES["default-timeslice"], steps)


other_vc_submit = st.tuples(
    st.just("submit"),
    st.sampled_from([2, 4, 8]),
    st.just(1),
    st.just("speech"),
    st.just(0),
    st.sampled_from(["", "A100"]),
    st.just(0),
)
nlp_quota = st.tuples(st.just("quota"), st.just("nlp"), st.integers(0, 4), st.just(0))
parked_crowd = st.one_of(crowded_submit, crowded_submit, other_vc_submit, finish, finish, nlp_quota)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(parked_crowd, min_size=4, max_size=40))
def test_no_job_of_another_tenant_starts_on_gpus_a_suspended_job_is_parked_on(
    steps: list[tuple[object, ...]],
) -> None:
    """On one node, a VC's jobs take turns; when the job holding a turn ends and the suspended
    one cannot come back (its quota was cut), another VC's jobs want those GPUs."""
    portal = Portal(cluster_nodes()[:1], {"vision": (8, 8), "speech": (8, 8), "nlp": (4, 0)})
    replay(portal, PROFILES["default-timeslice"], steps)


borrower_submit = st.tuples(
    st.just("submit"),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 1, 2]),
    st.sampled_from(["speech", "nlp"]),
    st.sampled_from([0, 100]),
    st.sampled_from(["", "A100", "V100"]),
    st.just(0),
)
keeper_submit = st.tuples(
    st.just("submit"),
    st.sampled_from([1, 4]),
    st.just(1),
    st.just("vision"),
    st.just(0),
    st.just(""),
    st.just(0),
)
lending_quota = st.tuples(
    st.just("quota"), st.just("vision"), st.just(16), st.just(0), st.one_of(st.none(), st.integers(0, 16))
)
lending_steps = st.one_of(borrower_submit, borrower_submit, keeper_submit, finish, finish, lending_quota)


@pytest.mark.parametrize("profile_name", ["fifo", "default"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(lending_steps, min_size=2, max_size=30))
def test_borrowers_never_take_what_a_vc_keeps(profile_name: str, steps: list[tuple[object, ...]]) -> None:
    """Half the cluster guaranteed to a VC that lends little or none of it, two VCs that may
    borrow nearly all of the cluster: borrowing is bound by what the VC keeps."""
    portal = Portal(
        cluster_nodes(), {"vision": (16, 0), "speech": (4, 24), "nlp": (0, 24)}, lending={"vision": 0}
    )
    replay(portal, PROFILES[profile_name], steps)

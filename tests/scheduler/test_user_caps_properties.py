"""Property test of the per-user caps of a VC: random submissions of two users with CPU and
memory, random caps on GPUs, CPU and memory, finishes, cancels and node failures, applied as the
portal applies plans. After every cycle, the general invariants hold and a user who started a
job holds no more than the caps of its VC allow (stopping jobs counted: they hold what they
have until they are gone)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cycle_properties import PROFILES, Portal, check_invariants, cluster_nodes

from scheduler.core import JobId, PendingJob, Plan, Snapshot, UserName, VcName, decide
from scheduler.core.estimate import _user_room, _UserGpuRoom, _UserRoom

VCS = ("vision", "speech")
USERS = ("alice", "bob")

submit = st.tuples(
    st.just("submit_as"),
    st.sampled_from(USERS),
    st.sampled_from([1, 1, 2, 4]),  # GPUs per replica
    st.sampled_from([1, 1, 2]),  # replicas
    st.sampled_from(VCS),
    st.sampled_from([0, 100, 1000]),  # priority
    st.sampled_from([0, 4_000, 16_000, 24_000]),  # mCPU per replica
    st.sampled_from([0, 16 * 1024, 100 * 1024]),  # MiB per replica
)
caps = st.tuples(
    st.just("caps"),
    st.sampled_from(VCS),
    st.one_of(st.none(), st.integers(1, 12)),  # GPUs
    st.one_of(st.none(), st.sampled_from([8_000, 24_000, 40_000, 64_000])),  # mCPU
    st.one_of(st.none(), st.sampled_from([32 * 1024, 128 * 1024, 256 * 1024])),  # MiB
)
finish = st.tuples(st.just("finish"), st.integers(0, 50))
cancel = st.tuples(st.just("cancel"), st.integers(0, 50))
node_down = st.tuples(st.just("node_down"), st.integers(0, 3))
node_up = st.tuples(st.just("node_up"), st.integers(0, 3))
step = st.one_of(submit, submit, submit, caps, finish, finish, cancel, node_down, node_up)

Caps = tuple[int | None, int | None, int | None]  # GPUs, mCPU, MiB per user


@dataclass
class CappedPortal(Portal):
    """The property tests' portal with per-user caps per VC and jobs that ask for memory."""

    caps: dict[str, Caps] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)  # job id -> MiB per replica

    def snapshot(self) -> Snapshot:
        base = super().snapshot()
        vcs = []
        for vc in base.vcs:
            gpus, cpu, memory = self.caps.get(vc.name, (None, None, None))
            vcs.append(
                replace(
                    vc, max_gpus_per_user=gpus, max_cpu_milli_per_user=cpu, max_memory_mib_per_user=memory
                )
            )
        return replace(base, vcs=tuple(vcs))

    def apply(self, op: tuple[object, ...]) -> None:
        if op[0] == "caps":
            _, vc, gpus, cpu, memory = op
            self.caps[str(vc)] = (gpus, cpu, memory)  # type: ignore[assignment]
            return
        if op[0] != "submit_as":
            super().apply(op)
            self._keep_memory()
            return
        _, user, per, replicas, vc, priority, cpu, memory = op
        # As for every step of the base portal: jobs preempted in the previous step leave now.
        for job in [j for j in self.running.values() if j.stopping]:
            self._requeue(job)
        job_id = f"j{self.next_id}"
        self.next_id += 1
        self.memory[job_id] = int(memory)  # type: ignore[call-overload]
        self.pending[job_id] = PendingJob(
            JobId(job_id),
            VcName(str(vc)),
            UserName(str(user)),
            int(replicas),  # type: ignore[call-overload]
            int(per),  # type: ignore[call-overload]
            submitted_at=self.now,
            priority=int(priority),  # type: ignore[call-overload]
            time_sliceable=self.next_id % 2 == 0,
            cpu_milli_per_replica=int(cpu),  # type: ignore[call-overload]
            memory_mib_per_replica=int(memory),  # type: ignore[call-overload]
        )
        self._keep_memory()

    def apply_plan(self, plan: Plan) -> None:
        super().apply_plan(plan)
        self._keep_memory()

    def _keep_memory(self) -> None:
        """The base portal carries a job's CPU from queue to GPUs and back, but not its memory:
        put it back wherever the job is now (a parked job leaving its GPUs holds none)."""
        for jobs in (self.running, self.pending):
            for job_id, job in jobs.items():
                memory = 0 if getattr(job, "parked", False) else self.memory.get(job_id, 0)
                if job.memory_mib_per_replica != memory:
                    jobs[job_id] = replace(job, memory_mib_per_replica=memory)  # type: ignore[type-var]


def check_user_caps(portal: CappedPortal, before: Snapshot, plan: Plan) -> None:
    pending_before = {j.id: j for j in before.pending}
    caps = {vc.name: vc for vc in before.vcs}
    for start in plan.starts:
        job = pending_before[start.job_id]
        vc = caps[job.vc]
        mine = [j for j in portal.running.values() if (j.vc, j.user) == (job.vc, job.user) and not j.parked]
        held = (
            sum(j.gpus for j in mine),
            sum(len(j.placement) * j.cpu_milli_per_replica for j in mine),
            sum(len(j.placement) * j.memory_mib_per_replica for j in mine),
        )
        limits = (vc.max_gpus_per_user, vc.max_cpu_milli_per_user, vc.max_memory_mib_per_user)
        for what, amount, cap in zip(("GPUs", "mCPU", "MiB"), held, limits, strict=True):
            assert cap is None or amount <= cap, f"{job.user} in {job.vc} holds {amount} {what} > {cap}"


@pytest.mark.parametrize("profile_name", ["fifo", "default", "default-timeslice"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=40))
def test_no_user_starts_past_the_caps_of_the_vc(profile_name: str, steps: list[tuple[object, ...]]) -> None:
    portal = CappedPortal(cluster_nodes(), {"vision": (12, 8), "speech": (8, 4)})
    for op in steps:
        portal.apply(op)
        portal.now += 60.0
        before = portal.snapshot()
        plan = decide(before, PROFILES[profile_name], portal.now)
        portal.apply_plan(plan)
        check_invariants(portal, before, plan)
        check_user_caps(portal, before, plan)


GPUS, MILLI_CPUS, MIB = st.integers(0, 8), st.integers(0, 48_000), st.integers(0, 256 * 1024)
amounts = st.tuples(GPUS, MILLI_CPUS, MIB)


@settings(max_examples=300, deadline=None)
@given(
    caps=st.tuples(
        st.one_of(st.none(), st.integers(1, 16)),
        st.one_of(st.none(), st.integers(1_000, 64_000)),
        st.one_of(st.none(), st.integers(1_024, 512 * 1024)),
    ).filter(lambda c: c != (None, None, None)),
    held=amounts,
    ends=st.lists(
        st.tuples(st.floats(0, 10_000), GPUS, MILLI_CPUS, MIB),
        max_size=12,
    ),
    probes=st.lists(st.tuples(amounts, st.floats(0, 12_000)), min_size=1, max_size=6),
)
def test_a_peek_answers_as_a_start_would_and_gives_nothing_back(
    caps: tuple[int | None, int | None, int | None],
    held: tuple[int, int, int],
    ends: list[tuple[float, int, int, int]],
    probes: list[tuple[tuple[int, int, int], float]],
) -> None:
    # What a user holds covers what their running jobs will give back.
    held = tuple(held[i] + sum(end[1 + i] for end in ends) for i in range(3))
    room = _UserRoom(caps, held, ends, now=100.0)
    for probe, not_before in probes:
        asks = [probe[i] for i in room.dims]
        before = (list(room.used), sorted(room.ends), room.at)
        twin = copy.deepcopy(room)
        assert room.peek(asks, not_before) == twin.start(asks, not_before)
        assert (list(room.used), sorted(room.ends), room.at) == before
        start = room.start(asks, not_before)  # the walk goes on as an estimate's would
        if start is not None:
            room.book(asks, start + 600)


@settings(max_examples=300, deadline=None)
@given(
    cap=st.integers(1, 16),
    held=amounts,
    ends=st.lists(st.tuples(st.floats(0, 10_000), GPUS, MILLI_CPUS, MIB), max_size=12),
    steps=st.lists(
        st.tuples(st.sampled_from(["take", "peek"]), GPUS, st.sampled_from([0, 500]), st.floats(0, 12_000)),
        min_size=1,
        max_size=10,
    ),
)
def test_a_gpu_only_room_answers_as_the_general_room(
    cap: int,
    held: tuple[int, int, int],
    ends: list[tuple[float, int, int, int]],
    steps: list[tuple[str, int, int, float]],
) -> None:
    """The walk's room on plain numbers (a VC that caps GPUs alone) gives the same starts as the
    room over lists, step by step, fractional jobs (which count no GPU) included."""
    held = tuple(held[i] + sum(end[1 + i] for end in ends) for i in range(3))
    caps = (cap, None, None)
    fast, general = _user_room(caps, held, ends, 100.0), _UserRoom(caps, held, ends, now=100.0)
    assert isinstance(fast, _UserGpuRoom)
    for action, gpus, share_milli, not_before in steps:
        job = PendingJob(
            JobId("j"),
            VcName("vision"),
            UserName("alice"),
            1,
            1 if share_milli else gpus,
            0.0,
            gpu_share_milli=share_milli,
        )
        if action == "peek":
            assert fast.peek(fast.asks(job), not_before) == general.peek(general.asks(job), not_before)
        else:
            assert fast.take(job, not_before, 600.0) == general.take(job, not_before, 600.0)
        assert (fast.used, fast.at) == (general.used[0], general.at)

"""Pure builders for scheduler tests: Snap().node("n1", gpus=8).pending("j1", gpus=4).build()."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduler.core import (
    FinishedService,
    Gpu,
    JobId,
    Node,
    NodeName,
    NodeState,
    PendingJob,
    Profile,
    Quota,
    ReplicaPlacement,
    RunningJob,
    Snapshot,
    UserName,
    VcName,
    VirtualCluster,
)


def gpus(
    count: int, model: str = "A100", nvlink: int = 4, pcie: int = 2, unhealthy: tuple[int, ...] = ()
) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=i,
            model=model,
            uuid=f"GPU-{i}",
            nvlink_group=i // nvlink,
            pcie_switch=i // pcie,
            numa_node=i // max(count // 2, 1),
            healthy=i not in unhealthy,
        )
        for i in range(count)
    )


class Snap:
    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._vcs: list[VirtualCluster] = []
        self._running: list[RunningJob] = []
        self._pending: list[PendingJob] = []
        self._finished: list[tuple[int, float]] = []

    def node(
        self,
        name: str,
        gpus_: int = 8,
        model: str = "A100",
        rack: str = "r0",
        state: NodeState = NodeState.READY,
        unhealthy: tuple[int, ...] = (),
        nvlink: int = 4,
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> Snap:
        self._nodes.append(
            Node(
                NodeName(name),
                gpus(gpus_, model, nvlink=nvlink, unhealthy=unhealthy),
                rack=rack,
                state=state,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
            )
        )
        return self

    def nodes(
        self, count: int, gpus_: int = 8, model: str = "A100", per_rack: int = 4, prefix: str = "n"
    ) -> Snap:
        for i in range(count):
            self.node(f"{prefix}{i}", gpus_, model, rack=f"r{i // per_rack}")
        return self

    def vc(
        self,
        name: str,
        guaranteed: int,
        borrow: int = 0,
        model: str = "*",
        max_gpus_per_user: int | None = None,
        queueing_policy: str = "",
        stop_policy: str = "",
        lend: int | None = None,
        max_cpu_milli_per_user: int | None = None,
        max_memory_mib_per_user: int | None = None,
        budget_message: str = "",
    ) -> Snap:
        self._vcs.append(
            VirtualCluster(
                VcName(name),
                (Quota(model, guaranteed, borrow, lend),),
                tenant=name,
                max_gpus_per_user=max_gpus_per_user,
                max_cpu_milli_per_user=max_cpu_milli_per_user,
                max_memory_mib_per_user=max_memory_mib_per_user,
                budget_message=budget_message,
                queueing_policy=queueing_policy,
                stop_policy=stop_policy,
            )
        )
        return self

    def running(
        self,
        job_id: str,
        placement: list[tuple[str, tuple[int, ...]]],
        vc: str = "team",
        user: str = "alice",
        started_at: float = 0.0,
        **fields: Any,
    ) -> Snap:
        self._running.append(
            RunningJob(
                id=JobId(job_id),
                vc=VcName(vc),
                user=UserName(user),
                placement=tuple(ReplicaPlacement(NodeName(n), idx) for n, idx in placement),
                started_at=started_at,
                **fields,
            )
        )
        return self

    def pending(
        self,
        job_id: str,
        gpus_: int = 1,
        replicas: int = 1,
        vc: str = "team",
        user: str = "alice",
        submitted_at: float = 0.0,
        **fields: Any,
    ) -> Snap:
        self._pending.append(
            PendingJob(
                id=JobId(job_id),
                vc=VcName(vc),
                user=UserName(user),
                replicas=replicas,
                gpus_per_replica=gpus_,
                submitted_at=submitted_at,
                **fields,
            )
        )
        return self

    def finished(self, gpus_: int, gpu_s: float, count: int = 1) -> Snap:
        """`count` finished jobs of `gpus_` GPUs that attained `gpu_s` GPU-seconds each."""
        self._finished.extend([(gpus_, gpu_s)] * count)
        return self

    def build(self) -> Snapshot:
        vcs = self._vcs
        if not vcs:
            # Without explicit VCs every VC used by a job may use the whole cluster.
            total = sum(len(n.gpus) for n in self._nodes)
            names = sorted({j.vc for j in self._running} | {j.vc for j in self._pending})
            vcs = [VirtualCluster(VcName(n), (Quota("*", total, total),)) for n in names]
        return Snapshot(
            tuple(self._nodes),
            tuple(vcs),
            tuple(self._running),
            tuple(self._pending),
            finished=FinishedService(tuple(self._finished)),
        )


def profile(**plugins: Any) -> Profile:
    """A profile from plugin lists, e.g. profile(queue_sort=["fifo"], preemption=["priority"])."""
    plugin_args = plugins.pop("plugin_args", {})
    cycle = plugins.pop("cycle", {})
    return Profile.from_dict({"name": "test", "plugins": plugins, "plugin_args": plugin_args, "cycle": cycle})


def with_cycle(p: Profile, **settings: Any) -> Profile:
    return replace(p, cycle=replace(p.cycle, **settings))

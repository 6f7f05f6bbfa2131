"""Pure scheduling core: an immutable `Snapshot` in, a `Plan` out (`decide`).

Stdlib only; no Django, Celery or database import (tests/scheduler/test_core_is_pure.py).
See docs/scheduler.md for the cycle, the extension points and the profiles.
"""

from scheduler.core.cycle import decide
from scheduler.core.profile import CycleSettings, Profile, load_profile
from scheduler.core.registry import REGISTRY
from scheduler.core.types import (
    ALL_MODELS,
    ANY_MODEL,
    FinishedService,
    Flavor,
    Gpu,
    HintKind,
    JobId,
    Node,
    NodeName,
    NodeState,
    PendingJob,
    PendingStatus,
    Plan,
    Preemption,
    Quota,
    ReasonCode,
    ReplicaPlacement,
    RunningJob,
    Snapshot,
    Start,
    Suspend,
    UserName,
    VcName,
    VirtualCluster,
    WhatIfHint,
    left_parked,
)

__all__ = [
    "ALL_MODELS",
    "ANY_MODEL",
    "REGISTRY",
    "CycleSettings",
    "FinishedService",
    "Flavor",
    "Gpu",
    "HintKind",
    "JobId",
    "Node",
    "NodeName",
    "NodeState",
    "PendingJob",
    "PendingStatus",
    "Plan",
    "Preemption",
    "Profile",
    "Quota",
    "ReasonCode",
    "ReplicaPlacement",
    "RunningJob",
    "Snapshot",
    "Start",
    "Suspend",
    "UserName",
    "VcName",
    "VirtualCluster",
    "WhatIfHint",
    "decide",
    "left_parked",
    "load_profile",
]

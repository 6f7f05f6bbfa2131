"""Plugin registry: the one place where plugin names are spelled.

A profile refers to plugins by these names; adding a policy means writing a module under
`plugins/` and adding one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scheduler.core.plugins.admission import UserLimit, VcQuota
from scheduler.core.plugins.backfill import BackfillReservation
from scheduler.core.plugins.defrag import Defragment
from scheduler.core.plugins.placement import (
    BinPack,
    BuddyCells,
    BuddyChooser,
    NodeResources,
    Spread,
    TopologyAffinity,
    TopologyChooser,
)
from scheduler.core.plugins.queue_sort import (
    DiscretizedLas,
    DominantResourceFairness,
    Fifo,
    GittinsIndex,
    GuaranteeFirst,
    PriorityClass,
    ShortestExpectedFirst,
)
from scheduler.core.plugins.reclaim import Reclaim
from scheduler.core.plugins.sharing import BestFitShare, FragmentationGradient
from scheduler.core.plugins.timeslice import TimeSlice

PluginFactory = Callable[[Mapping[str, Any]], object]

# Names are unique across extension points: a plugin that serves several points (las is a
# queue sort, a preemption rule and a post-cycle hook) is one object built once per cycle.
REGISTRY: dict[str, PluginFactory] = {
    "fifo": Fifo,
    "priority": PriorityClass,
    "las": DiscretizedLas,
    "gittins": GittinsIndex,
    "sef": ShortestExpectedFirst,
    "drf": DominantResourceFairness,
    "guarantee_first": GuaranteeFirst,
    "vc_quota": VcQuota,
    "user_limit": UserLimit,
    "node_resources": NodeResources,
    "topology": TopologyAffinity,
    "topology_chooser": TopologyChooser,
    "buddy": BuddyChooser,
    "buddy_cells": BuddyCells,
    "binpack": BinPack,
    "spread": Spread,
    "reclaim": Reclaim,
    "backfill": BackfillReservation,
    "defrag": Defragment,
    "best_fit_share": BestFitShare,
    "fgd": FragmentationGradient,
    "timeslice": TimeSlice,
}


def build_plugin(name: str, args: Mapping[str, Any]) -> object:
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown scheduler plugin {name!r}; known: {known}") from None
    return factory(args)

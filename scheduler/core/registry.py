"""Plugin registry: the one place where plugin names are spelled.

A profile refers to plugins by these names; adding a policy means writing a module under
`plugins/` and adding one line here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
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
    """The plugin, from arguments checked when the profile was loaded (checked_plugin): every
    cycle builds its plugins afresh, so the checks are not made again here."""
    return _factory(name)(args)


def _factory(name: str) -> PluginFactory:
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown scheduler plugin {name!r}; known: {known}") from None


def checked_plugin(name: str, args: Mapping[str, Any]) -> object:
    """The plugin, or a `ValueError` naming it: a profile's arguments are user data, so a
    wrong type or a misspelt name must not surface as a `TypeError` or be ignored."""
    factory = _factory(name)
    read = ReadArgs(args)
    try:
        plugin = factory(read)
    except (TypeError, KeyError, ValueError, AttributeError) as error:
        message = f"missing {error}" if isinstance(error, KeyError) else str(error)
        if not message.startswith(f"{name}: "):
            message = f"plugin {name!r}: {message}"
        raise ValueError(message) from error
    unknown = sorted(set(args) - read.names)
    if unknown:
        takes = f"it takes {', '.join(sorted(read.names))}" if read.names else "it takes none"
        raise ValueError(f"plugin {name!r}: unknown args {', '.join(unknown)} ({takes})")
    return plugin


class ReadArgs(Mapping[str, Any]):
    """A plugin's arguments that note which names the plugin reads (every plugin reads all of
    its arguments when it is built, so the others are misspelt or meant for another plugin)
    and refuse a value of another kind than the default it is read with: plugins convert
    what they read, and `bool("false")` is true, a string of thresholds iterates as its
    characters."""

    def __init__(self, args: Mapping[str, Any]) -> None:
        self._args = args
        self.names: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.names.add(key)
        return self._args[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._args)

    def __len__(self) -> int:
        return len(self._args)

    def get(self, key: str, default: Any = None) -> Any:
        self.names.add(key)
        if key not in self._args:
            return default
        value = self._args[key]
        expected = _KIND_OF_DEFAULT.get(type(default))
        if expected is not None and not is_kind(value, expected):
            raise ValueError(f"{key} must be {KINDS[expected]}, not {shown(value)}")
        numbers = expected is list and bool(default) and all(is_kind(v, float) for v in default)
        if numbers and not all(is_kind(v, float) for v in value):
            raise ValueError(f"{key} must be a list of numbers, not {shown(value)}")
        return value


# The kind of value a plugin argument takes, by the type of the default it is read with (a
# plugin converts numbers itself, so an int default takes any number).
_KIND_OF_DEFAULT: dict[type, type] = {bool: bool, int: float, float: float, str: str, list: list}

KINDS: dict[type, str] = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def is_kind(value: object, expected: type) -> bool:
    """Whether a JSON value is of the kind: bool is no number here (Python's `True == 1`
    would let `true` through as 1), and an int is a float."""
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, int | float)
    if expected is list:
        return isinstance(value, list | tuple)
    if expected is dict:
        return isinstance(value, Mapping)
    return isinstance(value, expected)


def shown(value: object) -> str:
    """A value as the user wrote it in JSON, cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""Scheduling profiles: which plugins run at which extension point, with what arguments.

A profile is data (JSON) shared by the portal and the simulator, in the shape of a
kube-scheduler configuration profile:

    {"name": "default",
     "plugins": {"queue_sort": ["priority", "las", "fifo"],
                 "admission": ["vc_quota", "user_limit"],
                 "filter": ["node_resources"],
                 "gpu_chooser": "buddy",
                 "share_chooser": "fgd",
                 "score": [{"name": "topology", "weight": 2}, "binpack"],
                 "backfill": null,
                 "preemption": ["priority", "reclaim", "las"],
                 "post_cycle": ["las"]},
     "plugin_args": {"las": {"thresholds": [3600, 36000]}},
     "cycle": {"grace_period_s": 30, "min_runtime_s": 0}}

It is validated when loaded (unknown plugins, plugins at a point they do not implement,
unknown cycle settings or plugin arguments, and values of the wrong JSON type fail fast, with
a `ValueError` naming the key), so a typo cannot surface mid-cycle.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from scheduler.core.framework import (
    AdmissionPlugin,
    BackfillPlugin,
    FilterPlugin,
    GpuChooserPlugin,
    PostCyclePlugin,
    PreemptionPlugin,
    QueueSortPlugin,
    ScorePlugin,
    ShareChooserPlugin,
)
from scheduler.core.registry import KINDS, build_plugin, checked_plugin, is_kind, shown

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


@dataclass(frozen=True, slots=True)
class CycleSettings:
    grace_period_s: float = 30.0  # time a preempted job gets to checkpoint and exit
    min_runtime_s: float = 0.0  # never preempt a job that has run less than this
    max_preemption_attempts: int = 8  # blocked jobs per cycle that may look for victims
    max_victims: int = 64  # victims examined per preemption attempt
    max_candidates: int = 16  # nodes scored per replica (kube's percentageOfNodesToScore)
    candidate_order: str = "fullest"  # which free-count buckets are scanned first: fullest|emptiest
    default_runtime_s: float = 3600.0  # runtime assumed for jobs without estimate or limit
    # Estimated starts cost a forward simulation per cycle; a caller that does not show them
    # every cycle (the simulator between arrivals) may switch them off: estimated_start is None.
    estimate_starts: bool = True
    # Kinds of waiting job (preemption horizon keys) whose estimates count the running jobs
    # that would yield to them; later kinds in queue order count only expected ends, which errs
    # late. Each kind costs a pass over the running jobs, and the Gittins order can have a
    # hundred in a long queue.
    estimate_max_kinds: int = 16
    # A job that accepts any GPU model: "first" = the first model (by name) with room, "best" =
    # the model whose placement scores best (single-replica jobs; costs a trial per model).
    any_model: str = "first"
    # What-if hints are tried for this many blocked jobs at the head of the queue (0 = none):
    # each costs a few trial placements and a forward simulation per proposed change.
    whatif_max_jobs: int = 20

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CycleSettings:
        _check(isinstance(data, Mapping), "cycle", "an object of settings", data)
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown cycle settings: {sorted(unknown)}")
        # The settings are used as given (a count in a range, a time in arithmetic), so a
        # string or a fraction where the cycle counts would fail only in the middle of a cycle.
        types = get_type_hints(cls)
        for key, value in data.items():
            if types[key] in KINDS:
                _check(is_kind(value, types[key]), f"cycle.{key}", KINDS[types[key]], value)
        settings = cls(**dict(data))
        if settings.candidate_order not in ("fullest", "emptiest"):
            raise ValueError("cycle.candidate_order must be 'fullest' or 'emptiest'")
        if settings.any_model not in ("first", "best"):
            raise ValueError("cycle.any_model must be 'first' or 'best'")
        return settings


@dataclass(slots=True)
class PluginSet:
    """The plugin objects of one cycle, grouped by extension point."""

    queue_sort: list[QueueSortPlugin]
    admission: list[AdmissionPlugin]
    filter: list[FilterPlugin]
    gpu_chooser: GpuChooserPlugin
    share_chooser: ShareChooserPlugin
    score: list[tuple[ScorePlugin, float]]
    backfill: BackfillPlugin | None
    preemption: list[PreemptionPlugin]
    post_cycle: list[PostCyclePlugin]
    by_name: dict[str, object]


_POINTS: dict[str, type] = {
    "queue_sort": QueueSortPlugin,
    "admission": AdmissionPlugin,
    "filter": FilterPlugin,
    "gpu_chooser": GpuChooserPlugin,
    "share_chooser": ShareChooserPlugin,
    "score": ScorePlugin,
    "backfill": BackfillPlugin,
    "preemption": PreemptionPlugin,
    "post_cycle": PostCyclePlugin,
}


@dataclass(frozen=True)
class Profile:
    name: str
    queue_sort: tuple[str, ...] = ("fifo",)
    admission: tuple[str, ...] = ("vc_quota",)
    filter: tuple[str, ...] = ("node_resources",)
    gpu_chooser: str = "topology_chooser"
    share_chooser: str = "best_fit_share"
    score: tuple[tuple[str, float], ...] = (("topology", 1.0), ("binpack", 1.0))
    backfill: str | None = None
    preemption: tuple[str, ...] = ()
    post_cycle: tuple[str, ...] = ()
    plugin_args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False, compare=False)
    cycle: CycleSettings = field(default_factory=CycleSettings)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """The profile of parsed JSON. Its shape is checked before use: Python would take a
        string where a list of names belongs as a list of letters ("fifo" as f, i, f, o)."""
        _check(
            isinstance(data, Mapping), "a profile", "a JSON object (name, plugins, plugin_args, cycle)", data
        )
        unknown = set(data) - {"name", "description", "plugins", "plugin_args", "cycle"}
        if unknown:
            raise ValueError(f"unknown profile keys: {sorted(unknown)}")
        for key in ("name", "description"):
            if key in data:
                _check(isinstance(data[key], str), key, "a string", data[key])
        plugins = data.get("plugins", {})
        _check(isinstance(plugins, Mapping), "plugins", "an object of extension points", plugins)
        unknown = set(plugins) - set(_POINTS)
        if unknown:
            raise ValueError(f"unknown extension points: {sorted(unknown)}")

        def names(point: str, default: tuple[str, ...]) -> tuple[str, ...]:
            value = plugins.get(point)
            if value is None:
                return default
            listed = is_kind(value, list) and all(isinstance(v, str) for v in value)
            _check(listed, f"plugins.{point}", "a list of plugin names", value)
            return tuple(value)

        def one(point: str, default: str | None, kind: str) -> Any:
            value = plugins.get(point, default)
            _check(
                isinstance(value, str) or (value is None and default is None), f"plugins.{point}", kind, value
            )
            return value

        entries = plugins.get("score")
        if entries is None:
            entries = ["topology", "binpack"]
        score_kind = 'a plugin name or an object {"name": NAME, "weight": NUMBER}'
        _check(is_kind(entries, list), "plugins.score", f"a list, each entry {score_kind}", entries)
        scores: list[tuple[str, float]] = []
        for i, entry in enumerate(entries):
            if isinstance(entry, str):
                scores.append((entry, 1.0))
                continue
            weighted = (
                isinstance(entry, Mapping)
                and set(entry) <= {"name", "weight"}
                and isinstance(entry.get("name"), str)
                and is_kind(entry.get("weight", 1.0), float)
            )
            _check(weighted, f"plugins.score[{i}]", score_kind, entry)
            scores.append((entry["name"], float(entry.get("weight", 1.0))))

        plugin_args = data.get("plugin_args", {})
        _check(
            isinstance(plugin_args, Mapping),
            "plugin_args",
            "an object of plugin name: {arguments}",
            plugin_args,
        )
        for name, args in plugin_args.items():
            _check(isinstance(args, Mapping), f"plugin_args.{name}", "an object of arguments", args)
        profile = cls(
            name=str(data.get("name", "unnamed")),
            queue_sort=names("queue_sort", ("fifo",)),
            admission=names("admission", ("vc_quota",)),
            filter=names("filter", ("node_resources",)),
            gpu_chooser=one("gpu_chooser", "topology_chooser", "a plugin name"),
            share_chooser=one("share_chooser", "best_fit_share", "a plugin name"),
            score=tuple(scores),
            backfill=one("backfill", None, "a plugin name or null"),
            preemption=names("preemption", ()),
            post_cycle=names("post_cycle", ()),
            plugin_args={k: dict(v) for k, v in plugin_args.items()},
            cycle=CycleSettings.from_dict(data.get("cycle", {})),
        )
        built = profile.build(checked_plugin)  # validate now, not in the middle of a cycle
        # A VC's queueing policy is built from its arguments in the middle of a cycle, whether
        # or not the profile lists it: arguments for any plugin are checked here.
        for name, args in profile.plugin_args.items():
            if name not in built.by_name:
                checked_plugin(name, args)
        return profile

    def build(self, make: Callable[[str, Mapping[str, Any]], object] = build_plugin) -> PluginSet:
        """Fresh plugin objects for one cycle (plugins may keep per-cycle data in prepare);
        `make` builds each, checking its arguments when the profile is loaded (checked_plugin)."""
        by_name: dict[str, object] = {}

        def get(name: str, point: str) -> Any:
            if name not in by_name:
                by_name[name] = make(name, self.plugin_args.get(name, {}))
            plugin = by_name[name]
            if not isinstance(plugin, _POINTS[point]):
                raise ValueError(f"plugin {name!r} cannot run at extension point {point!r}")
            return plugin

        return PluginSet(
            queue_sort=[get(n, "queue_sort") for n in self.queue_sort],
            admission=[get(n, "admission") for n in self.admission],
            filter=[get(n, "filter") for n in self.filter],
            gpu_chooser=get(self.gpu_chooser, "gpu_chooser"),
            share_chooser=get(self.share_chooser, "share_chooser"),
            score=[(get(n, "score"), w) for n, w in self.score],
            backfill=get(self.backfill, "backfill") if self.backfill else None,
            preemption=[get(n, "preemption") for n in self.preemption],
            post_cycle=[get(n, "post_cycle") for n in self.post_cycle],
            by_name=by_name,
        )


class UnknownProfile(ValueError):
    """A profile name that is neither shipped nor a file (the message lists the shipped ones)."""


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (fifo, tiresias, default, ...) or a JSON file path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = PROFILES_DIR / f"{name_or_path}.json"
        if not path.is_file():
            shipped = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
            raise UnknownProfile(f"unknown profile {name_or_path!r}: give one of {shipped}, or a JSON file")
    with path.open(encoding="utf-8") as f:
        try:
            data = json.load(f)
        except ValueError as error:  # not JSON, or not UTF-8
            raise ValueError(f"profile {path} is not valid JSON: {error}") from error
    try:
        return Profile.from_dict(data)
    except ValueError as error:
        raise ValueError(f"profile {path} is not valid: {error}") from error


def _check(ok: bool, key: str, kind: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{key} must be {kind}, not {shown(value)}")

"""A profile is user-written JSON: one that parses but has the wrong shape must be refused when
it is loaded, with a `ValueError` naming the key, and never run on as something else (a
string of names read letter by letter) or fail later inside the core with a `TypeError`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.core import Profile, load_profile
from scheduler.core.profile import PROFILES_DIR

REPO = Path(__file__).resolve().parents[2]

# (case id, the profile or a part of it, what the message must say: the key and the fault).
CASES: list[tuple[str, Any, list[str]]] = [
    ("top-level-list", ["fifo"], ["a profile must be a JSON object", '["fifo"]']),
    ("top-level-string", "fifo", ["a profile must be a JSON object", '"fifo"']),
    ("name-number", {"name": 5}, ["name must be a string", "not 5"]),
    ("description-list", {"description": ["a"]}, ["description must be a string"]),
    ("plugins-list", {"plugins": ["fifo"]}, ["plugins must be an object"]),
    ("plugins-null", {"plugins": None}, ["plugins must be an object", "not null"]),
    (
        "queue-sort-string",
        {"plugins": {"queue_sort": "fifo"}},
        ['plugins.queue_sort must be a list of plugin names, not "fifo"'],
    ),
    (
        "admission-non-string",
        {"plugins": {"admission": ["vc_quota", 3]}},
        ["plugins.admission must be a list"],
    ),
    ("filter-null-entry", {"plugins": {"filter": [None]}}, ["plugins.filter must be a list"]),
    ("preemption-object", {"plugins": {"preemption": {"las": 1}}}, ["plugins.preemption must be a list"]),
    ("post-cycle-string", {"plugins": {"post_cycle": "las"}}, ["plugins.post_cycle must be a list"]),
    ("score-string", {"plugins": {"score": "binpack"}}, ["plugins.score must be a list", '"binpack"']),
    (
        "score-entry-number",
        {"plugins": {"score": ["binpack", 3]}},
        ["plugins.score[1] must be a plugin name"],
    ),
    ("score-entry-no-name", {"plugins": {"score": [{"weight": 2}]}}, ["plugins.score[0]", '"name": NAME']),
    ("score-entry-name-number", {"plugins": {"score": [{"name": 3}]}}, ["plugins.score[0]"]),
    (
        "score-entry-weight-string",
        {"plugins": {"score": [{"name": "binpack", "weight": "2"}]}},
        ["plugins.score[0]", '"weight": NUMBER', '"weight": "2"'],
    ),
    (
        "score-entry-weight-bool",
        {"plugins": {"score": [{"name": "binpack", "weight": True}]}},
        ["plugins.score[0]"],
    ),
    (
        "score-entry-misspelt-key",
        {"plugins": {"score": [{"name": "binpack", "wieght": 2}]}},
        ["plugins.score[0]", "wieght"],
    ),
    (
        "gpu-chooser-list",
        {"plugins": {"gpu_chooser": ["buddy"]}},
        ["plugins.gpu_chooser must be a plugin name"],
    ),
    (
        "gpu-chooser-null",
        {"plugins": {"gpu_chooser": None}},
        ["plugins.gpu_chooser must be a plugin name", "null"],
    ),
    (
        "share-chooser-number",
        {"plugins": {"share_chooser": 1}},
        ["plugins.share_chooser must be a plugin name"],
    ),
    (
        "backfill-bool",
        {"plugins": {"backfill": True}},
        ["plugins.backfill must be a plugin name or null", "true"],
    ),
    ("plugin-args-list", {"plugin_args": [{"las": {}}]}, ["plugin_args must be an object"]),
    ("plugin-args-null", {"plugin_args": None}, ["plugin_args must be an object"]),
    ("plugin-args-entry-list", {"plugin_args": {"las": [3600]}}, ["plugin_args.las must be an object"]),
    (
        "las-thresholds-string",
        {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"thresholds": "3600"}}},
        ["plugin 'las'", 'thresholds must be a list, not "3600"'],
    ),
    (
        "las-thresholds-number",
        {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"thresholds": 3600}}},
        ["plugin 'las'", "thresholds must be a list"],
    ),
    (
        "las-threshold-entry-string",
        {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"thresholds": [900, "3600"]}}},
        ["plugin 'las'", 'thresholds must be a list of numbers, not [900, "3600"]'],
    ),
    (
        "las-service-number",
        {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"service": 5}}},
        ["plugin 'las'", "service must be a string"],
    ),
    (
        "las-factor-string",
        {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"starvation_factor": "0.5"}}},
        ["plugin 'las'", "starvation_factor must be a number"],
    ),
    (
        "las-factor-bool",
        {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"starvation_factor": True}}},
        ["plugin 'las'", "starvation_factor must be a number"],
    ),
    (
        "fifo-flag-string",
        {"plugin_args": {"fifo": {"by_requeue_time": "false"}}},
        ["plugin 'fifo'", 'by_requeue_time must be true or false, not "false"'],
    ),
    (
        "las-misspelt-arg",
        {"plugins": {"queue_sort": ["las"]}, "plugin_args": {"las": {"threshold": [3600]}}},
        ["plugin 'las'", "unknown args threshold", "thresholds"],
    ),
    (
        "gittins-reads-las-args",
        {"plugins": {"queue_sort": ["gittins"]}, "plugin_args": {"gittins": {"min_sample": 5}}},
        ["plugin 'gittins'", "unknown args min_sample", "min_samples", "thresholds"],
    ),
    (
        "arg-for-a-plugin-without-args",
        {"plugins": {"preemption": ["reclaim"]}, "plugin_args": {"reclaim": {"cost": 1}}},
        ["plugin 'reclaim'", "unknown args cost", "it takes none"],
    ),
    (
        "fgd-workload-string",
        {"plugins": {"share_chooser": "fgd"}, "plugin_args": {"fgd": {"workload": "mixed"}}},
        ["plugin 'fgd'"],
    ),
    (
        "fgd-workload-entry-text",
        {"plugins": {"share_chooser": "fgd"}, "plugin_args": {"fgd": {"workload": [{"gpus": "two"}]}}},
        ["plugin 'fgd'", "'two'"],
    ),
    (
        # A VC's queueing policy is built from these mid-cycle, listed in the profile or not.
        "args-of-an-unlisted-plugin",
        {"plugins": {"queue_sort": ["fifo"]}, "plugin_args": {"las": {"thresholds": "3600"}}},
        ["plugin 'las'", "thresholds must be a list"],
    ),
    ("args-of-an-unknown-plugin", {"plugin_args": {"lass": {}}}, ["unknown scheduler plugin 'lass'"]),
    ("cycle-list", {"cycle": [30]}, ["cycle must be an object"]),
    (
        "cycle-grace-string",
        {"cycle": {"grace_period_s": "30"}},
        ['cycle.grace_period_s must be a number, not "30"'],
    ),
    (
        "cycle-grace-null",
        {"cycle": {"grace_period_s": None}},
        ["cycle.grace_period_s must be a number, not null"],
    ),
    ("cycle-count-fraction", {"cycle": {"max_victims": 8.5}}, ["cycle.max_victims must be a whole number"]),
    (
        "cycle-count-bool",
        {"cycle": {"max_candidates": True}},
        ["cycle.max_candidates must be a whole number"],
    ),
    ("cycle-flag-number", {"cycle": {"estimate_starts": 1}}, ["cycle.estimate_starts must be true or false"]),
    (
        "cycle-flag-string",
        {"cycle": {"estimate_starts": "no"}},
        ["cycle.estimate_starts must be true or false"],
    ),
    ("cycle-order-number", {"cycle": {"candidate_order": 1}}, ["cycle.candidate_order must be a string"]),
]


def with_name(data: Any) -> Any:
    return {"name": "bad", **data} if isinstance(data, dict) and "name" not in data else data


@pytest.mark.parametrize(("data", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_wrong_shape_is_a_value_error_naming_the_key(data: Any, expected: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        Profile.from_dict(with_name(data))
    for text in expected:
        assert text in str(error.value)


@pytest.mark.parametrize(("data", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_wrong_shape_file_is_refused_naming_the_file(
    data: Any, expected: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(with_name(data)), encoding="utf-8")
    with pytest.raises(ValueError) as error:
        load_profile(str(path))
    assert str(error.value).startswith(f"profile {path} is not valid: ")
    for text in expected:
        assert text in str(error.value)


def test_a_file_that_is_not_json_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x",', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"profile {path} is not valid JSON: Expecting"):
        load_profile(str(path))


def test_the_accepted_shapes_keep_their_meaning() -> None:
    """Whole numbers where the cycle takes any number, weights left out, null for a list (its
    default) and for backfill, and tuples from Python callers are all still valid."""
    profile = Profile.from_dict(
        {
            "name": "ok",
            "plugins": {
                "queue_sort": ("las", "fifo"),
                "admission": None,
                "score": [{"name": "binpack"}, {"name": "topology", "weight": 2}, "spread"],
                "backfill": None,
                "preemption": None,
            },
            "plugin_args": {"las": {"thresholds": [900, 3600.0], "starvation_factor": 0}},
            "cycle": {"grace_period_s": 30, "min_runtime_s": 0.5, "max_victims": 8, "estimate_starts": False},
        }
    )
    assert profile.queue_sort == ("las", "fifo")
    assert profile.admission == ("vc_quota",)
    assert profile.score == (("binpack", 1.0), ("topology", 2.0), ("spread", 1.0))
    assert profile.backfill is None
    assert profile.preemption == ()
    assert profile.cycle.grace_period_s == 30
    assert profile.cycle.max_victims == 8
    assert not profile.cycle.estimate_starts
    assert Profile.from_dict({"name": "defaults", "plugins": {"score": None}}).score == (
        ("topology", 1.0),
        ("binpack", 1.0),
    )


@pytest.mark.parametrize(
    "path",
    sorted([*PROFILES_DIR.glob("*.json"), *(REPO / "bench" / "data").glob("*.json")]),
    ids=lambda path: path.name,
)
def test_every_profile_in_the_repository_passes_the_check(path: Path) -> None:
    load_profile(str(path))

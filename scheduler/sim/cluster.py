"""Simulated clusters: `--cluster NxG` with a default topology, or a topology JSON file.

Default topology of a node with G GPUs (index order matches the physical layout, so
HiveD-style aligned blocks are also topology domains): NVLink groups of 4 GPUs (DGX-1
style hybrid cube-mesh halves), PCIe switches of 2, NUMA nodes of G/2, racks of 8 nodes.

Topology file (JSON):
    {"nodes": [{"name": "n0", "rack": "r0", "gpus": 8, "model": "V100",
                "nvlink_group_size": 4, "pcie_switch_size": 2, "numa_size": 4,
                "cpu_milli": 64000, "memory_mib": 524288, "count": 16}]}
Each entry describes `count` identical nodes (names get a numeric suffix when count > 1).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from scheduler.core.types import Gpu, Node, NodeName
from scheduler.sim.inputs import InputFileError

DEFAULT_MODEL = "gpu"
RACK_SIZE = 8


def parse_cluster_spec(spec: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)", spec.strip())
    if not match:
        raise ValueError(f"--cluster must look like 32x4 (nodes x GPUs per node), not {spec!r}")
    nodes, gpus = int(match.group(1)), int(match.group(2))
    if nodes <= 0 or gpus <= 0:
        raise ValueError("--cluster needs at least one node with at least one GPU")
    return nodes, gpus


def make_node(
    name: str,
    gpus: int,
    rack: str = "",
    model: str = DEFAULT_MODEL,
    nvlink_group_size: int = 4,
    pcie_switch_size: int = 2,
    numa_size: int | None = None,
    cpu_milli: int = 0,
    memory_mib: int = 0,
) -> Node:
    numa = numa_size or max(gpus // 2, 1)
    return Node(
        name=NodeName(name),
        rack=rack,
        gpus=tuple(
            Gpu(
                index=i,
                model=model,
                uuid=f"GPU-{name}-{i}",
                nvlink_group=i // max(nvlink_group_size, 1),
                pcie_switch=i // max(pcie_switch_size, 1),
                numa_node=i // numa,
            )
            for i in range(gpus)
        ),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
    )


def uniform_cluster(nodes: int, gpus: int, model: str = DEFAULT_MODEL) -> tuple[Node, ...]:
    width = len(str(nodes - 1))
    return tuple(
        make_node(f"node{i:0{width}d}", gpus, rack=f"rack{i // RACK_SIZE}", model=model) for i in range(nodes)
    )


def load_topology(path: str | Path) -> tuple[Node, ...]:
    """Raises `InputFileError` for a file that is not a topology file or has a bad entry."""
    try:
        with Path(path).open(encoding="utf-8") as f:
            data: Any = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputFileError(f"{path} is not a JSON file: {error}") from error
    entries = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputFileError(
            f'{path} is not a topology file: it needs {{"nodes": [...]}} with at least one entry'
        )
    nodes: list[Node] = []
    for position, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or "name" not in entry or "gpus" not in entry:
            raise InputFileError(f"{path}, node entry {position}: it needs at least a name and gpus")
        try:
            count = _whole(entry, "count", 1)
            gpus = _whole(entry, "gpus", 1)
            nvlink_group_size = _whole(entry, "nvlink_group_size", 0, default=4)
            pcie_switch_size = _whole(entry, "pcie_switch_size", 0, default=2)
            numa_size = _whole(entry, "numa_size", 0) if entry.get("numa_size") is not None else None
            cpu_milli = _whole(entry, "cpu_milli", 0, default=0)
            memory_mib = _whole(entry, "memory_mib", 0, default=0)
        except ValueError as error:
            raise InputFileError(f"{path}, node entry {position}: {error}") from error
        for k in range(count):
            name = str(entry["name"]) if count == 1 else f"{entry['name']}{k}"
            nodes.append(
                make_node(
                    name,
                    gpus,
                    rack=str(entry.get("rack", "")),
                    model=str(entry.get("model", DEFAULT_MODEL)),
                    nvlink_group_size=nvlink_group_size,
                    pcie_switch_size=pcie_switch_size,
                    numa_size=numa_size,
                    cpu_milli=cpu_milli,
                    memory_mib=memory_mib,
                )
            )
    return tuple(nodes)


def _whole(entry: dict[str, Any], key: str, least: int, default: int = 1) -> int:
    """A setting as `int()` reads it (as the file format always has), refused by name when it
    is not a number or below `least` rather than failing later in `make_node`."""
    value = entry.get(key, default)
    try:
        number: int | None = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < least:
        raise ValueError(f"{key} must be a whole number of {least} or more, not {value!r}")
    return number

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
    with Path(path).open(encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    nodes: list[Node] = []
    for entry in data["nodes"]:
        count = int(entry.get("count", 1))
        for k in range(count):
            name = str(entry["name"]) if count == 1 else f"{entry['name']}{k}"
            nodes.append(
                make_node(
                    name,
                    int(entry["gpus"]),
                    rack=str(entry.get("rack", "")),
                    model=str(entry.get("model", DEFAULT_MODEL)),
                    nvlink_group_size=int(entry.get("nvlink_group_size", 4)),
                    pcie_switch_size=int(entry.get("pcie_switch_size", 2)),
                    numa_size=entry.get("numa_size"),
                    cpu_milli=int(entry.get("cpu_milli", 0)),
                    memory_mib=int(entry.get("memory_mib", 0)),
                )
            )
    return tuple(nodes)

"""A simulated GPU host: a preset (dgx-a100, dgx1-v100) or a JSON/YAML host description.

Telemetry follows what the agent runs: an idle GPU reads near zero, a GPU with a busy
attempt reads high utilisation and power, memory comes from the attempt's request, a
suspended attempt holds memory without computing. Values are deterministic for a given
seed and sequence of calls.

Description file format (JSON or YAML)::

    cpu_count: 64
    memory_total_mib: 524288
    numa_nodes: 2
    gpus:                       # one entry per GPU, or use "count" to repeat an entry
      - {model: NVIDIA L40S, memory_total_mib: 46068, numa_node: 0, pcie_switch: sw0,
         nvlink_group: null, count: 4, tdp_w: 350, idle_w: 35}
    faults:                     # optional: Xids reported on the first sample
      - {gpu_index: 3, xid: 79}

or ``preset: dgx-a100`` to start from a preset.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, uuid5

import yaml
from pydantic import BaseModel, ConfigDict, Field

from agents.devices import GpuLoad
from agents.protocol import GpuInfo, GpuSample, GpuTopology, HostInfo

AMBIENT_C = 28.0


class SimulatedGpu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    memory_total_mib: int = Field(gt=0)
    numa_node: int = 0
    pcie_switch: str | None = None
    nvlink_group: str | None = None
    tdp_w: float = 300.0
    idle_w: float = 50.0
    count: int = Field(default=1, ge=1)


class SimulatedFault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_index: int = Field(ge=0)
    xid: int | None = None
    ecc_uncorrected: int = 0


class HostDescription(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_count: int = Field(ge=1)
    memory_total_mib: int = Field(gt=0)
    numa_nodes: int = Field(ge=1, default=1)
    driver_version: str = "550.54.15"
    gpus: list[SimulatedGpu]
    faults: list[SimulatedFault] = []

    def expanded_gpus(self) -> list[SimulatedGpu]:
        return [gpu.model_copy(update={"count": 1}) for gpu in self.gpus for _ in range(gpu.count)]


def dgx_a100() -> HostDescription:
    """8x A100 80 GB on NVSwitch (one NVLink group); 2 NUMA nodes with 2 PCIe switches each."""
    gpus = [
        SimulatedGpu(
            model="NVIDIA A100-SXM4-80GB",
            memory_total_mib=81920,
            numa_node=index // 4,
            pcie_switch=f"numa{index // 4}-pcie{(index // 2) % 2}",
            nvlink_group="nvswitch-0",
            tdp_w=400.0,
            idle_w=55.0,
        )
        for index in range(8)
    ]
    return HostDescription(cpu_count=256, memory_total_mib=2_097_152, numa_nodes=2, gpus=gpus)


def dgx1_v100() -> HostDescription:
    """8x V100 32 GB, hybrid cube-mesh NVLink modelled as two groups of 4; 2 PCIe switches per NUMA node."""
    gpus = [
        SimulatedGpu(
            model="Tesla V100-SXM2-32GB",
            memory_total_mib=32768,
            numa_node=index // 4,
            pcie_switch=f"numa{index // 4}-pcie{(index // 2) % 2}",
            nvlink_group=f"cube-mesh-{index // 4}",
            tdp_w=300.0,
            idle_w=40.0,
        )
        for index in range(8)
    ]
    return HostDescription(cpu_count=80, memory_total_mib=524_288, numa_nodes=2, gpus=gpus)


PRESETS = {"dgx-a100": dgx_a100, "dgx1-v100": dgx1_v100}


def load_description(name_or_path: str) -> HostDescription:
    """A preset name, or a JSON/YAML file (which may itself name a ``preset`` to extend)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]()
    text = Path(name_or_path).read_text()
    data: Any = json.loads(text) if name_or_path.endswith(".json") else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"host description {name_or_path} is not a mapping")
    preset = data.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
        data = {**PRESETS[preset]().model_dump(), **data}
    return HostDescription.model_validate(data)


class SimulatedBackend:
    """DeviceBackend over a host description; GPU uuids derive from the node name."""

    def __init__(self, description: HostDescription, node_name: str, seed: int = 0) -> None:
        self.description = description
        self.node_name = node_name
        self.gpus = description.expanded_gpus()
        self.uuids = [
            f"GPU-{uuid5(NAMESPACE_URL, f'gpuportal-sim:{node_name}:{index}')}"
            for index in range(len(self.gpus))
        ]
        self._random = random.Random(seed)
        self._energy_j = [0.0] * len(self.gpus)
        self._last_time: list[datetime | None] = [None] * len(self.gpus)
        self._pending_xids: dict[int, list[int]] = {}
        self._ecc_uncorrected = [0] * len(self.gpus)
        for fault in description.faults:
            self.inject_fault(fault.gpu_index, fault.xid, fault.ecc_uncorrected)

    def inject_fault(self, gpu_index: int, xid: int | None = None, ecc_uncorrected: int = 0) -> None:
        """Make the next sample of that GPU report an Xid and/or uncorrected ECC errors."""
        if xid is not None:
            self._pending_xids.setdefault(gpu_index, []).append(xid)
        self._ecc_uncorrected[gpu_index] += ecc_uncorrected

    def host_info(self) -> HostInfo:
        return HostInfo(
            hostname=self.node_name,
            cpu_count=self.description.cpu_count,
            memory_total_mib=self.description.memory_total_mib,
            numa_nodes=self.description.numa_nodes,
            simulated=True,
            driver_version=self.description.driver_version,
        )

    def inventory(self) -> list[GpuInfo]:
        inventory = []
        for index, gpu in enumerate(self.gpus):
            peers = [
                self.uuids[other_index]
                for other_index, other in enumerate(self.gpus)
                if other_index != index
                and gpu.nvlink_group is not None
                and other.nvlink_group == gpu.nvlink_group
            ]
            inventory.append(
                GpuInfo(
                    index=index,
                    uuid=self.uuids[index],
                    model=gpu.model,
                    memory_total_mib=gpu.memory_total_mib,
                    pci_bus_id=f"00000000:{0x10 + index * 0x10:02X}:00.0",
                    topology=GpuTopology(
                        numa_node=gpu.numa_node,
                        pcie_switch=gpu.pcie_switch,
                        nvlink_group=gpu.nvlink_group,
                        nvlink_peers=peers,
                    ),
                )
            )
        return inventory

    def sample(self, load: Mapping[str, Sequence[GpuLoad]], now: datetime) -> list[GpuSample]:
        return [
            self._sample_one(index, gpu, load.get(self.uuids[index], ()), now)
            for index, gpu in enumerate(self.gpus)
        ]

    def close(self) -> None:
        return None

    def _sample_one(
        self, index: int, gpu: SimulatedGpu, loads: Sequence[GpuLoad], now: datetime
    ) -> GpuSample:
        noise = self._random.gauss(0.0, 1.0)
        busy = any(item.busy for item in loads)
        utilization = min(100.0, max(60.0, 93.0 + 3.0 * noise)) if busy else 0.0
        memory_used = 0
        for item in loads:
            memory_used += item.gpu_memory_mib or int(gpu.memory_total_mib * 0.9 / len(loads))
        memory_used = min(memory_used, gpu.memory_total_mib)
        held_w = 15.0 if loads else 0.0  # memory held by a suspended attempt still costs a little
        power = gpu.idle_w + held_w + (gpu.tdp_w - gpu.idle_w - held_w) * utilization / 100.0 + abs(noise)
        temperature = AMBIENT_C + power * 0.11 + noise * 0.5
        last_time = self._last_time[index]
        if last_time is not None and now > last_time:
            self._energy_j[index] += power * (now - last_time).total_seconds()
        self._last_time[index] = now
        xids = self._pending_xids.pop(index, [])
        return GpuSample(
            gpu_uuid=self.uuids[index],
            time=now,
            utilization_pct=round(utilization, 1),
            memory_used_mib=memory_used,
            memory_total_mib=gpu.memory_total_mib,
            temperature_c=round(temperature, 1),
            power_w=round(power, 1),
            energy_j=round(self._energy_j[index], 1),
            ecc_corrected=0,
            ecc_uncorrected=self._ecc_uncorrected[index],
            xid_events=xids,
        )

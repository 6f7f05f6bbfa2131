"""NVML back-end (nvidia-ml-py, module ``pynvml``): inventory, topology and telemetry of real GPUs.

Topology: NVLink groups are the connected components of the NVLink graph (direct GPU
links and GPUs on the same NVSwitch fabric); GPUs share a PCIe switch when their common
ancestor is at most ``NVML_TOPOLOGY_MULTIPLE``. Xid events come from an NVML event set
that is drained, without blocking, at every sample.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import ModuleType
from typing import Any

from agents.devices import GpuLoad
from agents.protocol import GpuInfo, GpuProcess, GpuSample, GpuTopology, HostInfo

MIB = 1024 * 1024


class DeviceError(RuntimeError):
    """NVML is not usable on this host (no driver, no GPU)."""


class NvmlBackend:
    def __init__(
        self, hostname: str, cpu_count: int, memory_total_mib: int, nvml: ModuleType | None = None
    ) -> None:
        self.nvml: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as error:
            raise DeviceError(f"NVML is not available: {error}") from error
        self.hostname = hostname
        self.cpu_count = cpu_count
        self.memory_total_mib = memory_total_mib
        count = self.nvml.nvmlDeviceGetCount()
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        self.uuids = [_text(self.nvml.nvmlDeviceGetUUID(handle)) for handle in self.handles]
        self._inventory = self._read_inventory()
        self._events = self._register_xid_events()

    # -- DeviceBackend ---------------------------------------------------------

    def host_info(self) -> HostInfo:
        numa_nodes = {gpu.topology.numa_node for gpu in self._inventory if gpu.topology.numa_node is not None}
        return HostInfo(
            hostname=self.hostname,
            cpu_count=self.cpu_count,
            memory_total_mib=self.memory_total_mib,
            numa_nodes=max(1, len(numa_nodes)),
            driver_version=self._optional(self.nvml.nvmlSystemGetDriverVersion),
        )

    def inventory(self) -> list[GpuInfo]:
        return list(self._inventory)

    def sample(self, load: Mapping[str, Sequence[GpuLoad]], now: datetime) -> list[GpuSample]:
        xids = self._drain_xid_events()
        return [
            self._sample_one(index, handle, xids.get(index, []), now)
            for index, handle in enumerate(self.handles)
        ]

    def close(self) -> None:
        if self._events is not None:
            self.nvml.nvmlEventSetFree(self._events)
            self._events = None
        self.nvml.nvmlShutdown()

    # -- inventory -------------------------------------------------------------

    def _read_inventory(self) -> list[GpuInfo]:
        nvml = self.nvml
        bus_ids = [_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId) for handle in self.handles]
        nvlink = _UnionFind(len(self.handles))
        on_switch: list[int] = []
        peers: list[set[int]] = [set() for _ in self.handles]
        for index, handle in enumerate(self.handles):
            for link in range(nvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                        continue
                    if (
                        nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                        == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
                    ):
                        on_switch.append(index)
                        continue
                    remote = _bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                except nvml.NVMLError:
                    continue  # link absent or not supported
                if remote in bus_ids:
                    peer = bus_ids.index(remote)
                    nvlink.union(index, peer)
                    peers[index].add(peer)
        for index in on_switch:
            nvlink.union(index, on_switch[0])
            peers[index].update(other for other in on_switch if other != index)
        pcie = _UnionFind(len(self.handles))
        for first in range(len(self.handles)):
            for second in range(first + 1, len(self.handles)):
                level = self._optional(
                    nvml.nvmlDeviceGetTopologyCommonAncestor, self.handles[first], self.handles[second]
                )
                if level is not None and level <= nvml.NVML_TOPOLOGY_MULTIPLE:
                    pcie.union(first, second)
        inventory = []
        for index, handle in enumerate(self.handles):
            nvlink_members = nvlink.members(index)
            inventory.append(
                GpuInfo(
                    index=index,
                    uuid=self.uuids[index],
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB,
                    pci_bus_id=bus_ids[index],
                    topology=GpuTopology(
                        numa_node=self._optional(nvml.nvmlDeviceGetNumaNodeId, handle),
                        pcie_switch=f"pcie-{min(pcie.members(index))}",
                        nvlink_group=f"nvlink-{min(nvlink_members)}" if len(nvlink_members) > 1 else None,
                        nvlink_peers=[self.uuids[peer] for peer in sorted(peers[index])],
                    ),
                )
            )
        return inventory

    # -- telemetry -------------------------------------------------------------

    def _sample_one(self, index: int, handle: Any, xids: list[int], now: datetime) -> GpuSample:
        nvml = self.nvml
        uuid = self.uuids[index]
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
            energy_mj = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            processes = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            return GpuSample(
                gpu_uuid=uuid,
                time=now,
                utilization_pct=float(utilization.gpu) if utilization is not None else None,
                memory_used_mib=memory.used // MIB,
                memory_total_mib=memory.total // MIB,
                temperature_c=self._optional(
                    nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
                ),
                power_w=power_mw / 1000.0 if power_mw is not None else None,
                energy_j=energy_mj / 1000.0 if energy_mj is not None else None,
                ecc_corrected=self._ecc(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ecc_uncorrected=self._ecc(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                xid_events=xids,
                processes=[
                    GpuProcess(
                        pid=process.pid,
                        used_memory_mib=process.usedGpuMemory // MIB
                        if process.usedGpuMemory is not None
                        else None,
                    )
                    for process in processes
                ],
            )
        except nvml.NVMLError as error:
            return GpuSample(
                gpu_uuid=uuid, time=now, xid_events=xids, healthy=False, health_reason=f"nvml: {error}"
            )

    def _ecc(self, handle: Any, error_type: int) -> int | None:
        counter = self.nvml.NVML_VOLATILE_ECC
        count = self._optional(self.nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter)
        return int(count) if count is not None else None

    def _register_xid_events(self) -> Any:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return None
        for handle in self.handles:
            self._optional(nvml.nvmlDeviceRegisterEvents, handle, nvml.nvmlEventTypeXidCriticalError, events)
        return events

    def _drain_xid_events(self) -> dict[int, list[int]]:
        nvml = self.nvml
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        while True:
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError_Timeout:
                return found
            except nvml.NVMLError:
                return found  # reported through the per-GPU calls if the device is gone
            uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            if uuid in self.uuids:
                found.setdefault(self.uuids.index(uuid), []).append(int(event.eventData))

    def _optional(self, function: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML function whose absence on some GPUs is normal (None when not supported)."""
        try:
            return function(*args)
        except self.nvml.NVMLError_NotSupported:
            return None


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, item: int) -> int:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, first: int, second: int) -> None:
        self.parent[self.find(first)] = self.find(second)

    def members(self, item: int) -> list[int]:
        root = self.find(item)
        return [other for other in range(len(self.parent)) if self.find(other) == root]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bus_id(value: str | bytes) -> str:
    """Normalise a PCI bus id to NVML's form: 8-digit domain, upper case ("00000000:07:00.0")."""
    parts = _text(value).upper().split(":")
    if len(parts) != 3:
        return ":".join(parts)
    domain, bus, device_function = parts
    return f"{int(domain, 16):08X}:{bus}:{device_function}"

"""A stand-in for the ``pynvml`` module that checks every call against the real library.

Each ``nvml*`` attribute is looked up in the real pynvml first: a function the real
module does not have, or arguments its signature does not accept, fail the test. Device
functions must receive a handle that ``nvmlDeviceGetHandleByIndex`` issued after
``nvmlInit``, and constant arguments are checked against the real pynvml constants.
Constants and exception classes are the real ones, so ``NVMLError(value)`` maps to the
same subclasses as in production.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real

MIB = 1024 * 1024


@dataclass(frozen=True)
class FakeHandle:
    index: int


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total: int = 81920 * MIB
    memory_used: int = 0
    bus_id: str = "00000000:07:00.0"
    numa_node: int = 0
    links: list[tuple[str, str | None]] = field(
        default_factory=list
    )  # ("gpu", remote bus id) / ("switch", None)
    utilization: int = 0
    temperature: int = 30
    power_mw: int = 50_000
    energy_mj: int | None = 1_000_000
    ecc: tuple[int, int] = (0, 0)
    processes: list[tuple[int, int]] = field(default_factory=list)
    lost: bool = False  # every device call fails with NVML_ERROR_GPU_IS_LOST


class FakeNvml:
    def __init__(
        self, gpus: list[FakeGpu], pcie_groups: list[set[int]], driver_version: str = "550.54.15"
    ) -> None:
        self.gpus = gpus
        self.pcie_groups = pcie_groups
        self.driver_version = driver_version
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.initialized = False
        self.pending_events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.registered: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        real_attribute = getattr(real, name)  # AttributeError: the real library has no such name
        if not (
            name.startswith("nvml") and callable(real_attribute) and not isinstance(real_attribute, type)
        ):
            return real_attribute
        implementation = getattr(self, f"_{name}", None)
        if implementation is None:
            raise AssertionError(f"unexpected NVML call {name}")

        def call(*args: Any) -> Any:
            inspect.signature(real_attribute).bind(*args)  # TypeError when the real one would not accept them
            self.calls.append((name, args))
            if name != "nvmlInit":
                assert self.initialized, f"{name} called before nvmlInit"
            return implementation(*args)

        return call

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called_name, args in self.calls if called_name == name]

    def _gpu(self, handle: Any) -> FakeGpu:
        assert isinstance(handle, FakeHandle), f"expected a device handle, got {handle!r}"
        assert ("nvmlDeviceGetHandleByIndex", (handle.index,)) in self.calls, "handle was never issued"
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        return gpu

    # -- implementations, named _<real function name> ----------------------------

    def _nvmlInit(self) -> None:
        self.initialized = True

    def _nvmlShutdown(self) -> None:
        self.initialized = False

    def _nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def _nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        assert 0 <= index < len(self.gpus)
        return FakeHandle(index)

    def _nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self.gpus[handle.index].uuid  # works on a lost GPU too (cached by the driver)

    def _nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).name

    def _nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        return SimpleNamespace(
            total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used
        )

    def _nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=self._gpu(handle).bus_id.encode())

    def _nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._gpu(handle).numa_node

    def _link(self, handle: Any, link: int) -> tuple[str, str | None]:
        gpu = self._gpu(handle)
        assert 0 <= link < real.NVML_NVLINK_MAX_LINKS
        if link >= len(gpu.links):
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.links[link]

    def _nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._link(handle, link)
        return real.NVML_FEATURE_ENABLED

    def _nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        kind, _ = self._link(handle, link)
        return real.NVML_NVLINK_DEVICE_TYPE_SWITCH if kind == "switch" else real.NVML_NVLINK_DEVICE_TYPE_GPU

    def _nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        kind, remote = self._link(handle, link)
        assert kind == "gpu", "remote PCI info asked for a switch link"
        return SimpleNamespace(busId=remote.encode() if remote else b"")

    def _nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any) -> int:
        self._gpu(first), self._gpu(second)
        same = any(first.index in group and second.index in group for group in self.pcie_groups)
        return real.NVML_TOPOLOGY_MULTIPLE if same else real.NVML_TOPOLOGY_SYSTEM

    def _nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=self._gpu(handle).utilization, memory=0)

    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == real.NVML_TEMPERATURE_GPU
        return self._gpu(handle).temperature

    def _nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle).power_mw

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.energy_mj is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.energy_mj

    def _nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        assert error_type in (real.NVML_MEMORY_ERROR_TYPE_CORRECTED, real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        assert counter_type == real.NVML_VOLATILE_ECC
        corrected, uncorrected = self._gpu(handle).ecc
        return corrected if error_type == real.NVML_MEMORY_ERROR_TYPE_CORRECTED else uncorrected

    def _nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._gpu(handle).processes]

    def _nvmlEventSetCreate(self) -> str:
        return "event-set"

    def _nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        assert event_types == real.nvmlEventTypeXidCriticalError
        assert event_set == "event-set"
        self.registered.add(self._gpu(handle) and handle.index)

    def _nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        assert event_set == "event-set" and timeout_ms == 0, "the agent must never block on NVML events"
        if not self.pending_events:
            raise real.NVMLError(real.NVML_ERROR_TIMEOUT)
        index, xid = self.pending_events.pop(0)
        return SimpleNamespace(
            device=FakeHandle(index), eventType=real.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def _nvmlEventSetFree(self, event_set: Any) -> None:
        assert event_set == "event-set"

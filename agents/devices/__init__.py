"""GPU device back-ends: where the inventory and the telemetry come from.

Two back-ends implement :class:`DeviceBackend`: NVML (real GPUs, through nvidia-ml-py)
and a simulated host (a preset such as dgx-a100 or a JSON/YAML description), whose
telemetry follows what the agent actually runs on each GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from agents.protocol import GpuInfo, GpuSample, HostInfo


@dataclass(frozen=True)
class GpuLoad:
    """One attempt's use of one GPU, as the agent knows it (drives simulated telemetry)."""

    attempt_id: str
    busy: bool  # False while suspended: memory held, no compute
    gpu_memory_mib: int | None = None


class DeviceBackend(Protocol):
    """Contract: ``inventory`` is stable for the life of the agent (a changed device set means
    a new registration); ``sample`` never raises for one bad GPU, it reports that GPU as
    unhealthy instead, so one failing device cannot hide the others."""

    def host_info(self) -> HostInfo: ...

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self, load: Mapping[str, Sequence[GpuLoad]], now: datetime) -> list[GpuSample]: ...

    def close(self) -> None: ...


__all__ = ["DeviceBackend", "GpuLoad"]

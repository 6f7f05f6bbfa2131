"""Device back-ends: NVML through a call-checking fake (and for real where a GPU exists), simulated hosts."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pynvml
import pytest
from fake_pynvml import MIB, FakeGpu, FakeNvml

from agents.devices import GpuLoad
from agents.devices.health import HealthTracker
from agents.devices.nvml import DeviceError, NvmlBackend
from agents.devices.simulated import SimulatedBackend, load_description

T0 = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def four_gpu_host() -> FakeNvml:
    """GPUs 0-1 share a PCIe switch and an NVLink bridge; GPUs 2-3 sit on an NVSwitch."""
    gpus = [
        FakeGpu(uuid="GPU-0", bus_id="00000000:07:00.0", links=[("gpu", "0000:0B:00.0")]),
        FakeGpu(uuid="GPU-1", bus_id="00000000:0B:00.0", links=[("gpu", "00000000:07:00.0")]),
        FakeGpu(
            uuid="GPU-2", bus_id="00000000:47:00.0", numa_node=1, links=[("switch", None), ("switch", None)]
        ),
        FakeGpu(uuid="GPU-3", bus_id="00000000:4E:00.0", numa_node=1, links=[("switch", None)]),
    ]
    return FakeNvml(gpus, pcie_groups=[{0, 1}])


def test_nvml_inventory_and_topology() -> None:
    fake = four_gpu_host()
    backend = NvmlBackend("node-a", cpu_count=64, memory_total_mib=1024, nvml=fake)
    inventory = backend.inventory()
    assert [gpu.uuid for gpu in inventory] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert inventory[0].memory_total_mib == 81920
    assert inventory[0].pci_bus_id == "00000000:07:00.0"
    assert inventory[0].topology.nvlink_peers == ["GPU-1"]  # short domain form normalised before matching
    assert inventory[0].topology.nvlink_group == inventory[1].topology.nvlink_group == "nvlink-0"
    assert inventory[2].topology.nvlink_group == inventory[3].topology.nvlink_group == "nvlink-2"
    assert inventory[2].topology.nvlink_peers == ["GPU-3"]
    assert (
        inventory[0].topology.pcie_switch
        == inventory[1].topology.pcie_switch
        != inventory[2].topology.pcie_switch
    )
    assert inventory[3].topology.numa_node == 1
    assert backend.host_info().numa_nodes == 2
    assert backend.host_info().driver_version == "550.54.15"
    # Handles by index, exactly once each; NVLink probed per link until the device says unsupported.
    assert fake.called("nvmlDeviceGetHandleByIndex") == [(0,), (1,), (2,), (3,)]
    assert Counter(args[0].index for args in fake.called("nvmlDeviceGetNvLinkState")) == {
        index: pynvml.NVML_NVLINK_MAX_LINKS for index in range(4)
    }
    assert len(fake.called("nvmlDeviceGetTopologyCommonAncestor")) == 6  # every pair once
    assert fake.registered == {0, 1, 2, 3}


def test_nvml_sample_converts_units_and_reads_every_metric() -> None:
    fake = four_gpu_host()
    fake.gpus[1] = FakeGpu(
        uuid="GPU-1",
        bus_id="00000000:0B:00.0",
        memory_used=40960 * MIB,
        utilization=97,
        temperature=66,
        power_mw=351_500,
        energy_mj=1_234_567_250,
        ecc=(3, 0),
        processes=[(4242, 40960 * MIB)],
    )
    fake.gpus[2].energy_mj = None  # older GPUs have no energy counter
    backend = NvmlBackend("node-a", cpu_count=64, memory_total_mib=1024, nvml=fake)
    samples = backend.sample({}, T0)
    busy = samples[1]
    assert (busy.utilization_pct, busy.memory_used_mib, busy.memory_total_mib) == (97.0, 40960, 81920)
    assert (busy.temperature_c, busy.power_w, busy.energy_j) == (66, 351.5, 1_234_567.25)
    assert (busy.ecc_corrected, busy.ecc_uncorrected) == (3, 0)
    assert [(process.pid, process.used_memory_mib) for process in busy.processes] == [(4242, 40960)]
    assert samples[2].energy_j is None and samples[2].healthy
    assert fake.called("nvmlDeviceGetTemperature")[0][1:] == (pynvml.NVML_TEMPERATURE_GPU,)
    assert {args[1:] for args in fake.called("nvmlDeviceGetTotalEccErrors")} == {
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    }


def test_nvml_reports_xid_events_on_the_right_gpu_and_a_lost_gpu_as_unhealthy() -> None:
    fake = four_gpu_host()
    backend = NvmlBackend("node-a", cpu_count=64, memory_total_mib=1024, nvml=fake)
    fake.pending_events = [(3, 79), (0, 13)]
    fake.gpus[2].lost = True
    tracker = HealthTracker()
    samples = [tracker.assess(sample) for sample in backend.sample({}, T0)]
    assert samples[3].xid_events == [79] and not samples[3].healthy
    assert "fallen off the bus" in samples[3].health_reason
    assert samples[0].xid_events == [13] and samples[0].healthy  # an application Xid is not a GPU fault
    assert not samples[2].healthy and samples[2].health_reason.startswith("nvml: ")
    later = [tracker.assess(sample) for sample in backend.sample({}, T0 + timedelta(seconds=5))]
    assert later[3].xid_events == [] and not later[3].healthy  # stays unhealthy
    backend.close()
    assert fake.called("nvmlEventSetFree") and fake.called("nvmlShutdown")


def test_nvml_on_a_real_gpu() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        pytest.skip(f"no NVIDIA driver or GPU on this machine: {error}")
    pynvml.nvmlShutdown()
    backend = NvmlBackend("real", cpu_count=1, memory_total_mib=1)
    assert backend.inventory()
    assert all(sample.memory_total_mib for sample in backend.sample({}, datetime.now(UTC)))
    backend.close()


def test_nvml_unavailable_is_a_clear_error() -> None:
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    except pynvml.NVMLError:
        pass
    with pytest.raises(DeviceError, match="NVML is not available"):
        NvmlBackend("node", cpu_count=1, memory_total_mib=1)


@pytest.mark.parametrize(
    ("preset", "model", "memory", "groups"),
    [("dgx-a100", "NVIDIA A100-SXM4-80GB", 81920, 1), ("dgx1-v100", "Tesla V100-SXM2-32GB", 32768, 2)],
)
def test_simulated_presets(preset: str, model: str, memory: int, groups: int) -> None:
    inventory = SimulatedBackend(load_description(preset), "node-a").inventory()
    assert len(inventory) == 8
    assert {gpu.model for gpu in inventory} == {model}
    assert {gpu.memory_total_mib for gpu in inventory} == {memory}
    assert len({gpu.topology.nvlink_group for gpu in inventory}) == groups
    assert len({gpu.topology.numa_node for gpu in inventory}) == 2
    switches_per_numa = Counter(
        numa for numa, _ in {(gpu.topology.numa_node, gpu.topology.pcie_switch) for gpu in inventory}
    )
    assert switches_per_numa == {0: 2, 1: 2}
    assert all(len(gpu.topology.nvlink_peers) == 8 // groups - 1 for gpu in inventory)


def test_simulated_uuids_differ_between_nodes_and_are_stable() -> None:
    first = SimulatedBackend(load_description("dgx-a100"), "node-a").inventory()
    again = SimulatedBackend(load_description("dgx-a100"), "node-a").inventory()
    other = SimulatedBackend(load_description("dgx-a100"), "node-b").inventory()
    assert first == again
    assert not {gpu.uuid for gpu in first} & {gpu.uuid for gpu in other}


def test_simulated_host_from_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "host.yaml"
    path.write_text(
        "cpu_count: 32\nmemory_total_mib: 262144\ngpus:\n"
        "  - {model: NVIDIA L40S, memory_total_mib: 46068, pcie_switch: sw0, count: 2}\n"
        "  - {model: NVIDIA L40S, memory_total_mib: 46068, pcie_switch: sw1}\n"
        "faults:\n  - {gpu_index: 2, xid: 48}\n"
    )
    backend = SimulatedBackend(load_description(str(path)), "node-c")
    assert [gpu.topology.pcie_switch for gpu in backend.inventory()] == ["sw0", "sw0", "sw1"]
    tracker = HealthTracker()
    samples = [tracker.assess(sample) for sample in backend.sample({}, T0)]
    assert samples[2].xid_events == [48] and not samples[2].healthy


def test_simulated_telemetry_follows_what_runs_and_is_deterministic() -> None:
    def run(seed: int) -> list:
        backend = SimulatedBackend(load_description("dgx-a100"), "node-a", seed=seed)
        uuids = [gpu.uuid for gpu in backend.inventory()]
        load = {
            uuids[0]: [GpuLoad("att-1", busy=True, gpu_memory_mib=30000)],
            uuids[1]: [GpuLoad("att-1", busy=True)],
            uuids[2]: [GpuLoad("att-2", busy=False, gpu_memory_mib=1000)],
        }
        return [backend.sample(load, T0 + timedelta(seconds=5 * step)) for step in range(3)]

    history = run(seed=7)
    assert history == run(seed=7)
    first, _, last = history
    busy, busy_default_memory, suspended, idle = last[0], last[1], last[2], last[3]
    assert busy.utilization_pct >= 60 and idle.utilization_pct == 0 and suspended.utilization_pct == 0
    assert busy.power_w > suspended.power_w > idle.power_w
    assert busy.temperature_c > idle.temperature_c
    assert (busy.memory_used_mib, suspended.memory_used_mib, idle.memory_used_mib) == (30000, 1000, 0)
    assert busy_default_memory.memory_used_mib == int(81920 * 0.9)
    assert first[0].energy_j == 0 and last[0].energy_j > last[3].energy_j > 0

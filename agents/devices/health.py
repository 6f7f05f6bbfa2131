"""GPU health: which Xid and ECC events make a GPU unhealthy, from a table.

An unhealthy GPU stays unhealthy for the life of the agent: the conditions below need a
GPU reset or a node reboot (which restarts the agent) to clear. Xids caused by the
application itself (13 graphics exception, 31 MMU fault, 43 stopped by the app, ...)
are reported in telemetry but do not mark the GPU unhealthy.
"""

from __future__ import annotations

from agents.protocol import GpuSample

# Xid -> why it takes the GPU out of service (NVIDIA Xid catalog; resolution RESET_GPU,
# drain or CONTACT_SUPPORT).
UNHEALTHY_XIDS: dict[int, str] = {
    8: "GPU stopped processing",
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    63: "row remapping or page retirement pending",
    64: "row remapping or page retirement failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
}

# Xids whose recovery needs the node rebooted, not just the GPU reset: the portal drains the
# node, moving its other jobs away before the reboot.
NODE_LEVEL_XIDS: frozenset[int] = frozenset({79})


class HealthTracker:
    """Remembers, per GPU uuid, the first reason it became unhealthy."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}

    def assess(self, sample: GpuSample) -> GpuSample:
        """Return the sample with ``healthy``/``health_reason`` set from its events and history."""
        reasons = [sample.health_reason] if sample.health_reason else []
        reasons += [f"xid {xid}: {UNHEALTHY_XIDS[xid]}" for xid in sample.xid_events if xid in UNHEALTHY_XIDS]
        if sample.ecc_uncorrected:
            reasons.append(f"ecc uncorrected errors: {sample.ecc_uncorrected}")
        if reasons and sample.gpu_uuid not in self.reasons:
            self.reasons[sample.gpu_uuid] = "; ".join(reasons)
        reason = self.reasons.get(sample.gpu_uuid)
        return replace_health(sample, reason)

    def reason(self, gpu_uuid: str) -> str | None:
        return self.reasons.get(gpu_uuid)


def replace_health(sample: GpuSample, reason: str | None) -> GpuSample:
    return sample.model_copy(update={"healthy": reason is None, "health_reason": reason})


__all__ = ["NODE_LEVEL_XIDS", "UNHEALTHY_XIDS", "HealthTracker", "replace_health"]

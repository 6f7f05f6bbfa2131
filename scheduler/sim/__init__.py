"""Trace-driven simulator around the pure core: `python -m scheduler.sim --help`."""

from scheduler.sim.engine import RuntimeHistory, SimResult, Simulator, gang_shape
from scheduler.sim.metrics import summarize
from scheduler.sim.trace import Trace, TraceJob, load_trace

__all__ = [
    "RuntimeHistory",
    "SimResult",
    "Simulator",
    "Trace",
    "TraceJob",
    "gang_shape",
    "load_trace",
    "summarize",
]

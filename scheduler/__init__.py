"""Scheduling: the pure core (scheduler.core) and the trace simulator (scheduler.sim)."""

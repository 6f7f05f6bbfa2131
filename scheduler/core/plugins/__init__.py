"""Plugins, one module per policy family; registered by name in scheduler.core.registry."""

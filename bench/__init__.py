"""Benchmarks that print figures (never timed tests): python -m bench.NAME --json."""

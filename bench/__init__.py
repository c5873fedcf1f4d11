"""Benchmarks: scripts run from the repository (`.venv/bin/python bench/NAME.py`); the tests
that share an evaluation with one import it as `docqa.bench.NAME` (not shipped in the wheel)."""

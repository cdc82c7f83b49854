"""Benchmarks of the harness itself: scripts and packages run by hand (``python -m benchmarks.side_by_side``),
never imported by ``helpers``."""

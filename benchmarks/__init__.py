"""Benchmark sections run by scripts/bench.py; each module exposes run(workdir, quick) -> dict."""

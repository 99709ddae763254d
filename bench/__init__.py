"""fastrl benchmarks: `python -m bench` (CLI) or `pytest bench/ --benchmark-only`. See docs/bench.md."""

"""Benchmarks that back docs/BENCHMARKS.md, by area, over one harness (bench/harness/). Run each from the
repository root as a module: `python -m bench.AREA.SCRIPT --help`."""

"""GPUOS benchmark suite (not tests).

Each ``bench_*.py`` script runs as ``python benchmarks/bench_<name>.py`` and writes
``benchmarks/results/<name>.json`` in the format described in BENCH_SCHEMA.md.
Shared helpers live in :mod:`benchmarks._common`.
"""

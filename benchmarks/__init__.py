"""GPUOS benchmark suite (not tests).

``python -m benchmarks`` (= ``python benchmarks/run_all.py``) runs every workload (W1..W6) against every
applicable peer and writes ``benchmarks/results/<name>.json`` (BENCH_SCHEMA.md), first_call.json and PNG
plots; ``python benchmarks/report.py`` regenerates README's results block from them. Each ``bench_*.py``
also runs alone. The shared machinery is the package :mod:`benchmarks.harness`.
"""

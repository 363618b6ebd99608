"""Imported by a benchmark run as a script (``python benchmarks/bench_reduce.py``): puts the repository root
on sys.path so ``from benchmarks import harness`` works. Every script in benchmarks/ starts with

    if __package__ in (None, ""):  # run as a script: make the repo root importable
        import _rootpath  # noqa: F401
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

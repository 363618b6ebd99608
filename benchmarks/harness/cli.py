"""Command-line pieces the standalone benchmarks share: list parsing, --capacity, --configs and the options
every one of them has (reps / warm-up, configs, watchdog, result file, plain tables).

Imports nothing from the harness.
"""
from __future__ import annotations

import argparse
from typing import Sequence


def parse_int_list(values: Sequence[str]) -> list:
    """Parse ``--sizes 256 1024`` or ``--sizes 256,1024`` into [256, 1024]."""
    out = []
    for v in values:
        for part in str(v).replace(";", ",").split(","):
            part = part.strip()
            if part:
                out.append(int(part))
    return out


def parse_shapes(values: Sequence[str]) -> list:
    """Parse ``8x256 32x128`` (or ``8x256,32x128``; ``*`` for ``x``) into [(8, 256), (32, 128)]; ValueError
    names a bad one."""
    out = []
    for v in values:
        for part in str(v).replace(";", ",").split(","):
            part = part.strip().lower()
            if not part:
                continue
            dims = part.replace("*", "x").split("x")
            if len(dims) != 2:
                raise ValueError(f"shape {part!r}: expected ROWSxCOLS, e.g. 8x256")
            r, c = int(dims[0]), int(dims[1])
            if r <= 0 or c <= 0:
                raise ValueError(f"shape {part!r}: dims must be positive")
            out.append((r, c))
    return out


def shape_str(shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def pow2_at_least(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


def parse_capacity(arg, need: int, error) -> "int | None":
    """--capacity: 'auto' (a power of two >= need and >= 4096), 'default' (None: the runtime default) or an int.
    `error` is argparse's parser.error."""
    cap = str(arg).strip().lower()
    if cap == "auto":
        return max(4096, pow2_at_least(need))
    if cap == "default":
        return None
    try:
        return int(cap)
    except ValueError:
        error("--capacity must be 'auto', 'default' or an integer")


def select_configs(values, choices, error) -> list:
    """--configs values (space- or comma-separated) validated against `choices`; all of them when None."""
    if not values:
        return list(choices)
    picked = [c.strip() for v in values for c in v.split(",") if c.strip()]
    bad = [c for c in picked if c not in choices]
    if bad:
        error(f"unknown config(s) {bad}; choose from {list(choices)}")
    return picked


def new_parser(doc: str) -> argparse.ArgumentParser:
    """A standalone benchmark's parser: the first paragraph of its docstring, the rest kept as written."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_reps_args(p: argparse.ArgumentParser, reps: int, quick_reps: int, warmup: int) -> None:
    """--reps (None until resolved: ``reps``, or ``quick_reps`` with --quick) and --warmup."""
    p.add_argument("--reps", type=int, default=None,
                   help=f"timed reps per config (default {reps}; --quick {quick_reps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"warm-up reps per config (default {warmup})")


def add_configs_arg(p: argparse.ArgumentParser, configs: Sequence[str], default: Sequence[str]) -> None:
    p.add_argument("--configs", nargs="+", default=None,
                   help=f"subset of {' '.join(configs)} (default: {' '.join(default)})")


def add_watchdog_arg(p: argparse.ArgumentParser, seconds: float) -> None:
    p.add_argument("--watchdog", type=float, default=seconds,
                   help=f"hard limit in s (default {seconds:g}; 0 = off): dump stacks and exit if the run hangs")


def add_output_args(p: argparse.ArgumentParser, name: str) -> None:
    """--out (the result file) and --plain (no rich tables)."""
    p.add_argument("--out", default=None, help=f"result file (default benchmarks/results/{name}.json)")
    p.add_argument("--plain", action="store_true", help="plain-text tables even if rich is installed")

"""Printing: numbers and ratios, tables (rich when importable, aligned plain text otherwise), the header and
the timing and goal tables of the standalone benchmarks.

Imports: rows.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Optional, Sequence

from .rows import find_row, ratio, row_median


def fmt_num(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.1f}"
        if abs(x) >= 100:
            return f"{x:.1f}"
        return f"{x:.{nd}f}"
    return str(x)


def fmt_ratio(x: Optional[float]) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.2f}x" if x < 100 else f"{x:.0f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: Optional[str] = None,
                plain: bool = False, align: Optional[str] = None) -> None:
    """Print a table: rich if importable (and not ``plain``), else aligned plain text.

    ``align``: one letter per column, "l" or "r" (default: first column left, the rest right).
    Non-string cells are formatted with ``fmt_num``.
    """
    cells = [[c if isinstance(c, str) else fmt_num(c) for c in r] for r in rows]
    align = (align or ("l" + "r" * (len(headers) - 1))).ljust(len(headers), "r")
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
            table = Table(title=title)
            for i, h in enumerate(headers):
                table.add_column(h, justify="left" if align[i] == "l" else "right")
            for r in cells:
                table.add_row(*r)
            Console().print(table)
            return
        except ImportError:
            pass
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(vals):
        return "  ".join(v.ljust(widths[i]) if align[i] == "l" else v.rjust(widths[i])
                         for i, v in enumerate(vals)).rstrip()

    if title:
        print(f"\n{title}")
    print(line(list(headers)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(line(r))
    sys.stdout.flush()


def print_header(title: str, meta: dict) -> None:
    """A blank line, then ``title: device  driver  torch  gpuos  date`` (the report of a standalone benchmark)."""
    print()
    print(f"{title}: {meta['device']}  driver {meta['driver']}  torch {meta['torch']}  gpuos {meta['gpuos']}  "
          f"{meta['date']}")


SPEEDUP_HEADERS = ["median ms", "min ms", "max ms", "us/op", "host ms", "vs eager", "vs cudagraph", "correct"]


def speedup_table(rows: Sequence[dict], sizes: Sequence[Any], configs: Sequence[str], err_len: int = 60,
                  baseline: Optional[dict] = None, mark: str = "") -> list:
    """Cells of a batch benchmark's timing table (columns: size, config, then SPEEDUP_HEADERS): per size and
    config, the times, the speedup over the config's baseline (``baseline[config]``, default eager; ``mark``
    follows the ratio of any other baseline) and over cudagraph ("-" for another baseline), correct. Error
    rows show their first ``err_len`` characters; value rows are left out."""
    baseline = baseline or {}
    table = []
    for size in sizes:
        for cfg in configs:
            row = find_row(rows, cfg, size)
            if row is None or "unit" in row:
                continue
            if "error" in row:
                table.append([str(size), cfg, "-", "-", "-", "-", "-", "-", "-", "ERROR: " + row["error"][:err_len]])
                continue
            med = row["median_ms"]
            base = baseline.get(cfg, "eager")
            other = base != "eager"
            table.append([str(size), cfg, med, row["min_ms"], row["max_ms"], row.get("us_per_op"),
                          row.get("host_median_ms"),
                          fmt_ratio(ratio(row_median(find_row(rows, base, size)), med)) + (mark if other else ""),
                          "-" if other else fmt_ratio(ratio(row_median(find_row(rows, "cudagraph", size)), med)),
                          "yes" if row.get("correct") else "NO"])
    return table

"""Rows in the BENCH_SCHEMA.md shape (timing, value, error, not-applicable rows) and lookups on lists of rows.

Imports nothing from the harness (a Timing is only read: median_ms, min_ms, max_ms, reps, gpu_ms, ...).
"""
from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from .timing import Timing


def rnd(x: Optional[float], nd: int = 4) -> Optional[float]:
    """A row value: rounded to ``nd`` decimals (integers stay integers: counts); None for None, NaN and
    infinities."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return x if isinstance(x, int) else round(float(x), nd)


def format_exc(exc: BaseException, limit: int = 500) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def is_gpuos_config(config: str) -> bool:
    return config.startswith("gpuos")


def timing_row(workload: str, size: Optional[int], config: str, timing: "Timing",
               correct: Optional[bool], **extra: Any) -> dict:
    row = {"workload": workload}
    if size is not None:
        row["size"] = size
    row.update({"config": config, "median_ms": rnd(timing.median_ms), "min_ms": rnd(timing.min_ms),
                "max_ms": rnd(timing.max_ms), "reps": timing.reps, "correct": correct})
    if timing.gpu_ms:
        row["median_gpu_ms"] = rnd(timing.gpu_median_ms)
    row.update(extra)
    return row


def per_op_fields(timing: "Timing", ops: int) -> dict:
    """``us_per_op`` (median over ``ops`` ops per rep) and ``host_median_ms`` of a timing row."""
    return {"us_per_op": rnd(timing.median_ms * 1e3 / ops), "host_median_ms": rnd(timing.host_median_ms)}


def value_row(workload: str, config: str, value: float, unit: str, size: Optional[int] = None,
              **extra: Any) -> dict:
    row = {"workload": workload}
    if size is not None:
        row["size"] = size
    row.update({"config": config, "value": rnd(value), "unit": unit})
    row.update(extra)
    return row


def per_op_us_row(workload: str, config: str, samples_ms: Sequence[float], ops: int, spread: bool = True,
                  **fields: Any) -> dict:
    """Value row of a host-only loop timed per rep (``samples_ms``): median us per op, then ``count`` and (with
    ``spread``) min_us / max_us after ``fields``."""
    us = statistics.median(samples_ms) * 1e3 / ops
    if spread:
        fields.update(count=ops, min_us=rnd(min(samples_ms) * 1e3 / ops), max_us=rnd(max(samples_ms) * 1e3 / ops))
    else:
        fields.update(count=ops)
    return value_row(workload, config, us, "us", **fields)


def spread_us(samples_s: Sequence[float]) -> dict:
    """min / p90 / max of samples in seconds, as microsecond row fields."""
    s = sorted(samples_s)
    return {"min_us": rnd(s[0] * 1e6), "p90_us": rnd(s[int(0.9 * (len(s) - 1))] * 1e6), "max_us": rnd(s[-1] * 1e6)}


def error_row(workload: str, size: Optional[int], config: str, error: Any, **extra: Any) -> dict:
    row = {"workload": workload}
    if size is not None:
        row["size"] = size
    row["config"] = config
    row["error"] = format_exc(error) if isinstance(error, BaseException) else str(error)
    row.update(extra)
    return row


def not_applicable_row(workload: str, config: str, reason: str) -> dict:
    """A peer that cannot run this workload at all (listed, never skipped silently)."""
    return {"workload": workload, "config": config, "error": f"not applicable: {reason}", "not_applicable": True}


def find_row(rows: Iterable[dict], config: str, size: Optional[int] = None,
             workload: Optional[str] = None) -> Optional[dict]:
    for row in rows:
        if row.get("config") != config:
            continue
        if size is not None and row.get("size") != size:
            continue
        if workload is not None and row.get("workload") != workload:
            continue
        return row
    return None


def row_median(row: Optional[dict]) -> Optional[float]:
    """median_ms of a timing row that ran (no error), else None."""
    if not row or "error" in row:
        return None
    v = row.get("median_ms")
    return v if isinstance(v, (int, float)) and v > 0 else None


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    """num / den, or None when either is missing or den is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return num / den


def incorrect(row: Optional[dict]) -> bool:
    """A row whose correctness check failed."""
    return row is not None and row.get("correct") is False


def sweep(run, cases: Iterable[tuple], rows: list, workload: str, label, config: str = "gpuos_worker",
          after=None) -> None:
    """run(*case) for every case of a micro-benchmark grid; a case that raises becomes an error row named
    label(*case) (never an aborted run); after() (e.g. release_memory) follows every case."""
    for case in cases:
        try:
            run(*case)
        except Exception as e:  # noqa: BLE001 -- a row that says why
            rows.append({"workload": workload, "size": label(*case), "config": config, "error": format_exc(e)})
        if after is not None:
            after()


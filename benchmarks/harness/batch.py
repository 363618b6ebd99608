"""Check-then-time for the batch benchmarks (W1 bench_microbatch, W3 bench_reduce): ``count`` independent ops
per repetition, their outputs poisoned with NaN, one run compared with torch chunk by chunk, then the reps;
every configuration becomes a row.

Imports: timing, rows, gpuos_rt.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

from .gpuos_rt import add_stats_delta, gpuos_stats
from .rows import error_row, format_exc, per_op_fields, timing_row
from .timing import cuda_sync, time_reps, try_sync


def poison(outs) -> None:
    """Fill every output with NaN, so a configuration that skips one cannot pass its check."""
    for o in outs:
        o.fill_(float("nan"))


def check_batch(outs: Optional[Sequence[Any]], n: int, expected: Callable[[int, int], Any], tol: Optional[dict] = None,
                chunk: int = 1000, errors: tuple = (AssertionError,)) -> tuple:
    """(True, None) when ``outs`` holds ``n`` outputs and, chunk by chunk, torch.stack(outs[i:j]) matches
    ``expected(i, j)`` (assert_close with ``tol``); else (False, why: the first failing chunk's ops)."""
    import torch
    if outs is None or len(outs) != n:
        return False, f"expected {n} outputs, got {None if outs is None else len(outs)}"
    for i in range(0, n, chunk):
        exp = expected(i, min(n, i + chunk))
        try:
            got = torch.stack(list(outs[i:i + chunk]))
            torch.testing.assert_close(got, exp, **(tol or {}))
        except errors as exc:
            msg = " ".join(str(exc).split())
            return False, f"ops {i}..{min(n, i + chunk) - 1}: {msg[:400]}"
    return True, None


def run_checked(fn: Callable[[], Any], outs: Optional[Sequence[Any]], check: Callable[[Any], tuple]) -> tuple:
    """Poison ``outs`` (if given), run ``fn`` once between two syncs, then ``check(outs)`` (or check what fn
    returned). Returns (correct, why, run ms)."""
    if outs is not None:
        poison(outs)
    cuda_sync()
    t0 = time.perf_counter()
    res = fn()
    cuda_sync()
    ms = (time.perf_counter() - t0) * 1e3
    ok, why = check(outs if outs is not None else res)
    return ok, why, ms


def check_then_time(fn: Callable[[], Any], outs: Optional[Sequence[Any]], check: Callable[[Any], tuple],
                    plan: Callable[[float, float], tuple]) -> tuple:
    """One configuration: run_checked, then ``plan(check_s, run_s)`` -> (reps, warmup, note) with the wall time
    of the whole check (poison, run, compare) and of the run alone, then time_reps(fn). Returns
    (timing, correct, why, note)."""
    t0 = time.perf_counter()
    correct, why, run_ms = run_checked(fn, outs, check)
    reps, warmup, note = plan(time.perf_counter() - t0, run_ms / 1e3)
    timing = time_reps(fn, reps=reps, warmup=warmup)
    return timing, correct, why, note


def bench_config(rows: list, workload: str, size: Any, config: str, setup: Callable[[], tuple],
                 check: Callable[[Any, dict], tuple], plan: Callable[[float, float], tuple], count: int,
                 log: Callable[[str], None], label: str, error_fields: dict, lead: Optional[dict] = None,
                 stats_mod: Any = None, on_error: Optional[Callable[[BaseException], None]] = None) -> None:
    """Measure one configuration of a batch benchmark and append its row to ``rows`` (an error row if anything
    raises: logged, then ``on_error(exc)``).

    ``setup()`` -> (fn, outs or None, fields, after or None): ``fn`` is one rep of ``count`` ops; ``check(got,
    fields)`` compares its outputs (check_then_time with ``plan``); the row is timing_row(..., **lead,
    us_per_op, host_median_ms, **fields), then reps_note, correct_detail and, with ``stats_mod`` (the gpuos
    module), stats_delta; ``after(timing)`` runs once the row is in (e.g. value rows of the host loop).
    ``label`` starts the log lines ("n=256", "8x256")."""
    st0 = gpuos_stats(stats_mod) if stats_mod is not None else None
    try:
        fn, outs, fields, after = setup()
        timing, correct, detail, note = check_then_time(fn, outs, lambda got: check(got, fields), plan)
    except Exception as exc:
        rows.append(error_row(workload, size, config, exc, **error_fields))
        log(f"{label} {config}: ERROR {format_exc(exc, 300)}")
        try_sync()
        if on_error is not None:
            on_error(exc)
        return
    row = timing_row(workload, size, config, timing, correct, **(lead or {}), **per_op_fields(timing, count), **fields)
    if note:
        row["reps_note"] = note
    if detail:
        row["correct_detail"] = detail
    add_stats_delta(row, st0, stats_mod)
    rows.append(row)
    if after is not None:
        after(timing)
    log(f"{label} {config:<20} median {timing.median_ms:9.3f} ms  (min {timing.min_ms:.3f}, max {timing.max_ms:.3f}, "
        f"host {timing.host_median_ms:.3f}, reps {timing.reps}) correct={correct}")

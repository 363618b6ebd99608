#!/usr/bin/env python
"""W1 micro-batch benchmark: many independent small fp32 adds (issue acceptance item 4).

    python benchmarks/bench_microbatch.py                 # full run (10,000 adds, 20 reps, 4 sizes)
    python benchmarks/bench_microbatch.py --quick         # smoke test (1,000 adds, 5 reps)
    python benchmarks/bench_microbatch.py --sizes 256 --reps 50 --configs eager gpuos_submit_many

For every size n (default 256, 1024, 4096, 16384) it pre-allocates ``count`` separate input pairs
(torch.randn) and outputs, then compares:

    eager              c = a + b                          (new output tensor each op)
    eager_out          torch.add(a, b, out=c)
    foreach            torch._foreach_add(list_a, list_b) (out of place: allocates the outputs)
    cudagraph          the count torch.add(out=) captured into one torch.cuda.CUDAGraph; replay timed
    gpuos_submit       python loop of gpuos_ext.submit_add(a, b, c); gpuos_ext.flush(sync=True)
    gpuos_submit_many  gpuos_ext.submit_many("add", A, B, C); gpuos_ext.flush(sync=True)
    gpuos_scheduler    the eager loop inside gpuos.scheduler_context()       (--configs; the suite runs it)
    compile            torch.compile(lambda a, b: a + b) called per pair      (suite only: child process)

The standalone default is the first six; ``python -m benchmarks`` (W1) runs all of them, and lists
compile_reduce_overhead as not applicable (each per-op replay would overwrite the previous result).

Every config is checked first (outputs poisoned with NaN, one run, assert_close vs a + b) and the
row carries "correct". Each timed rep: perf_counter around the work followed by
torch.cuda.synchronize() (gpuos configs: flush(sync=True) is part of the work, then the synchronize).
Rows also carry "host_median_ms" (time until the work returned, before the trailing synchronize).

Value rows: roundtrip_us, eager_roundtrip_us, gpu_ns_per_subop, submit_host_us (per size),
submit_many_host_us (per size). Rows carry median_gpu_ms (CUDA events around the work).
Results: benchmarks/results/microbatch.json (BENCH_SCHEMA.md).
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

if __package__ in (None, ""):  # run as a script: python benchmarks/bench_microbatch.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import _common as C
else:  # python -m benchmarks.bench_microbatch / import
    from . import _common as C

NAME = "microbatch"
WORKLOAD = "W1"
TILE_ELEMS = 4096  # API_SPEC: a tensor of n elements uses ceil(n / 4096) descriptor ring slots
DEFAULT_SIZES = [256, 1024, 4096, 16384]
CONFIGS = ["eager", "eager_out", "foreach", "cudagraph", "gpuos_submit", "gpuos_submit_many", "gpuos_scheduler"]
DEFAULT_CONFIGS = CONFIGS[:6]
GPUOS_CONFIGS = ("gpuos_submit", "gpuos_submit_many")
ROUNDTRIP_ELEMS = 256
SUBOP_ELEMS = 256
SUBOP_CAPACITY = 131072
TITLE = "microbatch (10,000 independent fp32 adds)"
IN_PROCESS_SHARE = 0.55  # of W1's suite budget; the compile child gets the rest
NOT_APPLICABLE = {
    "compile_reduce_overhead": "per-op reduce-overhead replays one CUDA graph whose output buffer the next of the "
                               "10,000 calls overwrites (cudagraph trees); `cudagraph` measures one graph of the "
                               "whole batch instead",
}

# goals (issue acceptance item 4)
GOAL_SUBMIT_VS_EAGER = 25.0      # gpuos_submit >= 25x faster than eager at n=256
GOAL_MANY_VS_GRAPH = 3.0         # gpuos_submit_many >= 3x faster than cudagraph
GOAL_ROUNDTRIP_US = 6.0          # one-sub-op round trip <= 6 us
GOAL_NS_PER_SUBOP = 20.0         # <= 20 ns GPU time per 256-element sub-op


def log(msg: str) -> None:
    print(f"[{NAME}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------
# correctness
# --------------------------------------------------------------------------------------------------
def poison(outs) -> None:
    for c in outs:
        c.fill_(float("nan"))


def check_add(outs, A, B, chunk: int = 1000):
    """(True, None) when outs[i] == A[i] + B[i] for all i (assert_close), else (False, why)."""
    import torch
    if outs is None or len(outs) != len(A):
        return False, f"expected {len(A)} outputs, got {None if outs is None else len(outs)}"
    for i in range(0, len(A), chunk):
        got = torch.stack(list(outs[i:i + chunk]))
        exp = torch.stack(A[i:i + chunk]) + torch.stack(B[i:i + chunk])
        try:
            torch.testing.assert_close(got, exp)
        except AssertionError as exc:
            msg = " ".join(str(exc).split())
            return False, f"ops {i}..{i + len(got) - 1}: {msg[:400]}"
    return True, None


def run_and_check(fn, A, B, outs=None):
    """Poison ``outs`` (if given), run fn once, check outs (or what fn returned) against A + B."""
    import torch
    if outs is not None:
        poison(outs)
    torch.cuda.synchronize()
    res = fn()
    torch.cuda.synchronize()
    return check_add(outs if outs is not None else res, A, B)


# --------------------------------------------------------------------------------------------------
# gpuos helpers
# --------------------------------------------------------------------------------------------------
def pow2_at_least(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


# --------------------------------------------------------------------------------------------------
# per-size configs
# --------------------------------------------------------------------------------------------------
def capture_graph(A, B, Cout):
    import torch

    def adds():
        for a, b, c in zip(A, B, Cout):
            torch.add(a, b, out=c)
    g, _, ms = C.capture_cuda_graph(adds, adds)
    return g, ms


def run_size(n, args, mod, mod_err, rows, value_rows, ctx: "C.RunContext | None" = None):
    """All configs of args.configs at size n. ``ctx`` (the suite's): its budget turns late configs into
    error rows and trims the reps of slow ones; its gpuos package runs gpuos_scheduler."""
    import torch

    count, reps, warmup = args.count, args.reps, args.warmup
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(1234 + n)
    t0 = time.perf_counter()
    A = [torch.randn(n, device=dev) for _ in range(count)]
    B = [torch.randn(n, device=dev) for _ in range(count)]
    Cout = [torch.empty(n, device=dev) for _ in range(count)]
    torch.cuda.synchronize()
    log(f"n={n}: allocated {3 * count} tensors of {n} fp32 in {time.perf_counter() - t0:.1f} s")

    def bench(config, setup):
        """setup() -> (fn, outs_or_None, extra_fields, after_timing_hook_or_None)."""
        if config not in args.configs:
            return
        if ctx is not None:
            ctx.advance(f"{WORKLOAD} {n} {config}")
        if (config in GPUOS_CONFIGS and mod is None) or (config == "gpuos_scheduler" and (ctx is None or
                                                                                         ctx.gpuos is None)):
            why = mod_err if config in GPUOS_CONFIGS else (ctx.gpuos_err if ctx else "needs the suite's context")
            rows.append(C.error_row(WORKLOAD, n, config, f"gpuos unavailable: {why}", count=count))
            log(f"n={n} {config}: ERROR gpuos unavailable")
            return
        if ctx is not None and ctx.budget.expired():
            rows.append(C.error_row(WORKLOAD, n, config, C.budget_error(ctx), count=count))
            return
        st0 = C.gpuos_stats(mod) if (config in GPUOS_CONFIGS and mod is not None) else None
        try:
            fn, outs, extra, after = setup()
            t0 = time.perf_counter()
            correct, detail = run_and_check(fn, A, B, outs)
            n_reps, n_warm, note = reps, warmup, None
            if ctx is not None:  # the check (one call + compare) bounds one rep from above
                n_reps, n_warm, note = C.plan_reps(time.perf_counter() - t0, reps, warmup, ctx.share_s(),
                                                   ctx.min_reps)
            timing = C.time_reps(fn, reps=n_reps, warmup=n_warm)
        except Exception as exc:
            rows.append(C.error_row(WORKLOAD, n, config, exc, count=count))
            log(f"n={n} {config}: ERROR {C.format_exc(exc, 300)}")
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            return
        row = C.timing_row(WORKLOAD, n, config, timing, correct,
                           count=count,
                           us_per_op=C._r(timing.median_ms * 1e3 / count),
                           host_median_ms=C._r(timing.host_median_ms),
                           **(extra or {}))
        if detail:
            row["correct_detail"] = detail
        if note:
            row["reps_note"] = note
        if st0 is not None:
            d = C.stats_delta(st0, C.gpuos_stats(mod))
            if d is not None:
                row["stats_delta"] = d
        rows.append(row)
        if after is not None:
            after(timing)
        log(f"n={n} {config:<18} median {timing.median_ms:9.3f} ms  (min {timing.min_ms:.3f}, "
            f"max {timing.max_ms:.3f}, host {timing.host_median_ms:.3f}) correct={correct}")

    # eager: c = a + b, a new output per op
    def setup_eager():
        def fn():
            return [a + b for a, b in zip(A, B)]
        return fn, None, None, None

    # eager_out: torch.add(a, b, out=c)
    def setup_eager_out():
        add = torch.add

        def fn():
            for a, b, c in zip(A, B, Cout):
                add(a, b, out=c)
        return fn, Cout, None, None

    # foreach: out-of-place torch._foreach_add (allocates the outputs)
    def setup_foreach():
        fadd = torch._foreach_add

        def fn():
            return fadd(A, B)
        return fn, None, None, None

    # cudagraph: replay of one graph holding all the torch.add(out=) calls
    graph_holder = []

    def setup_cudagraph():
        g, capture_ms = capture_graph(A, B, Cout)
        graph_holder.append(g)
        return g.replay, Cout, {"capture_ms": C._r(capture_ms, 2)}, None

    # gpuos_submit: python loop of submit_add, then flush(sync=True)
    def setup_gpuos_submit():
        submit, flush = mod.submit_add, mod.flush
        loop_ms = []

        def fn():
            t = time.perf_counter()
            for a, b, c in zip(A, B, Cout):
                submit(a, b, c)
            loop_ms.append((time.perf_counter() - t) * 1e3)
            flush(sync=True)

        def after(timing):
            samples = loop_ms[-timing.reps:]
            if samples:
                us = statistics.median(samples) * 1e3 / count
                value_rows.append(C.value_row(WORKLOAD, "submit_host_us", us, "us", size=n, count=count,
                                              min_us=C._r(min(samples) * 1e3 / count),
                                              max_us=C._r(max(samples) * 1e3 / count)))
                log(f"n={n} submit_host_us = {us:.3f} us per submit_add (host only)")
        return fn, Cout, None, after

    # gpuos_submit_many: one submit_many call, then flush(sync=True)
    def setup_gpuos_submit_many():
        submit_many, flush = mod.submit_many, mod.flush
        call_ms = []

        def fn():
            t = time.perf_counter()
            submit_many("add", A, B, Cout)
            call_ms.append((time.perf_counter() - t) * 1e3)
            flush(sync=True)

        def after(timing):
            samples = call_ms[-timing.reps:]
            if samples:
                us = statistics.median(samples) * 1e3 / count
                value_rows.append(C.value_row(WORKLOAD, "submit_many_host_us", us, "us", size=n,
                                              count=count))
                log(f"n={n} submit_many_host_us = {us:.4f} us per sub-op (host only)")
        return fn, Cout, None, after

    # gpuos_scheduler: the eager loop inside one scheduler_context (flushed at exit)
    def setup_gpuos_scheduler():
        def fn():
            with ctx.scheduler():
                return [a + b for a, b in zip(A, B)]
        return fn, None, None, None

    bench("eager", setup_eager)
    bench("eager_out", setup_eager_out)
    bench("foreach", setup_foreach)
    bench("cudagraph", setup_cudagraph)
    graph_holder.clear()
    bench("gpuos_submit", setup_gpuos_submit)
    bench("gpuos_submit_many", setup_gpuos_submit_many)
    bench("gpuos_scheduler", setup_gpuos_scheduler)

    del A, B, Cout
    gc.collect()
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:
        pass


# --------------------------------------------------------------------------------------------------
# value figures
# --------------------------------------------------------------------------------------------------
def measure_roundtrips(args, mod, mod_err, value_rows):
    import torch
    iters = args.roundtrip_iters
    warm = max(50, iters // 10)
    a = torch.randn(ROUNDTRIP_ELEMS, device="cuda")
    b = torch.randn(ROUNDTRIP_ELEMS, device="cuda")
    c = torch.empty(ROUNDTRIP_ELEMS, device="cuda")
    exp = a + b
    torch.cuda.synchronize()

    def summarize_us(samples):
        s = sorted(samples)
        return {"min_us": C._r(s[0] * 1e6), "p90_us": C._r(s[int(0.9 * (len(s) - 1))] * 1e6),
                "max_us": C._r(s[-1] * 1e6)}

    # eager: a + b then torch.cuda.synchronize()
    try:
        sync = torch.cuda.synchronize
        for _ in range(warm):
            d = a + b
            sync()
        gc.collect()
        gc.disable()
        samples = []
        try:
            for _ in range(iters):
                t0 = time.perf_counter()
                d = a + b
                sync()
                samples.append(time.perf_counter() - t0)
        finally:
            gc.enable()
        del d
        us = statistics.median(samples) * 1e6
        value_rows.append(C.value_row(WORKLOAD, "eager_roundtrip_us", us, "us", elements=ROUNDTRIP_ELEMS,
                                      iters=iters, **summarize_us(samples)))
        log(f"eager_roundtrip_us = {us:.2f} us")
    except Exception as exc:
        value_rows.append(C.error_row(WORKLOAD, None, "eager_roundtrip_us", exc))
        log(f"eager_roundtrip_us: ERROR {C.format_exc(exc, 300)}")

    # gpuos: submit_add of one 256-element op + flush(sync=True)
    if mod is None:
        value_rows.append(C.error_row(WORKLOAD, None, "roundtrip_us", f"gpuos unavailable: {mod_err}"))
        return
    try:
        submit, flush = mod.submit_add, mod.flush
        for _ in range(warm):
            submit(a, b, c)
            flush(sync=True)
        c.fill_(float("nan"))
        submit(a, b, c)
        flush(sync=True)
        try:
            torch.testing.assert_close(c, exp)
            correct, detail = True, None
        except AssertionError as exc:
            correct, detail = False, " ".join(str(exc).split())[:400]
        gc.collect()
        gc.disable()
        samples = []
        try:
            for _ in range(iters):
                t0 = time.perf_counter()
                submit(a, b, c)
                flush(sync=True)
                samples.append(time.perf_counter() - t0)
        finally:
            gc.enable()
        us = statistics.median(samples) * 1e6
        row = C.value_row(WORKLOAD, "roundtrip_us", us, "us", elements=ROUNDTRIP_ELEMS, iters=iters,
                          correct=correct, **summarize_us(samples))
        if detail:
            row["correct_detail"] = detail
        value_rows.append(row)
        log(f"roundtrip_us = {us:.2f} us (correct={correct})")
    except Exception as exc:
        value_rows.append(C.error_row(WORKLOAD, None, "roundtrip_us", exc))
        log(f"roundtrip_us: ERROR {C.format_exc(exc, 300)}")
    finally:
        try:
            torch.cuda.synchronize()
        except Exception:
            pass


def measure_ns_per_subop(args, mod, mod_err, value_rows):
    """GPU time per 256-element sub-op from one flush of ``batch`` sub-ops (median of ``reps``)."""
    import torch
    if mod is None:
        value_rows.append(C.error_row(WORKLOAD, None, "gpu_ns_per_subop", f"gpuos unavailable: {mod_err}"))
        return
    batch, reps = args.subop_batch, args.subop_reps
    capacity = max(SUBOP_CAPACITY, pow2_at_least(batch))
    A = B = Cout = None
    try:
        C.gpuos_reinit(mod, capacity)
        torch.manual_seed(99)
        t0 = time.perf_counter()
        A = [torch.randn(SUBOP_ELEMS, device="cuda") for _ in range(batch)]
        B = [torch.randn(SUBOP_ELEMS, device="cuda") for _ in range(batch)]
        Cout = [torch.empty(SUBOP_ELEMS, device="cuda") for _ in range(batch)]
        torch.cuda.synchronize()
        log(f"gpu_ns_per_subop: allocated {3 * batch} tensors in {time.perf_counter() - t0:.1f} s; "
            f"capacity={capacity}")
        times_ms, flush_host_ms = [], []
        correct, detail = None, None
        for i in range(1 + reps):  # first pass = warm-up + correctness check
            if i == 0:
                poison(Cout)
            mod.submit_many("add", A, B, Cout)
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            th = time.perf_counter()
            mod.flush(sync=False)
            th = time.perf_counter() - th
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            torch.cuda.synchronize()
            if i == 0:
                correct, detail = check_add(Cout, A, B)
            else:
                times_ms.append(ms)
                flush_host_ms.append(th * 1e3)
        ns = statistics.median(times_ms) * 1e6 / batch
        row = C.value_row(WORKLOAD, "gpu_ns_per_subop", ns, "ns", elements=SUBOP_ELEMS, batch=batch,
                          reps=reps, correct=correct,
                          min_ns=C._r(min(times_ms) * 1e6 / batch), max_ns=C._r(max(times_ms) * 1e6 / batch),
                          batch_median_ms=C._r(statistics.median(times_ms)),
                          flush_host_median_ms=C._r(statistics.median(flush_host_ms)))
        if detail:
            row["correct_detail"] = detail
        value_rows.append(row)
        log(f"gpu_ns_per_subop = {ns:.2f} ns (batch {batch}, median of {reps}; correct={correct})")
    except Exception as exc:
        value_rows.append(C.error_row(WORKLOAD, None, "gpu_ns_per_subop", exc, batch=batch))
        log(f"gpu_ns_per_subop: ERROR {C.format_exc(exc, 300)}")
    finally:
        del A, B, Cout
        gc.collect()
        try:
            mod.shutdown()
        except Exception:
            pass
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------------
# the suite's W1 (python -m benchmarks) and its torch.compile child
# --------------------------------------------------------------------------------------------------
def suite_params(quick: bool) -> dict:
    return {"sizes": [256, 4096] if quick else list(DEFAULT_SIZES), "count": 1000 if quick else 10000,
            "roundtrip_iters": 500 if quick else 2000, "subop_batch": 20000 if quick else 100000, "subop_reps": 5,
            "dtype": "float32"}


FIGURES = ("roundtrip_us", "gpu_ns_per_subop")  # value figures of the submit API, measured when it is wanted


def _wants_figures(ctx: "C.RunContext") -> bool:
    return any(ctx.wants(c) for c in GPUOS_CONFIGS)


def suite_units(params: dict, ctx: "C.RunContext") -> int:
    per_size = sum(ctx.wants(c) for c in CONFIGS) + ctx.wants("compile")
    return len(params["sizes"]) * per_size + len(FIGURES) * _wants_figures(ctx)


def run_workload(ctx: "C.RunContext", params: dict, save) -> list:
    """W1 in the suite: every size with every in-process config, the value figures, then the compile child."""
    rows = [C.not_applicable_row(WORKLOAD, c, why) for c, why in NOT_APPLICABLE.items() if ctx.wants(c)]
    value_rows: list = []
    args = SimpleNamespace(count=params["count"], reps=ctx.reps, warmup=ctx.warmup,
                           configs=[c for c in CONFIGS if ctx.wants(c)], roundtrip_iters=params["roundtrip_iters"],
                           subop_batch=params["subop_batch"], subop_reps=params["subop_reps"])
    capacity = max(4096, pow2_at_least(args.count * max(math.ceil(n / TILE_ELEMS) for n in params["sizes"])))
    ctx.capacity = capacity  # gpuos_scheduler flushes by itself only every capacity / 8 ops
    mod, mod_err = C.import_gpuos()
    if mod is not None:
        try:
            C.gpuos_reinit(mod, capacity)
        except Exception as exc:
            mod, mod_err = None, f"init failed: {C.format_exc(exc, 300)}"
    whole = ctx.budget
    ctx.budget = whole.part(whole.remaining() * IN_PROCESS_SHARE)
    ctx.units_left = len(params["sizes"]) * len(args.configs) + len(FIGURES) * _wants_figures(ctx)
    try:
        for n in params["sizes"] if args.configs else []:
            try:
                run_size(n, args, mod, mod_err, rows, value_rows, ctx)
            except Exception as exc:  # e.g. the allocation of this size failed: its configs become error rows
                log(f"n={n}: ERROR {C.format_exc(exc, 300)}")
                rows += [C.error_row(WORKLOAD, n, c, exc) for c in args.configs if C.find_row(rows, c, n) is None]
            save(rows + value_rows)
        for figure, measure in zip(FIGURES, (measure_roundtrips, measure_ns_per_subop)) if _wants_figures(ctx) else []:
            if ctx.budget.expired():
                value_rows.append(C.error_row(WORKLOAD, None, figure, C.budget_error(ctx)))
            else:
                try:
                    measure(args, mod, mod_err, value_rows)
                except Exception as exc:  # never lose the workload's other rows
                    value_rows.append(C.error_row(WORKLOAD, None, figure, exc))
            ctx.advance(f"{WORKLOAD} {figure}")
    finally:
        ctx.budget = whole
    if ctx.wants("compile"):
        rows += C.child_rows(ctx, WORKLOAD, "bench_microbatch", params, [(n, "compile") for n in params["sizes"]])
    return rows + value_rows


def _add(a, b):
    return a + b


def compile_child(ctx: "C.RunContext", params: dict, emit) -> None:
    """Child process: ``torch.compile(a + b)`` called once per pair, the way a user would compile one op."""
    import torch
    count = params["count"]

    def make_case(n: int) -> "C.Case":
        torch.manual_seed(1234 + n)
        A = [torch.randn(n, device=ctx.device) for _ in range(count)]
        B = [torch.randn(n, device=ctx.device) for _ in range(count)]
        return C.Case(size=n, ref=torch.stack(A) + torch.stack(B), tol={}, data=(A, B), ops_per_rep=count,
                      extra={"count": count, "per_op": True})

    def prepare(case: "C.Case", compiled, mode: str) -> "C.Prepared":
        A, B = case.data

        def fn():
            return [compiled(a, b) for a, b in zip(A, B)]
        return C.Prepared(fn, check=lambda: torch.stack(fn()))
    C.compile_sweep(ctx, WORKLOAD, params["sizes"], make_case, _add, prepare, emit, modes=C.COMPILE_MODES[:1])


# --------------------------------------------------------------------------------------------------
# goals + report
# --------------------------------------------------------------------------------------------------
def evaluate_goals(rows, sizes):
    goals = []

    def add(goal, target, achieved, passed, note=""):
        # passed None = could not be measured: recorded as a miss, the note says why
        goals.append({"goal": goal, "target": target, "achieved": C._r(achieved) if achieved is not None else None,
                      "pass": bool(passed), "note": note})

    # 1. gpuos_submit >= 25x eager at n = 256
    e = C.find_row(rows, "eager", 256)
    s = C.find_row(rows, "gpuos_submit", 256)
    r = C.ratio(C.row_median(e), C.row_median(s))
    if r is None:
        add("gpuos_submit vs eager, n=256 (x faster)", f">= {GOAL_SUBMIT_VS_EAGER:g}x", None, None,
            "no data" + ("" if 256 in sizes else " (n=256 not run)"))
    else:
        ok = r >= GOAL_SUBMIT_VS_EAGER and not C.incorrect(s)
        add("gpuos_submit vs eager, n=256 (x faster)", f">= {GOAL_SUBMIT_VS_EAGER:g}x", r, ok,
            "results incorrect" if C.incorrect(s) else "")

    # 2. gpuos_submit_many >= 3x faster than cudagraph (each size; n=256 is the headline)
    for n in sizes:
        g = C.find_row(rows, "cudagraph", n)
        m = C.find_row(rows, "gpuos_submit_many", n)
        r = C.ratio(C.row_median(g), C.row_median(m))
        name = f"gpuos_submit_many vs cudagraph, n={n} (x faster)"
        if r is None:
            add(name, f">= {GOAL_MANY_VS_GRAPH:g}x", None, None, "no data")
        else:
            ok = r >= GOAL_MANY_VS_GRAPH and not C.incorrect(m)
            add(name, f">= {GOAL_MANY_VS_GRAPH:g}x", r, ok, "results incorrect" if C.incorrect(m) else "")

    # 3. round trip <= 6 us
    rt = C.find_row(rows, "roundtrip_us")
    if rt is None or "error" in rt:
        add("roundtrip_us (submit_add + flush(sync=True), 256 el.)", f"<= {GOAL_ROUNDTRIP_US:g} us", None, None,
            "no data" if rt is None else rt["error"][:80])
    else:
        ok = rt["value"] <= GOAL_ROUNDTRIP_US and not C.incorrect(rt)
        add("roundtrip_us (submit_add + flush(sync=True), 256 el.)", f"<= {GOAL_ROUNDTRIP_US:g} us",
            rt["value"], ok, "results incorrect" if C.incorrect(rt) else "")

    # 4. <= 20 ns per sub-op
    ns = C.find_row(rows, "gpu_ns_per_subop")
    if ns is None or "error" in ns:
        add("gpu_ns_per_subop (256 el., one batch)", f"<= {GOAL_NS_PER_SUBOP:g} ns", None, None,
            "no data" if ns is None else ns["error"][:80])
    else:
        ok = ns["value"] <= GOAL_NS_PER_SUBOP and not C.incorrect(ns)
        add("gpu_ns_per_subop (256 el., one batch)", f"<= {GOAL_NS_PER_SUBOP:g} ns", ns["value"], ok,
            "results incorrect" if C.incorrect(ns) else "")
    return goals


def print_report(meta, rows, goals, sizes, args, out_path):
    print()
    print(f"GPUOS micro-batch benchmark (W1): {meta['device']}  driver {meta['driver']}  "
          f"torch {meta['torch']}  gpuos {meta['gpuos']}  {meta['date']}")
    print(f"{args.count} independent fp32 adds per rep, {args.reps} reps (+{args.warmup} warm-up); "
          f"time = host perf_counter around work + torch.cuda.synchronize()")
    headers = ["size", "config", "median ms", "min ms", "max ms", "us/op", "host ms",
               "vs eager", "vs cudagraph", "correct"]
    table = []
    for n in sizes:
        eager_ms = C.row_median(C.find_row(rows, "eager", n))
        graph_ms = C.row_median(C.find_row(rows, "cudagraph", n))
        for cfg in CONFIGS:
            row = C.find_row(rows, cfg, n)
            if row is None:
                continue
            if "error" in row:
                table.append([str(n), cfg, "-", "-", "-", "-", "-", "-", "-", "ERROR: " + row["error"][:60]])
                continue
            med = row["median_ms"]
            table.append([str(n), cfg, med, row["min_ms"], row["max_ms"], row.get("us_per_op"),
                          row.get("host_median_ms"),
                          C.fmt_ratio(C.ratio(eager_ms, med)), C.fmt_ratio(C.ratio(graph_ms, med)),
                          "yes" if row.get("correct") else "NO"])
    C.print_table(headers, table, title="Timings (speedup = baseline median / config median)",
                  plain=args.plain, align="rlrrrrrrrl")

    # value rows, and error rows of value figures (those carry no size)
    vals = [r for r in rows if "unit" in r or ("error" in r and "size" not in r)]
    if vals:
        vt = []
        for r in vals:
            if "error" in r:
                vt.append([r["config"], str(r.get("size", "-")), "-", "-", "ERROR: " + r["error"][:60]])
            else:
                note = "" if r.get("correct", True) else "INCORRECT"
                vt.append([r["config"], str(r.get("size", r.get("elements", "-"))), r["value"], r["unit"], note])
        C.print_table(["figure", "size", "value", "unit", "note"], vt, title="Figures", plain=args.plain, align="lrrll")

    gt = []
    for g in goals:
        res = "PASS" if g["pass"] else "MISS"  # no data counts as a miss (note says why)
        ach = g["achieved"]
        if ach is None:
            ach_s = "-"
        elif "x" in g["target"]:
            ach_s = C.fmt_ratio(ach)
        else:
            ach_s = f"{ach:.2f}"
        gt.append([g["goal"], g["target"], ach_s, res + (f" ({g['note']})" if g["note"] else "")])
    C.print_table(["goal", "target", "achieved", "result"], gt, title="Goals", plain=args.plain, align="lrrl")
    print(f"\nresults written to {out_path}")


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=None,
                   help="element counts per tensor (default 256 1024 4096 16384; commas allowed)")
    p.add_argument("--reps", type=int, default=None, help="timed reps per config (default 20; --quick 5)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up reps per config (default 3)")
    p.add_argument("--count", type=int, default=None, help="independent adds per rep (default 10000; --quick 1000)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: count 1000, reps 5, 500 round trips; writes microbatch_quick.json")
    p.add_argument("--configs", nargs="+", default=None,
                   help=f"subset of {' '.join(CONFIGS)} (default: {' '.join(DEFAULT_CONFIGS)})")
    p.add_argument("--capacity", default="auto",
                   help="gpuos ring capacity for the timed configs: 'auto' (default: enough slots for one "
                        "batch of count ops at the largest size, power of two, >= 4096), 'default' "
                        "(runtime default, no argument), or an integer")
    p.add_argument("--roundtrip-iters", type=int, default=None, help="round trips timed (default 2000; --quick 500)")
    p.add_argument("--subop-batch", type=int, default=100000, help="sub-ops in the gpu_ns_per_subop batch")
    p.add_argument("--subop-reps", type=int, default=5, help="batches timed for gpu_ns_per_subop (median)")
    p.add_argument("--no-roundtrip", action="store_true", help="skip roundtrip_us / eager_roundtrip_us")
    p.add_argument("--no-subop", action="store_true", help="skip gpu_ns_per_subop")
    p.add_argument("--out", default=None, help="result file (default benchmarks/results/microbatch.json)")
    p.add_argument("--plain", action="store_true", help="plain-text tables even if rich is installed")
    args = p.parse_args(argv)

    args.sizes = C.parse_int_list(args.sizes) if args.sizes else list(DEFAULT_SIZES)
    if args.count is None:
        args.count = 1000 if args.quick else 10000
    if args.reps is None:
        args.reps = 5 if args.quick else 20
    if args.roundtrip_iters is None:
        args.roundtrip_iters = 500 if args.quick else 2000
    args.configs = C.select_configs(args.configs or DEFAULT_CONFIGS, CONFIGS, p.error)
    if min(args.sizes) <= 0 or args.count <= 0 or args.reps <= 0 or args.subop_batch <= 0:
        p.error("sizes, --count, --reps and --subop-batch must be positive")
    args.capacity_value = C.parse_capacity(args.capacity, args.count * max(math.ceil(n / TILE_ELEMS) for n in args.sizes), p.error)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    C.require_cuda(NAME)  # exits 0 with a message when there is no GPU
    faulthandler.enable()
    import torch

    out_path = Path(args.out) if args.out else C.RESULTS_DIR / (f"{NAME}_quick.json" if args.quick else f"{NAME}.json")
    meta = C.env_metadata(NAME)
    params = {"count": args.count, "reps": args.reps, "warmup": args.warmup, "sizes": args.sizes,
              "dtype": "float32", "configs": args.configs, "quick": args.quick,
              "gpuos_capacity": args.capacity_value if args.capacity_value is not None else "default",
              "roundtrip_iters": args.roundtrip_iters, "subop_batch": args.subop_batch,
              "subop_reps": args.subop_reps, "cuda": torch.version.cuda}
    log(f"{meta['device']} | driver {meta['driver']} | torch {meta['torch']} | gpuos {meta['gpuos']}")
    log(f"count={args.count} reps={args.reps} sizes={args.sizes} configs={args.configs}")

    mod, mod_err = C.import_gpuos()
    if mod is not None:
        try:
            C.gpuos_reinit(mod, args.capacity_value)
            log(f"gpuos runtime from {getattr(mod, '__file__', mod.__name__)}; "
                f"capacity={params['gpuos_capacity']}")
        except Exception as exc:
            mod_err = f"init failed: {C.format_exc(exc, 300)}"
            log(f"gpuos {mod_err}")
            mod = None
    else:
        log(f"gpuos not importable ({mod_err}); gpuos configs will be error rows")

    rows, value_rows = [], []

    def save(partial):
        extra = {"params": params}
        if partial:
            extra["partial"] = True
        else:
            extra["goals"] = evaluate_goals(rows + value_rows, args.sizes)
        return C.write_results(NAME, meta, rows + value_rows, path=out_path, **extra)

    pkg, pkg_err = C.import_gpuos_package()
    ctx = C.RunContext(budget=C.Budget(math.inf), reps=args.reps, warmup=args.warmup, log=log, gpuos=pkg,
                       gpuos_err=pkg_err, capacity=args.capacity_value or 8192)
    for n in args.sizes:
        run_size(n, args, mod, mod_err, rows, value_rows, ctx)
        save(partial=True)
    if not args.no_roundtrip:
        measure_roundtrips(args, mod, mod_err, value_rows)
        save(partial=True)
    if not args.no_subop:
        measure_ns_per_subop(args, mod, mod_err, value_rows)
    elif mod is not None:
        try:
            mod.shutdown()
        except Exception as exc:
            log(f"gpuos shutdown: {C.format_exc(exc)}")

    all_rows = rows + value_rows
    goals = evaluate_goals(all_rows, args.sizes)
    path = save(partial=False)
    print_report(meta, all_rows, goals, args.sizes, args, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

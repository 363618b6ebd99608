#!/usr/bin/env python
"""W3 reduction benchmark: many independent last-dim reductions (issue 3 acceptance).

    python benchmarks/bench_reduce.py                  # full run (1,000 reductions, 20 reps, 4 shapes)
    python benchmarks/bench_reduce.py --quick          # smoke test (100 reductions, 5 reps)
    python benchmarks/bench_reduce.py --shapes 8x256 --reps 50 --configs eager gpuos_submit_reduce

For every shape (rows x cols; default 8x256, 32x128, 64x512, 128x1024; fp32) it allocates ``count``
distinct inputs x_i (torch.randn, one allocation each) and their outputs, then compares, per rep:

    eager                count x  torch.sum(x_i, dim=-1)             (new output tensor each op)
    eager_out            count x  torch.sum(x_i, dim=-1, out=o_i)
    cudagraph            the count torch.sum(out=) calls captured in one torch.cuda.CUDAGraph; replay timed
    gpuos_submit_reduce  count x  gpuos.submit_reduce("sum", x_i, o_i); gpuos.flush(sync=True)
    eager_softmax        count x  torch.softmax(x_i, -1)             (new output tensor each op)
    gpuos_softmax        count x  gpuos.submit_reduce("softmax", x_i, s_i); gpuos.flush(sync=True)
    gpuos_scheduler      the eager loop inside gpuos.scheduler_context()  (--configs; the suite runs it)
    compile              torch.compile(torch.sum(x, -1)) called per input  (suite only: child process)

The standalone default is the first six; ``python -m benchmarks`` (W3) runs all of them, and lists foreach
and compile_reduce_overhead as not applicable (rows with the reason).

Every config is checked first (outputs poisoned with NaN, one run, assert_close vs torch) and the row
carries "correct". Each timed rep: perf_counter around the whole count-op work followed by
torch.cuda.synchronize() (gpuos configs: flush(sync=True) is part of the work). Rows also carry
"host_median_ms" (until the work returned, before the trailing synchronize) and "us_per_op".

Goal (issue 3): gpuos_submit_reduce >= 4x faster than eager on every shape. The softmax pair
(gpuos_softmax vs eager_softmax) is reported against the same target, as information.

Robustness: every failure becomes a row with "error" (never aborts the run); results are saved after
every config; a soft time budget (--budget, default 75 s) turns what is left into "skipped" error rows
and trims reps of very slow configs; GPUOS_TIMEOUT_S defaults to 10 s here; a faulthandler watchdog
(--watchdog, default 170 s) dumps stacks and exits if something hangs outright.
Results: benchmarks/results/reduce.json (BENCH_SCHEMA.md). Without a CUDA GPU: message, exit 0.
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import math
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

if __package__ in (None, ""):  # run as a script: python benchmarks/bench_reduce.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import _common as C
else:  # python -m benchmarks.bench_reduce / import
    from . import _common as C

NAME = "reduce"
WORKLOAD = "W3"
TILE_ELEMS = 4096  # API_SPEC: one reduction of rows*cols elements uses about ceil(rows*cols/4096) slots
DEFAULT_SHAPES = [(8, 256), (32, 128), (64, 512), (128, 1024)]
DEFAULT_CAPACITY = 65536
CONFIGS = ["eager", "eager_out", "cudagraph", "gpuos_submit_reduce", "eager_softmax", "gpuos_softmax",
           "gpuos_scheduler"]
DEFAULT_CONFIGS = CONFIGS[:6]
GPUOS_CONFIGS = ("gpuos_submit_reduce", "gpuos_softmax")
TITLE = "last-dim reductions (1,000 independent fp32 sums / softmaxes)"
IN_PROCESS_SHARE = 0.5  # of W3's suite budget; the compile child gets the rest
NOT_APPLICABLE = {
    "foreach": "torch._foreach_* has no last-dim sum or softmax (only whole-tensor norms)",
    "compile_reduce_overhead": "per-op reduce-overhead replays one CUDA graph whose output buffer the next of the "
                               "1,000 calls overwrites (cudagraph trees); `cudagraph` measures one graph of the "
                               "whole batch instead",
}
SOFTMAX_CONFIGS = ("eager_softmax", "gpuos_softmax")

GOAL_VS_EAGER = 4.0  # gpuos >= 4x faster than eager on every shape

# assert_close tolerances (fp32; reduction order differs from torch's)
TOL = {"sum": {"rtol": 1e-5, "atol": 1e-4}, "softmax": {"rtol": 1e-5, "atol": 1e-6}}


def log(msg: str) -> None:
    print(f"[{NAME}] {msg}", flush=True)


def shape_str(shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def parse_shapes(values) -> list:
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


# --------------------------------------------------------------------------------------------------
# gpuos
# --------------------------------------------------------------------------------------------------
def import_gpuos_reduce():
    """(module, submit_reduce, None) or (None, None, reason).

    ``module`` provides flush/init/shutdown/stats (gpuos_ext preferred); ``submit_reduce`` is taken from
    gpuos_ext, else from the gpuos package (both share one runtime).
    """
    mod, err = C.import_gpuos()
    if mod is None:
        return None, None, err
    fn = getattr(mod, "submit_reduce", None)
    if fn is None:
        try:
            import gpuos as pkg  # noqa: WPS433
            fn = getattr(pkg, "submit_reduce", None)
        except Exception as exc:
            return None, None, (f"{mod.__name__} has no submit_reduce and import gpuos failed: "
                                f"{C.format_exc(exc, 200)}")
    if fn is None:
        return None, None, (f"{mod.__name__} (and the gpuos package) have no submit_reduce: the issue-3 "
                            f"operator library is not built into this gpuos")
    return mod, fn, None


# --------------------------------------------------------------------------------------------------
# correctness
# --------------------------------------------------------------------------------------------------
def check_outputs(outs, X, op: str, chunk: int = 250):
    """(True, None) when outs[i] matches torch's op over the last dim of X[i], else (False, why)."""
    import torch
    if outs is None or len(outs) != len(X):
        return False, f"expected {len(X)} outputs, got {None if outs is None else len(outs)}"
    tol = TOL[op]
    for i in range(0, len(X), chunk):
        xs = torch.stack(X[i:i + chunk])
        exp = torch.sum(xs, dim=-1) if op == "sum" else torch.softmax(xs, dim=-1)
        try:
            got = torch.stack(list(outs[i:i + chunk]))
            torch.testing.assert_close(got, exp, **tol)
        except (AssertionError, RuntimeError) as exc:
            msg = " ".join(str(exc).split())
            return False, f"ops {i}..{min(len(X), i + chunk) - 1}: {msg[:400]}"
    return True, None


def run_and_check(fn, X, op, outs=None):
    """Poison ``outs`` (if given), run fn once, check outs (or what fn returned). Returns (ok, why, ms)."""
    import torch
    if outs is not None:
        for o in outs:
            o.fill_(float("nan"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = fn()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    ok, why = check_outputs(outs if outs is not None else res, X, op)
    return ok, why, ms


# --------------------------------------------------------------------------------------------------
# per-shape configs
# --------------------------------------------------------------------------------------------------
def capture_graph(X, O):
    import torch
    tsum = torch.sum
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as the CUDA graphs docs recommend
        for x, o in zip(X, O):
            tsum(x, dim=-1, out=o)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    try:  # thread_local: the gpuos runtime's helper thread must not invalidate our capture
        ctx = torch.cuda.graph(g, capture_error_mode="thread_local")
    except TypeError:
        ctx = torch.cuda.graph(g)
    with ctx:
        for x, o in zip(X, O):
            tsum(x, dim=-1, out=o)
    torch.cuda.synchronize()
    return g, (time.perf_counter() - t0) * 1e3


class Runner:
    """Runs the configs of every shape within ``args.budget`` seconds; ``ctx`` (the suite's RunContext, or
    None) brings the gpuos package for gpuos_scheduler and the progress display."""

    def __init__(self, args, mod, submit_reduce, mod_err, rows, value_rows, save, ctx=None):
        self.args = args
        self.ctx = ctx
        self.mod = mod
        self.submit_reduce = submit_reduce
        self.mod_err = mod_err
        self.rows = rows
        self.value_rows = value_rows
        self.save = save
        self.t_start = time.perf_counter()
        self.configs_left = len(args.shapes) * len(args.configs)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def remaining(self) -> float:
        return self.args.budget - self.elapsed()

    def run_shape(self, shape):
        import torch
        args = self.args
        rows_, cols = shape
        size = shape_str(shape)
        count = args.count
        extra_base = {"rows": rows_, "cols": cols, "count": count, "dtype": "float32"}

        wanted = [c for c in CONFIGS if c in args.configs]
        if self.remaining() <= 0:
            for cfg in wanted:
                self.rows.append(C.error_row(WORKLOAD, size, cfg, f"skipped: time budget ({args.budget:g} s) "
                                             f"used up", **extra_base))
            self.configs_left -= len(wanted)
            log(f"{size}: skipped (time budget used up)")
            return

        X = O = S = None
        try:
            dev = torch.device("cuda", torch.cuda.current_device())
            gen = torch.Generator(device=dev)
            gen.manual_seed(1000 + rows_ * 7919 + cols)
            t0 = time.perf_counter()
            X = [torch.randn(rows_, cols, device=dev, generator=gen) for _ in range(count)]
            O = [torch.empty(rows_, device=dev) for _ in range(count)]
            S = ([torch.empty(rows_, cols, device=dev) for _ in range(count)]
                 if any(c in args.configs for c in SOFTMAX_CONFIGS) else None)
            torch.cuda.synchronize()
            log(f"{size}: allocated {count} inputs (+ outputs) in {time.perf_counter() - t0:.2f} s")
        except Exception as exc:
            for cfg in wanted:
                self.rows.append(C.error_row(WORKLOAD, size, cfg, f"allocation failed: {C.format_exc(exc, 300)}",
                                             **extra_base))
            self.configs_left -= len(wanted)
            log(f"{size}: ERROR allocation failed: {C.format_exc(exc, 300)}")
            X = O = S = None
            self._cleanup()
            return

        graph_holder = []
        submit_loop_ms = {}

        # ---- setups: each returns (fn, outs_or_None, op, extra_fields)
        def setup_eager():
            tsum = torch.sum

            def fn():
                return [tsum(x, -1) for x in X]
            return fn, None, "sum", None

        def setup_eager_out():
            tsum = torch.sum

            def fn():
                for x, o in zip(X, O):
                    tsum(x, dim=-1, out=o)
            return fn, O, "sum", None

        def setup_cudagraph():
            g, capture_ms = capture_graph(X, O)
            graph_holder.append(g)
            return g.replay, O, "sum", {"capture_ms": C._r(capture_ms, 2)}

        def make_gpuos(op, outs, cfg):
            submit, flush = self.submit_reduce, self.mod.flush
            loop_ms = submit_loop_ms.setdefault(cfg, [])
            perf = time.perf_counter

            def fn():
                t = perf()
                for x, o in zip(X, outs):
                    submit(op, x, o)
                loop_ms.append((perf() - t) * 1e3)
                flush(sync=True)
            return fn

        def setup_gpuos_sum():
            return make_gpuos("sum", O, "gpuos_submit_reduce"), O, "sum", None

        def setup_eager_softmax():
            smax = torch.softmax

            def fn():
                return [smax(x, -1) for x in X]
            return fn, None, "softmax", None

        def setup_gpuos_softmax():
            return make_gpuos("softmax", S, "gpuos_softmax"), S, "softmax", None

        def setup_gpuos_scheduler():
            tsum = torch.sum

            def fn():
                with self.ctx.scheduler():
                    return [tsum(x, -1) for x in X]
            return fn, None, "sum", None

        setups = {"eager": setup_eager, "eager_out": setup_eager_out, "cudagraph": setup_cudagraph,
                  "gpuos_submit_reduce": setup_gpuos_sum, "eager_softmax": setup_eager_softmax,
                  "gpuos_softmax": setup_gpuos_softmax, "gpuos_scheduler": setup_gpuos_scheduler}

        try:
            for cfg in wanted:
                self.bench(cfg, setups[cfg], size, X, extra_base, submit_loop_ms)
                graph_holder.clear()
                self.configs_left -= 1
                try:
                    self.save(partial=True)
                except Exception as exc:  # pragma: no cover - disk trouble
                    log(f"could not save partial results: {C.format_exc(exc)}")
        finally:
            graph_holder.clear()
            del X, O, S
            self._cleanup()

    def _cleanup(self):
        import torch
        gc.collect()
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass

    def bench(self, config, setup, size, X, extra_base, submit_loop_ms):
        import torch
        args = self.args
        if self.ctx is not None:
            self.ctx.advance(f"{WORKLOAD} {size} {config}")
        if self.remaining() <= 0:
            self.rows.append(C.error_row(WORKLOAD, size, config,
                                         f"skipped: time budget ({args.budget:g} s) used up", **extra_base))
            log(f"{size} {config}: skipped (time budget used up)")
            return
        unavailable = None
        if config in GPUOS_CONFIGS and self.mod is None:
            unavailable = self.mod_err
        elif config == "gpuos_scheduler" and (self.ctx is None or self.ctx.gpuos is None):
            unavailable = self.ctx.gpuos_err if self.ctx is not None else "needs the gpuos package"
        if unavailable is not None:
            self.rows.append(C.error_row(WORKLOAD, size, config, f"gpuos unavailable: {unavailable}",
                                         **extra_base))
            log(f"{size} {config}: ERROR gpuos unavailable")
            return
        is_gpuos = config in GPUOS_CONFIGS
        st0 = C.gpuos_stats(self.mod) if is_gpuos else None
        try:
            fn, outs, op, extra = setup()
            correct, detail, check_ms = run_and_check(fn, X, op, outs)
            # trim reps when one call is so slow that the full reps would blow the time budget
            share = max(2.0, self.remaining() / max(1, self.configs_left))  # s for this config
            reps, warmup, note = C.plan_reps(check_ms / 1e3, args.reps, args.warmup, share)
            timing = C.time_reps(fn, reps=reps, warmup=warmup)
        except Exception as exc:
            self.rows.append(C.error_row(WORKLOAD, size, config, exc, **extra_base))
            log(f"{size} {config}: ERROR {C.format_exc(exc, 300)}")
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            if is_gpuos and C.is_fatal_gpuos_error(exc):
                self.mod_err = f"an earlier gpuos call failed ({size} {config}): {C.format_exc(exc, 200)}"
                self.mod = None
                log("gpuos marked unusable; later gpuos configs become error rows")
            return
        row = C.timing_row(WORKLOAD, size, config, timing, correct,
                           us_per_op=C._r(timing.median_ms * 1e3 / args.count),
                           host_median_ms=C._r(timing.host_median_ms),
                           op=op, **extra_base, **(extra or {}))
        if note:
            row["reps_note"] = note
        if detail:
            row["correct_detail"] = detail
        if st0 is not None:
            d = C.stats_delta(st0, C.gpuos_stats(self.mod))
            if d is not None:
                row["stats_delta"] = d
        self.rows.append(row)
        if is_gpuos:
            samples = submit_loop_ms.get(config, [])[-timing.reps:]
            if samples:
                us = statistics.median(samples) * 1e3 / args.count
                self.value_rows.append(C.value_row(WORKLOAD, f"{config}_host_us", us, "us", size=size,
                                                   op=op, count=args.count,
                                                   min_us=C._r(min(samples) * 1e3 / args.count),
                                                   max_us=C._r(max(samples) * 1e3 / args.count)))
        log(f"{size} {config:<20} median {timing.median_ms:9.3f} ms  (min {timing.min_ms:.3f}, "
            f"max {timing.max_ms:.3f}, host {timing.host_median_ms:.3f}, reps {timing.reps}) correct={correct}")


# --------------------------------------------------------------------------------------------------
# the suite's W3 (python -m benchmarks) and its torch.compile child
# --------------------------------------------------------------------------------------------------
def suite_params(quick: bool) -> dict:
    shapes = DEFAULT_SHAPES[:1] + DEFAULT_SHAPES[-1:] if quick else DEFAULT_SHAPES
    return {"shapes": [shape_str(s) for s in shapes], "count": 100 if quick else 1000, "dtype": "float32",
            "tolerances": TOL}


def suite_units(params: dict, ctx: "C.RunContext") -> int:
    return len(params["shapes"]) * (sum(ctx.wants(c) for c in CONFIGS) + ctx.wants("compile"))


def run_workload(ctx: "C.RunContext", params: dict, save) -> list:
    """W3 in the suite: every shape with every in-process config, then the compile child (op sum)."""
    rows = [C.not_applicable_row(WORKLOAD, c, why) for c, why in NOT_APPLICABLE.items() if ctx.wants(c)]
    value_rows: list = []
    shapes = parse_shapes(params["shapes"])
    args = SimpleNamespace(shapes=shapes, count=params["count"], reps=ctx.reps, warmup=ctx.warmup,
                           configs=[c for c in CONFIGS if ctx.wants(c)],
                           budget=ctx.budget.remaining() * IN_PROCESS_SHARE)
    ctx.capacity = DEFAULT_CAPACITY  # gpuos_scheduler flushes by itself only every capacity / 8 ops
    mod, submit_reduce, mod_err = import_gpuos_reduce()
    if mod is not None:
        try:
            C.gpuos_reinit(mod, DEFAULT_CAPACITY)
        except Exception as exc:
            mod, mod_err = None, f"init failed: {C.format_exc(exc, 300)}"
    runner = Runner(args, mod, submit_reduce, mod_err, rows, value_rows, lambda partial: save(rows + value_rows), ctx)
    for shape in shapes:
        runner.run_shape(shape)
    if ctx.wants("compile"):
        rows += C.child_rows(ctx, WORKLOAD, "bench_reduce", params,
                             [(shape_str(s), "compile") for s in shapes])
    return rows + value_rows


def _sum_last(x):
    import torch
    return torch.sum(x, dim=-1)


def compile_child(ctx: "C.RunContext", params: dict, emit) -> None:
    """Child process: ``torch.compile(torch.sum(x, -1))`` called once per input, as a user would compile one op."""
    import torch
    count = params["count"]

    def make_case(size: str) -> "C.Case":
        (rows_, cols), = parse_shapes([size])
        gen = torch.Generator(device="cpu").manual_seed(1000 + rows_ * 7919 + cols)
        X = [torch.randn(rows_, cols, generator=gen).to(ctx.device) for _ in range(count)]
        return C.Case(size=size, ref=torch.sum(torch.stack(X), dim=-1), tol=TOL["sum"], data=X, ops_per_rep=count,
                      extra={"rows": rows_, "cols": cols, "count": count, "dtype": "float32", "op": "sum",
                             "per_op": True})

    def prepare(case: "C.Case", compiled, mode: str) -> "C.Prepared":
        def fn():
            return [compiled(x) for x in case.data]
        return C.Prepared(fn, check=lambda: torch.stack(fn()))
    C.compile_sweep(ctx, WORKLOAD, params["shapes"], make_case, _sum_last, prepare, emit, modes=C.COMPILE_MODES[:1])


# --------------------------------------------------------------------------------------------------
# goals + report
# --------------------------------------------------------------------------------------------------
def evaluate_goals(rows, shapes):
    goals = []

    def add(goal, achieved, passed, note="", informational=False):
        g = {"goal": goal, "target": f">= {GOAL_VS_EAGER:g}x",
             "achieved": C._r(achieved) if achieved is not None else None, "pass": bool(passed), "note": note}
        if informational:
            g["informational"] = True
        goals.append(g)

    for pair, info in ((("eager", "gpuos_submit_reduce"), False), (("eager_softmax", "gpuos_softmax"), True)):
        base_cfg, g_cfg = pair
        for shape in shapes:
            size = shape_str(shape)
            b = C.find_row(rows, base_cfg, size)
            g = C.find_row(rows, g_cfg, size)
            name = f"{g_cfg} vs {base_cfg}, {size} (x faster)"
            r = C.ratio(C.row_median(b), C.row_median(g))
            if r is None:
                why = []
                for cfg, row in ((base_cfg, b), (g_cfg, g)):
                    if row is None:
                        why.append(f"{cfg} not run")
                    elif "error" in row:
                        why.append(f"{cfg}: {row['error'][:60]}")
                add(name, None, False, "no data" + (": " + "; ".join(why) if why else ""), info)
            else:
                ok = r >= GOAL_VS_EAGER and not C.incorrect(g)
                add(name, r, ok, "results incorrect" if C.incorrect(g) else "", info)
    return goals


def print_report(meta, rows, goals, args, out_path):
    print()
    print(f"GPUOS reduction benchmark (W3): {meta['device']}  driver {meta['driver']}  "
          f"torch {meta['torch']}  gpuos {meta['gpuos']}  {meta['date']}")
    print(f"{args.count} independent fp32 last-dim reductions per rep, {args.reps} reps (+{args.warmup} warm-up); "
          f"time = host perf_counter around work + torch.cuda.synchronize()")
    headers = ["shape", "config", "median ms", "min ms", "max ms", "us/op", "host ms",
               "vs eager", "vs cudagraph", "correct"]
    table = []
    for shape in args.shapes:
        size = shape_str(shape)
        eager_ms = C.row_median(C.find_row(rows, "eager", size))
        esm_ms = C.row_median(C.find_row(rows, "eager_softmax", size))
        graph_ms = C.row_median(C.find_row(rows, "cudagraph", size))
        for cfg in CONFIGS:
            row = C.find_row(rows, cfg, size)
            if row is None or "unit" in row:
                continue
            if "error" in row:
                table.append([size, cfg, "-", "-", "-", "-", "-", "-", "-", "ERROR: " + row["error"][:70]])
                continue
            med = row["median_ms"]
            soft = cfg in SOFTMAX_CONFIGS
            base = esm_ms if soft else eager_ms
            table.append([size, cfg, med, row["min_ms"], row["max_ms"], row.get("us_per_op"),
                          row.get("host_median_ms"),
                          C.fmt_ratio(C.ratio(base, med)) + (" (sm)" if soft else ""),
                          "-" if soft else C.fmt_ratio(C.ratio(graph_ms, med)),
                          "yes" if row.get("correct") else "NO"])
    C.print_table(headers, table,
                  title="Timings (speedup = baseline median / config median; softmax rows vs eager_softmax)",
                  plain=args.plain, align="llrrrrrrrl")

    vals = [r for r in rows if "unit" in r]
    if vals:
        vt = [[r["config"], str(r.get("size", "-")), r["value"], r["unit"]] for r in vals]
        C.print_table(["figure", "shape", "value", "unit"], vt, title="Figures (host-only submit loop, per op)",
                      plain=args.plain, align="llrl")

    gt = []
    for g in goals:
        res = "PASS" if g["pass"] else "MISS"
        if g.get("informational"):
            res += " (info)"
        gt.append([g["goal"], g["target"], C.fmt_ratio(g["achieved"]) if g["achieved"] is not None else "-",
                   res + (f" ({g['note']})" if g["note"] else "")])
    C.print_table(["goal", "target", "achieved", "result"], gt, title="Goals", plain=args.plain, align="lrrl")
    main_goals = [g for g in goals if not g.get("informational")]
    n_pass = sum(g["pass"] for g in main_goals)
    verdict = "PASS" if main_goals and n_pass == len(main_goals) else "MISS"
    print(f"\nGoal gpuos_submit_reduce >= {GOAL_VS_EAGER:g}x eager on every shape: {verdict} "
          f"({n_pass}/{len(main_goals)} shapes)")
    print(f"results written to {out_path}")


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=None,
                   help="ROWSxCOLS shapes (default 8x256 32x128 64x512 128x1024; commas allowed)")
    p.add_argument("--reps", type=int, default=None, help="timed reps per config (default 20; --quick 5)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up reps per config (default 3)")
    p.add_argument("--count", type=int, default=None,
                   help="independent reductions per rep (default 1000; --quick 100)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: count 100, reps 5; writes reduce_quick.json")
    p.add_argument("--configs", nargs="+", default=None,
                   help=f"subset of {' '.join(CONFIGS)} (default: {' '.join(DEFAULT_CONFIGS)})")
    p.add_argument("--capacity", default=str(DEFAULT_CAPACITY),
                   help=f"gpuos ring capacity: an integer (default {DEFAULT_CAPACITY}), 'auto' (enough slots for "
                        f"one rep at the largest shape, power of two, >= 4096) or 'default' (runtime default)")
    p.add_argument("--budget", type=float, default=75.0,
                   help="soft time budget in s (default 75): configs after it become 'skipped' error rows, "
                        "very slow configs get fewer reps")
    p.add_argument("--watchdog", type=float, default=170.0,
                   help="hard limit in s (default 170; 0 = off): dump stacks and exit if the run hangs")
    p.add_argument("--out", default=None, help="result file (default benchmarks/results/reduce.json)")
    p.add_argument("--plain", action="store_true", help="plain-text tables even if rich is installed")
    args = p.parse_args(argv)

    try:
        args.shapes = parse_shapes(args.shapes) if args.shapes else list(DEFAULT_SHAPES)
    except ValueError as exc:
        p.error(str(exc))
    if args.count is None:
        args.count = 100 if args.quick else 1000
    if args.reps is None:
        args.reps = 5 if args.quick else 20
    args.configs = C.select_configs(args.configs or DEFAULT_CONFIGS, CONFIGS, p.error)
    if args.count <= 0 or args.reps <= 0 or args.warmup < 0:
        p.error("--count and --reps must be positive, --warmup >= 0")
    args.capacity_value = C.parse_capacity(args.capacity, args.count * max(math.ceil(r * c / TILE_ELEMS) for r, c in args.shapes), p.error)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    C.require_cuda(NAME)  # exits 0 with a message when there is no GPU
    faulthandler.enable()
    if args.watchdog and args.watchdog > 0:
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    os.environ.setdefault("GPUOS_TIMEOUT_S", "10")  # a hung flush must not eat the whole run
    import torch

    out_path = Path(args.out) if args.out else C.RESULTS_DIR / (f"{NAME}_quick.json" if args.quick
                                                                else f"{NAME}.json")
    meta = C.env_metadata(NAME)
    params = {"count": args.count, "reps": args.reps, "warmup": args.warmup,
              "shapes": [shape_str(s) for s in args.shapes], "dtype": "float32", "reduce_dim": -1,
              "configs": args.configs, "quick": args.quick,
              "gpuos_capacity": args.capacity_value if args.capacity_value is not None else "default",
              "tolerances": TOL, "budget_s": args.budget, "cuda": torch.version.cuda,
              "gpuos_timeout_s": os.environ.get("GPUOS_TIMEOUT_S")}
    log(f"{meta['device']} | driver {meta['driver']} | torch {meta['torch']} | gpuos {meta['gpuos']}")
    log(f"count={args.count} reps={args.reps} shapes={params['shapes']} configs={args.configs}")

    mod, submit_reduce, mod_err = None, None, None
    try:
        mod, submit_reduce, mod_err = import_gpuos_reduce()
    except Exception as exc:  # pragma: no cover - defensive
        mod_err = f"import failed: {C.format_exc(exc, 300)}"
    if mod is not None:
        try:
            C.gpuos_reinit(mod, args.capacity_value)
            log(f"gpuos runtime from {getattr(mod, '__file__', mod.__name__)}; capacity={params['gpuos_capacity']}")
        except Exception as exc:
            log(f"gpuos init(capacity={args.capacity_value}) failed: {C.format_exc(exc, 300)}; "
                f"retrying with the runtime default")
            try:
                C.gpuos_reinit(mod, None)
                params["gpuos_capacity"] = f"default (init(capacity={args.capacity_value}) failed: " \
                                           f"{C.format_exc(exc, 200)})"
            except Exception as exc2:
                mod_err = f"init failed: {C.format_exc(exc2, 300)}"
                log(f"gpuos {mod_err}")
                mod = None
    else:
        log(f"gpuos not usable ({mod_err}); gpuos configs will be error rows")
    if mod is not None:
        try:
            params["gpuos_ops"] = [r["name"] for r in mod.op_table()] if hasattr(mod, "op_table") else None
        except Exception:
            pass

    rows, value_rows = [], []

    def save(partial):
        extra = {"params": params}
        if partial:
            extra["partial"] = True
        else:
            extra["goals"] = evaluate_goals(rows, args.shapes)
        return C.write_results(NAME, meta, rows + value_rows, path=out_path, **extra)

    pkg, pkg_err = C.import_gpuos_package()
    ctx = C.RunContext(budget=C.Budget(args.budget), log=log, gpuos=pkg, gpuos_err=pkg_err,
                       capacity=args.capacity_value or DEFAULT_CAPACITY)
    runner = Runner(args, mod, submit_reduce, mod_err, rows, value_rows, save, ctx)
    for shape in args.shapes:
        try:
            runner.run_shape(shape)
        except Exception as exc:  # should not happen: every config catches its own errors
            log(f"{shape_str(shape)}: ERROR {C.format_exc(exc, 300)}")
            rows.append(C.error_row(WORKLOAD, shape_str(shape), "all", exc))
        save(partial=True)
    if runner.mod is not None:
        try:
            runner.mod.shutdown()
        except Exception as exc:
            log(f"gpuos shutdown: {C.format_exc(exc)}")
    params["elapsed_s"] = round(runner.elapsed(), 2)

    goals = evaluate_goals(rows, args.shapes)
    path = save(partial=False)
    faulthandler.cancel_dump_traceback_later()
    print_report(meta, rows + value_rows, goals, args, path)
    log(f"done in {runner.elapsed():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

import faulthandler
import math
import os
import sys
import time
from types import SimpleNamespace

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

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


log = H.prefixed_log(NAME)
shape_str = H.shape_str  # "8x256", the rows' size


def check_outputs(outs, X, op: str):
    """(True, None) when outs[i] matches torch's op over the last dim of X[i], else (False, why)."""
    import torch

    def expected(i, j):
        xs = torch.stack(X[i:j])
        return torch.sum(xs, dim=-1) if op == "sum" else torch.softmax(xs, dim=-1)
    return H.check_batch(outs, len(X), expected, TOL[op], chunk=250, errors=(AssertionError, RuntimeError))


# --------------------------------------------------------------------------------------------------
# per-shape configs
# --------------------------------------------------------------------------------------------------
class Runner:
    """Runs the configs of every shape within ``args.budget`` seconds; ``ctx`` (a RunContext: the suite's, or
    one for this run) brings the gpuos package for gpuos_scheduler and the progress display."""

    def __init__(self, args, mod, submit_reduce, mod_err, rows, value_rows, save, ctx):
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
                self.rows.append(H.error_row(WORKLOAD, size, cfg, f"skipped: time budget ({args.budget:g} s) "
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
                self.rows.append(H.error_row(WORKLOAD, size, cfg, f"allocation failed: {H.format_exc(exc, 300)}",
                                             **extra_base))
            self.configs_left -= len(wanted)
            log(f"{size}: ERROR allocation failed: {H.format_exc(exc, 300)}")
            X = O = S = None
            H.release_memory()
            return

        graph_holder = []

        def fields(op, **extra):
            return {"op": op, **extra_base, **extra}

        # ---- setups: each returns (fn, outs_or_None, row fields (op first), after_timing_hook_or_None)
        def setup_eager():
            tsum = torch.sum

            def fn():
                return [tsum(x, -1) for x in X]
            return fn, None, fields("sum"), None

        def setup_eager_out():
            tsum = torch.sum

            def fn():
                for x, o in zip(X, O):
                    tsum(x, dim=-1, out=o)
            return fn, O, fields("sum"), None

        def setup_cudagraph():
            tsum = torch.sum

            def sums():
                for x, o in zip(X, O):
                    tsum(x, dim=-1, out=o)
            g, _, capture_ms = H.capture_cuda_graph(sums, sums)
            graph_holder.append(g)
            return g.replay, O, fields("sum", capture_ms=H.rnd(capture_ms, 2)), None

        def make_gpuos(op, outs, cfg):
            submit, flush = self.submit_reduce, self.mod.flush
            loop_ms = []
            perf = time.perf_counter

            def fn():
                t = perf()
                for x, o in zip(X, outs):
                    submit(op, x, o)
                loop_ms.append((perf() - t) * 1e3)
                flush(sync=True)

            def after(timing):  # the host-only submit loop, per op
                samples = loop_ms[-timing.reps:]
                if samples:
                    self.value_rows.append(H.per_op_us_row(WORKLOAD, f"{cfg}_host_us", samples, count, size=size,
                                                           op=op))
            return fn, outs, fields(op), after

        def setup_eager_softmax():
            smax = torch.softmax

            def fn():
                return [smax(x, -1) for x in X]
            return fn, None, fields("softmax"), None

        def setup_gpuos_scheduler():
            tsum = torch.sum

            def fn():
                with self.ctx.scheduler():
                    return [tsum(x, -1) for x in X]
            return fn, None, fields("sum"), None

        setups = {"eager": setup_eager, "eager_out": setup_eager_out, "cudagraph": setup_cudagraph,
                  "gpuos_submit_reduce": lambda: make_gpuos("sum", O, "gpuos_submit_reduce"),
                  "eager_softmax": setup_eager_softmax,
                  "gpuos_softmax": lambda: make_gpuos("softmax", S, "gpuos_softmax"),
                  "gpuos_scheduler": setup_gpuos_scheduler}

        try:
            for cfg in wanted:
                self.bench(cfg, setups[cfg], size, X, extra_base)
                graph_holder.clear()
                self.configs_left -= 1
                try:
                    self.save(partial=True)
                except Exception as exc:  # pragma: no cover - disk trouble
                    log(f"could not save partial results: {H.format_exc(exc)}")
        finally:
            graph_holder.clear()
            del X, O, S
            H.release_memory()

    def bench(self, config, setup, size, X, extra_base):
        args = self.args
        self.ctx.advance(f"{WORKLOAD} {size} {config}")
        if self.remaining() <= 0:
            self.rows.append(H.error_row(WORKLOAD, size, config,
                                         f"skipped: time budget ({args.budget:g} s) used up", **extra_base))
            log(f"{size} {config}: skipped (time budget used up)")
            return
        why = H.gpuos_unavailable(config, GPUOS_CONFIGS, self.mod, self.mod_err, self.ctx)
        if why is not None:
            self.rows.append(H.error_row(WORKLOAD, size, config, f"gpuos unavailable: {why}", **extra_base))
            log(f"{size} {config}: ERROR gpuos unavailable")
            return
        is_gpuos = config in GPUOS_CONFIGS

        def fatal(exc):
            if is_gpuos and H.is_fatal_gpuos_error(exc):
                self.mod_err = f"an earlier gpuos call failed ({size} {config}): {H.format_exc(exc, 200)}"
                self.mod = None
                log("gpuos marked unusable; later gpuos configs become error rows")

        # trim reps when one call is so slow that the full reps would blow the time budget (s for this config)
        H.bench_config(self.rows, WORKLOAD, size, config, setup, lambda got, f: check_outputs(got, X, f["op"]),
                       lambda _, run_s: H.plan_reps(run_s, args.reps, args.warmup,
                                                    max(2.0, self.remaining() / max(1, self.configs_left))),
                       args.count, log, size, extra_base, stats_mod=self.mod if is_gpuos else None, on_error=fatal)


# --------------------------------------------------------------------------------------------------
# the suite's W3 (python -m benchmarks) and its torch.compile child
# --------------------------------------------------------------------------------------------------
def suite_params(quick: bool) -> dict:
    shapes = DEFAULT_SHAPES[:1] + DEFAULT_SHAPES[-1:] if quick else DEFAULT_SHAPES
    return {"shapes": [shape_str(s) for s in shapes], "count": 100 if quick else 1000, "dtype": "float32",
            "tolerances": TOL}


def suite_units(params: dict, ctx: "H.RunContext") -> int:
    return len(params["shapes"]) * (sum(ctx.wants(c) for c in CONFIGS) + ctx.wants("compile"))


def run_workload(ctx: "H.RunContext", params: dict, save) -> list:
    """W3 in the suite: every shape with every in-process config, then the compile child (op sum)."""
    rows = [H.not_applicable_row(WORKLOAD, c, why) for c, why in NOT_APPLICABLE.items() if ctx.wants(c)]
    value_rows: list = []
    shapes = H.parse_shapes(params["shapes"])
    args = SimpleNamespace(shapes=shapes, count=params["count"], reps=ctx.reps, warmup=ctx.warmup,
                           configs=[c for c in CONFIGS if ctx.wants(c)],
                           budget=ctx.budget.remaining() * IN_PROCESS_SHARE)
    ctx.capacity = DEFAULT_CAPACITY  # gpuos_scheduler flushes by itself only every capacity / 8 ops
    mod, submit_reduce, mod_err = H.import_gpuos_reduce()
    mod, mod_err = H.init_gpuos(mod, mod_err, DEFAULT_CAPACITY)
    runner = Runner(args, mod, submit_reduce, mod_err, rows, value_rows, lambda partial: save(rows + value_rows), ctx)
    for shape in shapes:
        runner.run_shape(shape)
    if ctx.wants("compile"):
        rows += H.child_rows(ctx, WORKLOAD, "bench_reduce", params,
                             [(shape_str(s), "compile") for s in shapes])
    return rows + value_rows


def _sum_last(x):
    import torch
    return torch.sum(x, dim=-1)


def compile_child(ctx: "H.RunContext", params: dict, emit) -> None:
    """Child process: ``torch.compile(torch.sum(x, -1))`` called once per input, as a user would compile one op."""
    import torch
    count = params["count"]

    def make_case(size: str) -> "H.Case":
        (rows_, cols), = H.parse_shapes([size])
        gen = torch.Generator(device="cpu").manual_seed(1000 + rows_ * 7919 + cols)
        X = [torch.randn(rows_, cols, generator=gen).to(ctx.device) for _ in range(count)]
        return H.Case(size=size, ref=torch.sum(torch.stack(X), dim=-1), tol=TOL["sum"], data=X, ops_per_rep=count,
                      extra={"rows": rows_, "cols": cols, "count": count, "dtype": "float32", "op": "sum",
                             "per_op": True})

    def prepare(case: "H.Case", compiled, mode: str) -> "H.Prepared":
        def fn():
            return [compiled(x) for x in case.data]
        return H.Prepared(fn, check=lambda: torch.stack(fn()))
    H.compile_sweep(ctx, WORKLOAD, params["shapes"], make_case, _sum_last, prepare, emit, modes=H.COMPILE_MODES[:1])


# --------------------------------------------------------------------------------------------------
# goals + report
# --------------------------------------------------------------------------------------------------
def evaluate_goals(rows, shapes):
    goals = []  # the softmax pair is information only
    for (base_cfg, g_cfg), info in ((("eager", "gpuos_submit_reduce"), False),
                                    (("eager_softmax", "gpuos_softmax"), True)):
        for shape in shapes:
            size = shape_str(shape)
            b = H.find_row(rows, base_cfg, size)
            g = H.find_row(rows, g_cfg, size)
            why = [f"{cfg} not run" if row is None else f"{cfg}: {row['error'][:60]}"
                   for cfg, row in ((base_cfg, b), (g_cfg, g)) if row is None or "error" in row]
            goals.append(H.speedup_goal(f"{g_cfg} vs {base_cfg}, {size} (x faster)", GOAL_VS_EAGER, b, g,
                                        "no data" + (": " + "; ".join(why) if why else ""), info))
    return goals


def print_report(meta, rows, goals, args, out_path):
    H.print_header("GPUOS reduction benchmark (W3)", meta)
    print(f"{args.count} independent fp32 last-dim reductions per rep, {args.reps} reps (+{args.warmup} warm-up); "
          f"time = host perf_counter around work + torch.cuda.synchronize()")
    table = H.speedup_table(rows, [shape_str(s) for s in args.shapes], CONFIGS, err_len=70,
                            baseline={c: "eager_softmax" for c in SOFTMAX_CONFIGS}, mark=" (sm)")
    H.print_table(["shape", "config"] + H.SPEEDUP_HEADERS, table,
                  title="Timings (speedup = baseline median / config median; softmax rows vs eager_softmax)",
                  plain=args.plain, align="llrrrrrrrl")

    vals = [r for r in rows if "unit" in r]
    if vals:
        vt = [[r["config"], str(r.get("size", "-")), r["value"], r["unit"]] for r in vals]
        H.print_table(["figure", "shape", "value", "unit"], vt, title="Figures (host-only submit loop, per op)",
                      plain=args.plain, align="llrl")
    H.print_goals(goals, args.plain)
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
    p = H.new_parser(__doc__)
    p.add_argument("--shapes", nargs="+", default=None,
                   help="ROWSxCOLS shapes (default 8x256 32x128 64x512 128x1024; commas allowed)")
    H.add_reps_args(p, 20, 5, 3)
    p.add_argument("--count", type=int, default=None,
                   help="independent reductions per rep (default 1000; --quick 100)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: count 100, reps 5; writes reduce_quick.json")
    H.add_configs_arg(p, CONFIGS, DEFAULT_CONFIGS)
    p.add_argument("--capacity", default=str(DEFAULT_CAPACITY),
                   help=f"gpuos ring capacity: an integer (default {DEFAULT_CAPACITY}), 'auto' (enough slots for "
                        f"one rep at the largest shape, power of two, >= 4096) or 'default' (runtime default)")
    p.add_argument("--budget", type=float, default=75.0,
                   help="soft time budget in s (default 75): configs after it become 'skipped' error rows, "
                        "very slow configs get fewer reps")
    H.add_watchdog_arg(p, 170.0)
    H.add_output_args(p, NAME)
    args = p.parse_args(argv)

    try:
        args.shapes = H.parse_shapes(args.shapes) if args.shapes else list(DEFAULT_SHAPES)
    except ValueError as exc:
        p.error(str(exc))
    if args.count is None:
        args.count = 100 if args.quick else 1000
    if args.reps is None:
        args.reps = 5 if args.quick else 20
    args.configs = H.select_configs(args.configs or DEFAULT_CONFIGS, CONFIGS, p.error)
    if args.count <= 0 or args.reps <= 0 or args.warmup < 0:
        p.error("--count and --reps must be positive, --warmup >= 0")
    args.capacity_value = H.parse_capacity(
        args.capacity, args.count * max(math.ceil(r * c / TILE_ELEMS) for r, c in args.shapes), p.error)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    H.require_cuda(NAME)  # exits 0 with a message when there is no GPU
    H.start_watchdog(args.watchdog)
    os.environ.setdefault("GPUOS_TIMEOUT_S", "10")  # a hung flush must not eat the whole run
    import torch

    out_path = H.result_path(NAME, args.quick, args.out)
    meta = H.env_metadata(NAME)
    params = {"count": args.count, "reps": args.reps, "warmup": args.warmup,
              "shapes": [shape_str(s) for s in args.shapes], "dtype": "float32", "reduce_dim": -1,
              "configs": args.configs, "quick": args.quick,
              "gpuos_capacity": args.capacity_value if args.capacity_value is not None else "default",
              "tolerances": TOL, "budget_s": args.budget, "cuda": torch.version.cuda,
              "gpuos_timeout_s": os.environ.get("GPUOS_TIMEOUT_S")}
    log(H.env_line(meta))
    log(f"count={args.count} reps={args.reps} shapes={params['shapes']} configs={args.configs}")

    mod, submit_reduce, mod_err = None, None, None
    try:
        mod, submit_reduce, mod_err = H.import_gpuos_reduce()
    except Exception as exc:  # pragma: no cover - defensive
        mod_err = f"import failed: {H.format_exc(exc, 300)}"
    if mod is not None:
        try:
            H.gpuos_reinit(mod, args.capacity_value)
            log(f"gpuos runtime from {getattr(mod, '__file__', mod.__name__)}; capacity={params['gpuos_capacity']}")
        except Exception as exc:
            log(f"gpuos init(capacity={args.capacity_value}) failed: {H.format_exc(exc, 300)}; "
                f"retrying with the runtime default")
            try:
                H.gpuos_reinit(mod, None)
                params["gpuos_capacity"] = f"default (init(capacity={args.capacity_value}) failed: " \
                                           f"{H.format_exc(exc, 200)})"
            except Exception as exc2:
                mod_err = f"init failed: {H.format_exc(exc2, 300)}"
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
        goals = None if partial else evaluate_goals(rows, args.shapes)
        return H.save_results(NAME, meta, rows + value_rows, out_path, params, partial, goals)

    pkg, pkg_err = H.import_gpuos_package()
    ctx = H.RunContext(budget=H.Budget(args.budget), log=log, gpuos=pkg, gpuos_err=pkg_err,
                       capacity=args.capacity_value or DEFAULT_CAPACITY)
    runner = Runner(args, mod, submit_reduce, mod_err, rows, value_rows, save, ctx)
    for shape in args.shapes:
        try:
            runner.run_shape(shape)
        except Exception as exc:  # should not happen: every config catches its own errors
            log(f"{shape_str(shape)}: ERROR {H.format_exc(exc, 300)}")
            rows.append(H.error_row(WORKLOAD, shape_str(shape), "all", exc))
        save(partial=True)
    if runner.mod is not None:
        try:
            runner.mod.shutdown()
        except Exception as exc:
            log(f"gpuos shutdown: {H.format_exc(exc)}")
    params["elapsed_s"] = round(runner.elapsed(), 2)

    goals = evaluate_goals(rows, args.shapes)
    path = save(partial=False)
    faulthandler.cancel_dump_traceback_later()
    print_report(meta, rows + value_rows, goals, args, path)
    log(f"done in {runner.elapsed():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

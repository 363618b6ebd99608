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

import gc
import math
import statistics
import sys
import time
from types import SimpleNamespace

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

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


log = H.prefixed_log(NAME)


def check_add(outs, A, B):
    """(True, None) when outs[i] == A[i] + B[i] for all i (assert_close), else (False, why)."""
    import torch
    return H.check_batch(outs, len(A), lambda i, j: torch.stack(A[i:j]) + torch.stack(B[i:j]))


# --------------------------------------------------------------------------------------------------
# per-size configs
# --------------------------------------------------------------------------------------------------
def run_size(n, args, mod, mod_err, rows, value_rows, ctx: "H.RunContext"):
    """All configs of args.configs at size n. ``ctx``: its budget turns late configs into error rows and trims
    the reps of slow ones (the suite's; unbounded when run alone); its gpuos package runs gpuos_scheduler."""
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
        ctx.advance(f"{WORKLOAD} {n} {config}")
        why = H.gpuos_unavailable(config, GPUOS_CONFIGS, mod, mod_err, ctx)
        if why is not None:
            rows.append(H.error_row(WORKLOAD, n, config, f"gpuos unavailable: {why}", count=count))
            log(f"n={n} {config}: ERROR gpuos unavailable")
        elif ctx.budget.expired():
            rows.append(H.error_row(WORKLOAD, n, config, H.budget_error(ctx), count=count))
        else:  # the whole check (one call + compare) bounds one rep from above
            H.bench_config(rows, WORKLOAD, n, config, setup, lambda got, _: check_add(got, A, B),
                           lambda check_s, _: H.plan_reps(check_s, reps, warmup, ctx.share_s(), ctx.min_reps),
                           count, log, f"n={n}", {"count": count}, lead={"count": count},
                           stats_mod=mod if config in GPUOS_CONFIGS else None)

    # eager: c = a + b, a new output per op
    def setup_eager():
        def fn():
            return [a + b for a, b in zip(A, B)]
        return fn, None, {}, None

    # eager_out: torch.add(a, b, out=c)
    def setup_eager_out():
        add = torch.add

        def fn():
            for a, b, c in zip(A, B, Cout):
                add(a, b, out=c)
        return fn, Cout, {}, None

    # foreach: out-of-place torch._foreach_add (allocates the outputs)
    def setup_foreach():
        fadd = torch._foreach_add

        def fn():
            return fadd(A, B)
        return fn, None, {}, None

    # cudagraph: replay of one graph holding all the torch.add(out=) calls
    graph_holder = []

    def setup_cudagraph():
        def adds():
            for a, b, c in zip(A, B, Cout):
                torch.add(a, b, out=c)
        g, _, capture_ms = H.capture_cuda_graph(adds, adds)
        graph_holder.append(g)
        return g.replay, Cout, {"capture_ms": H.rnd(capture_ms, 2)}, None

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
                value_rows.append(H.per_op_us_row(WORKLOAD, "submit_host_us", samples, count, size=n))
                log(f"n={n} submit_host_us = {value_rows[-1]['value']:.3f} us per submit_add (host only)")
        return fn, Cout, {}, after

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
                value_rows.append(H.per_op_us_row(WORKLOAD, "submit_many_host_us", samples, count, spread=False,
                                                  size=n))
                log(f"n={n} submit_many_host_us = {value_rows[-1]['value']:.4f} us per sub-op (host only)")
        return fn, Cout, {}, after

    # gpuos_scheduler: the eager loop inside one scheduler_context (flushed at exit)
    def setup_gpuos_scheduler():
        def fn():
            with ctx.scheduler():
                return [a + b for a, b in zip(A, B)]
        return fn, None, {}, None

    bench("eager", setup_eager)
    bench("eager_out", setup_eager_out)
    bench("foreach", setup_foreach)
    bench("cudagraph", setup_cudagraph)
    graph_holder.clear()
    bench("gpuos_submit", setup_gpuos_submit)
    bench("gpuos_submit_many", setup_gpuos_submit_many)
    bench("gpuos_scheduler", setup_gpuos_scheduler)

    del A, B, Cout
    H.release_memory()


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
        value_rows.append(H.value_row(WORKLOAD, "eager_roundtrip_us", us, "us", elements=ROUNDTRIP_ELEMS,
                                      iters=iters, **H.spread_us(samples)))
        log(f"eager_roundtrip_us = {us:.2f} us")
    except Exception as exc:
        value_rows.append(H.error_row(WORKLOAD, None, "eager_roundtrip_us", exc))
        log(f"eager_roundtrip_us: ERROR {H.format_exc(exc, 300)}")

    # gpuos: submit_add of one 256-element op + flush(sync=True)
    if mod is None:
        value_rows.append(H.error_row(WORKLOAD, None, "roundtrip_us", f"gpuos unavailable: {mod_err}"))
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
        row = H.value_row(WORKLOAD, "roundtrip_us", us, "us", elements=ROUNDTRIP_ELEMS, iters=iters,
                          correct=correct, **H.spread_us(samples))
        if detail:
            row["correct_detail"] = detail
        value_rows.append(row)
        log(f"roundtrip_us = {us:.2f} us (correct={correct})")
    except Exception as exc:
        value_rows.append(H.error_row(WORKLOAD, None, "roundtrip_us", exc))
        log(f"roundtrip_us: ERROR {H.format_exc(exc, 300)}")
    finally:
        H.try_sync()


def measure_ns_per_subop(args, mod, mod_err, value_rows):
    """GPU time per 256-element sub-op from one flush of ``batch`` sub-ops (median of ``reps``)."""
    import torch
    if mod is None:
        value_rows.append(H.error_row(WORKLOAD, None, "gpu_ns_per_subop", f"gpuos unavailable: {mod_err}"))
        return
    batch, reps = args.subop_batch, args.subop_reps
    capacity = max(SUBOP_CAPACITY, H.pow2_at_least(batch))
    A = B = Cout = None
    try:
        H.gpuos_reinit(mod, capacity)
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
                H.poison(Cout)
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
        row = H.value_row(WORKLOAD, "gpu_ns_per_subop", ns, "ns", elements=SUBOP_ELEMS, batch=batch,
                          reps=reps, correct=correct,
                          min_ns=H.rnd(min(times_ms) * 1e6 / batch), max_ns=H.rnd(max(times_ms) * 1e6 / batch),
                          batch_median_ms=H.rnd(statistics.median(times_ms)),
                          flush_host_median_ms=H.rnd(statistics.median(flush_host_ms)))
        if detail:
            row["correct_detail"] = detail
        value_rows.append(row)
        log(f"gpu_ns_per_subop = {ns:.2f} ns (batch {batch}, median of {reps}; correct={correct})")
    except Exception as exc:
        value_rows.append(H.error_row(WORKLOAD, None, "gpu_ns_per_subop", exc, batch=batch))
        log(f"gpu_ns_per_subop: ERROR {H.format_exc(exc, 300)}")
    finally:
        del A, B, Cout
        gc.collect()
        try:
            mod.shutdown()
        except Exception:
            pass
        H.release_memory()


# --------------------------------------------------------------------------------------------------
# the suite's W1 (python -m benchmarks) and its torch.compile child
# --------------------------------------------------------------------------------------------------
def suite_params(quick: bool) -> dict:
    return {"sizes": [256, 4096] if quick else list(DEFAULT_SIZES), "count": 1000 if quick else 10000,
            "roundtrip_iters": 500 if quick else 2000, "subop_batch": 20000 if quick else 100000, "subop_reps": 5,
            "dtype": "float32"}


FIGURES = ("roundtrip_us", "gpu_ns_per_subop")  # value figures of the submit API, measured when it is wanted


def _wants_figures(ctx: "H.RunContext") -> bool:
    return any(ctx.wants(c) for c in GPUOS_CONFIGS)


def suite_units(params: dict, ctx: "H.RunContext") -> int:
    per_size = sum(ctx.wants(c) for c in CONFIGS) + ctx.wants("compile")
    return len(params["sizes"]) * per_size + len(FIGURES) * _wants_figures(ctx)


def run_workload(ctx: "H.RunContext", params: dict, save) -> list:
    """W1 in the suite: every size with every in-process config, the value figures, then the compile child."""
    rows = [H.not_applicable_row(WORKLOAD, c, why) for c, why in NOT_APPLICABLE.items() if ctx.wants(c)]
    value_rows: list = []
    args = SimpleNamespace(count=params["count"], reps=ctx.reps, warmup=ctx.warmup,
                           configs=[c for c in CONFIGS if ctx.wants(c)], roundtrip_iters=params["roundtrip_iters"],
                           subop_batch=params["subop_batch"], subop_reps=params["subop_reps"])
    capacity = max(4096, H.pow2_at_least(args.count * max(math.ceil(n / TILE_ELEMS) for n in params["sizes"])))
    ctx.capacity = capacity  # gpuos_scheduler flushes by itself only every capacity / 8 ops
    mod, mod_err = H.init_gpuos(*H.import_gpuos(), capacity)
    whole = ctx.budget
    ctx.budget = whole.part(whole.remaining() * IN_PROCESS_SHARE)
    ctx.units_left = len(params["sizes"]) * len(args.configs) + len(FIGURES) * _wants_figures(ctx)
    try:
        for n in params["sizes"] if args.configs else []:
            try:
                run_size(n, args, mod, mod_err, rows, value_rows, ctx)
            except Exception as exc:  # e.g. the allocation of this size failed: its configs become error rows
                log(f"n={n}: ERROR {H.format_exc(exc, 300)}")
                rows += [H.error_row(WORKLOAD, n, c, exc) for c in args.configs if H.find_row(rows, c, n) is None]
            save(rows + value_rows)
        for figure, measure in zip(FIGURES, (measure_roundtrips, measure_ns_per_subop)) if _wants_figures(ctx) else []:
            if ctx.budget.expired():
                value_rows.append(H.error_row(WORKLOAD, None, figure, H.budget_error(ctx)))
            else:
                try:
                    measure(args, mod, mod_err, value_rows)
                except Exception as exc:  # never lose the workload's other rows
                    value_rows.append(H.error_row(WORKLOAD, None, figure, exc))
            ctx.advance(f"{WORKLOAD} {figure}")
    finally:
        ctx.budget = whole
    if ctx.wants("compile"):
        rows += H.child_rows(ctx, WORKLOAD, "bench_microbatch", params, [(n, "compile") for n in params["sizes"]])
    return rows + value_rows


def _add(a, b):
    return a + b


def compile_child(ctx: "H.RunContext", params: dict, emit) -> None:
    """Child process: ``torch.compile(a + b)`` called once per pair, the way a user would compile one op."""
    import torch
    count = params["count"]

    def make_case(n: int) -> "H.Case":
        torch.manual_seed(1234 + n)
        A = [torch.randn(n, device=ctx.device) for _ in range(count)]
        B = [torch.randn(n, device=ctx.device) for _ in range(count)]
        return H.Case(size=n, ref=torch.stack(A) + torch.stack(B), tol={}, data=(A, B), ops_per_rep=count,
                      extra={"count": count, "per_op": True})

    def prepare(case: "H.Case", compiled, mode: str) -> "H.Prepared":
        A, B = case.data

        def fn():
            return [compiled(a, b) for a, b in zip(A, B)]
        return H.Prepared(fn, check=lambda: torch.stack(fn()))
    H.compile_sweep(ctx, WORKLOAD, params["sizes"], make_case, _add, prepare, emit, modes=H.COMPILE_MODES[:1])


# --------------------------------------------------------------------------------------------------
# goals + report
# --------------------------------------------------------------------------------------------------
def evaluate_goals(rows, sizes):
    """PASS / MISS of the issue's four goals (no data counts as a miss; the note says why)."""
    goals = [H.speedup_goal("gpuos_submit vs eager, n=256 (x faster)", GOAL_SUBMIT_VS_EAGER,
                            H.find_row(rows, "eager", 256), H.find_row(rows, "gpuos_submit", 256),
                            "no data" + ("" if 256 in sizes else " (n=256 not run)"))]
    goals += [H.speedup_goal(f"gpuos_submit_many vs cudagraph, n={n} (x faster)", GOAL_MANY_VS_GRAPH,
                             H.find_row(rows, "cudagraph", n), H.find_row(rows, "gpuos_submit_many", n))
              for n in sizes]  # each size; n=256 is the headline
    goals.append(H.value_goal("roundtrip_us (submit_add + flush(sync=True), 256 el.)", f"<= {GOAL_ROUNDTRIP_US:g} us",
                              H.find_row(rows, "roundtrip_us"), GOAL_ROUNDTRIP_US))
    goals.append(H.value_goal("gpu_ns_per_subop (256 el., one batch)", f"<= {GOAL_NS_PER_SUBOP:g} ns",
                              H.find_row(rows, "gpu_ns_per_subop"), GOAL_NS_PER_SUBOP))
    return goals


def print_report(meta, rows, goals, sizes, args, out_path):
    H.print_header("GPUOS micro-batch benchmark (W1)", meta)
    print(f"{args.count} independent fp32 adds per rep, {args.reps} reps (+{args.warmup} warm-up); "
          f"time = host perf_counter around work + torch.cuda.synchronize()")
    H.print_table(["size", "config"] + H.SPEEDUP_HEADERS, H.speedup_table(rows, sizes, CONFIGS),
                  title="Timings (speedup = baseline median / config median)", plain=args.plain, align="rlrrrrrrrl")

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
        H.print_table(["figure", "size", "value", "unit", "note"], vt, title="Figures", plain=args.plain, align="lrrll")
    H.print_goals(goals, args.plain)
    print(f"\nresults written to {out_path}")


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = H.new_parser(__doc__)
    p.add_argument("--sizes", nargs="+", default=None,
                   help="element counts per tensor (default 256 1024 4096 16384; commas allowed)")
    H.add_reps_args(p, 20, 5, 3)
    p.add_argument("--count", type=int, default=None, help="independent adds per rep (default 10000; --quick 1000)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: count 1000, reps 5, 500 round trips; writes microbatch_quick.json")
    H.add_configs_arg(p, CONFIGS, DEFAULT_CONFIGS)
    p.add_argument("--capacity", default="auto",
                   help="gpuos ring capacity for the timed configs: 'auto' (default: enough slots for one "
                        "batch of count ops at the largest size, power of two, >= 4096), 'default' "
                        "(runtime default, no argument), or an integer")
    p.add_argument("--roundtrip-iters", type=int, default=None, help="round trips timed (default 2000; --quick 500)")
    p.add_argument("--subop-batch", type=int, default=100000, help="sub-ops in the gpu_ns_per_subop batch")
    p.add_argument("--subop-reps", type=int, default=5, help="batches timed for gpu_ns_per_subop (median)")
    p.add_argument("--no-roundtrip", action="store_true", help="skip roundtrip_us / eager_roundtrip_us")
    p.add_argument("--no-subop", action="store_true", help="skip gpu_ns_per_subop")
    H.add_output_args(p, NAME)
    args = p.parse_args(argv)

    args.sizes = H.parse_int_list(args.sizes) if args.sizes else list(DEFAULT_SIZES)
    if args.count is None:
        args.count = 1000 if args.quick else 10000
    if args.reps is None:
        args.reps = 5 if args.quick else 20
    if args.roundtrip_iters is None:
        args.roundtrip_iters = 500 if args.quick else 2000
    args.configs = H.select_configs(args.configs or DEFAULT_CONFIGS, CONFIGS, p.error)
    if min(args.sizes) <= 0 or args.count <= 0 or args.reps <= 0 or args.subop_batch <= 0:
        p.error("sizes, --count, --reps and --subop-batch must be positive")
    args.capacity_value = H.parse_capacity(
        args.capacity, args.count * max(math.ceil(n / TILE_ELEMS) for n in args.sizes), p.error)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    H.require_cuda(NAME)  # exits 0 with a message when there is no GPU
    H.start_watchdog()
    import torch

    out_path = H.result_path(NAME, args.quick, args.out)
    meta = H.env_metadata(NAME)
    params = {"count": args.count, "reps": args.reps, "warmup": args.warmup, "sizes": args.sizes,
              "dtype": "float32", "configs": args.configs, "quick": args.quick,
              "gpuos_capacity": args.capacity_value if args.capacity_value is not None else "default",
              "roundtrip_iters": args.roundtrip_iters, "subop_batch": args.subop_batch,
              "subop_reps": args.subop_reps, "cuda": torch.version.cuda}
    log(H.env_line(meta))
    log(f"count={args.count} reps={args.reps} sizes={args.sizes} configs={args.configs}")

    mod, mod_err = H.import_gpuos()
    importable = mod is not None
    mod, mod_err = H.init_gpuos(mod, mod_err, args.capacity_value)
    if mod is not None:
        log(f"gpuos runtime from {getattr(mod, '__file__', mod.__name__)}; capacity={params['gpuos_capacity']}")
    elif importable:
        log(f"gpuos {mod_err}")
    else:
        log(f"gpuos not importable ({mod_err}); gpuos configs will be error rows")

    rows, value_rows = [], []

    def save(partial):
        goals = None if partial else evaluate_goals(rows + value_rows, args.sizes)
        return H.save_results(NAME, meta, rows + value_rows, out_path, params, partial, goals)

    pkg, pkg_err = H.import_gpuos_package()
    ctx = H.RunContext(budget=H.Budget(math.inf), reps=args.reps, warmup=args.warmup, log=log, gpuos=pkg,
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
            log(f"gpuos shutdown: {H.format_exc(exc)}")

    all_rows = rows + value_rows
    goals = evaluate_goals(all_rows, args.sizes)
    path = save(partial=False)
    print_report(meta, all_rows, goals, args.sizes, args, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

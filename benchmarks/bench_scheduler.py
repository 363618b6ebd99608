#!/usr/bin/env python
"""Transparent-scheduler benchmark (issue 4): W2 small-op chains and an attention-decode block.

    python benchmarks/bench_scheduler.py                 # full run (< 120 s on an H200)
    python benchmarks/bench_scheduler.py --quick         # smoke test (fewer reps; scheduler_quick.json)
    python benchmarks/bench_scheduler.py --configs eager gpuos_scheduler --no-decode

W2 = ``iters`` (default 1,000) iterations of the 5-op chain

    x = a + b;  y = x * c;  z = relu(y);  w = sigmoid(z);  out = w / d

on 2,048-element fp32 CUDA tensors (a, b, c, d fixed; 5,000 ops per rep), in these configurations:

    eager                    the Python loop, eager PyTorch
    gpuos_scheduler          the same loop inside one gpuos.scheduler_context(), flushed at exit
    compile                  torch.compile of the 5-op function, called ``iters`` times (compiled in a child
                             process with a timeout; its compile time is the value row ``compile_time_s``)
    compile_reduce_overhead  the same with mode="reduce-overhead" (not run by default here; the suite
                             ``python -m benchmarks`` runs it as W2)
    cudagraph                the whole ``iters``-iteration loop captured once into a torch.cuda.CUDAGraph; replay

Every timed rep: perf_counter around the work, then torch.cuda.synchronize() (H.time_reps; CUDA events give
``median_gpu_ms``). Each config is checked first (its last ``out`` against eager, assert_close) and its row
carries "correct". Value rows ``host_us_per_op`` (one per config, field "for_config"): host time until the
work returned, per op.

decode: the block of examples/decode_block_demo.py (RMSNorm, q/k/v/o projections, softmax attention over a
ring KV cache of 256 slots, SwiGLU MLP; matmuls fall back to eager) for ``--decode-steps`` (default 256)
steps, eager vs gpuos_scheduler; size = KV length.

Goal: W2 under the scheduler >= 2.5x faster than eager (PASS/MISS). Results: benchmarks/results/scheduler.json
(BENCH_SCHEMA.md); the suite writes W2 alone to benchmarks/results/chain.json. Robustness: GPUOS_TIMEOUT_S
defaults to 10 s; every failure is an error row; results are saved after every config; torch.compile runs in
a child process killed at the time budget; a faulthandler watchdog (--watchdog, default 115 s) dumps stacks
and exits if anything hangs outright. Without a CUDA GPU: message, exit 0.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import time

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "scheduler"
W2 = "W2"
TITLE = "mixed chain (1,000 x 5 fp32 ops, n = 2,048)"
DECODE = "decode"
W2_SIZE = 2048
OPS_PER_ITER = 5
CONFIGS = ["eager", "gpuos_scheduler", "compile", "cudagraph", "compile_reduce_overhead"]
DEFAULT_CONFIGS = ["eager", "gpuos_scheduler", "compile", "cudagraph"]
W2_IN_PROCESS = ["eager", "cudagraph", "gpuos_scheduler", "gpuos_program"]
DECODE_CONFIGS = ["eager", "gpuos_scheduler"]
GOAL_VS_EAGER = 2.5
W2_TOL = dict(rtol=1e-5, atol=1e-5)
DECODE_TOL = dict(rtol=1e-4, atol=1e-3)
NOT_APPLICABLE = {
    "foreach": "each op of the chain is one single-tensor op; torch._foreach_* needs lists of independent tensors",
    "gpuos_submit": "gpuos_scheduler runs the same Python loop unchanged (the W1 submit API is measured in W1)",
}
IN_PROCESS_SHARE = 0.25  # of W2's suite budget; the compile child gets the rest
_T_START = time.perf_counter()  # the time budget counts from here (imports included)


log = H.prefixed_log(NAME)


# --------------------------------------------------------------------------------------------------
# workloads
# --------------------------------------------------------------------------------------------------
def w2_step(a, b, c, d):
    x = a + b
    y = x * c
    z = torch.relu(y)
    w = torch.sigmoid(z)
    return w / d


def w2_loop(step, a, b, c, d, iters):
    out = None
    for _ in range(iters):
        out = step(a, b, c, d)
    return out


def w2_inputs(n, seed=1234, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    a, b, c = (torch.randn(n, generator=g).to(device) for _ in range(3))
    d = (torch.rand(n, generator=g) + 0.5).to(device)  # away from 0: out = w / d stays O(1)
    return a, b, c, d


def w2_case(iters: int, device: str = "cuda") -> H.Case:
    """W2 inputs (seeded) and eager's ``out`` (every iteration computes the same one)."""
    a, b, c, d = w2_inputs(W2_SIZE, device=device)
    return H.Case(size=W2_SIZE, ref=w2_step(a, b, c, d), tol=W2_TOL, data=(a, b, c, d),
                  ops_per_rep=iters * OPS_PER_ITER,
                  extra={"iters": iters, "ops_per_iter": OPS_PER_ITER, "dtype": "float32"})


def w2_setups(ctx: H.RunContext, iters: int) -> dict:
    """In-process W2 configurations: {config: setup(case) -> Prepared}."""
    def eager(case: H.Case) -> H.Prepared:
        return H.Prepared(lambda: w2_loop(w2_step, *case.data, iters))

    def cudagraph(case: H.Case) -> H.Prepared:
        g, static_out, ms = H.capture_cuda_graph(lambda: w2_loop(w2_step, *case.data, 3),
                                                 lambda: w2_loop(w2_step, *case.data, iters))

        def fn():
            g.replay()
            return static_out
        return H.Prepared(fn, extra={"capture_ms": H.rnd(ms, 2)})

    sched = H.scheduler_setup(ctx, lambda case: w2_loop(w2_step, *case.data, iters))
    # cudagraph before gpuos_scheduler: nothing of the runtime (worker, timer) is around during the capture
    prog = H.program_setup(ctx, lambda case: (lambda a, b, c, d: w2_loop(w2_step, a, b, c, d, iters)),
                           lambda case: tuple(case.data))  # the whole loop, as the cudagraph peer captures it
    return {"eager": eager, "cudagraph": cudagraph, "gpuos_scheduler": sched, "gpuos_program": prog}


def host_us_rows(rows: list) -> list:
    """``host_us_per_op`` value rows (host time until the work returned, per op) of the W2 timing rows."""
    return [H.value_row(W2, "host_us_per_op", r["host_median_ms"] * 1e3 / r["ops_per_rep"], "us", size=r["size"],
                        for_config=r["config"])
            for r in rows if r.get("workload") == W2 and "median_ms" in r and r.get("ops_per_rep")]


def load_decode_module():
    import importlib.util
    path = H.REPO_ROOT / "examples" / "decode_block_demo.py"
    spec = importlib.util.spec_from_file_location("decode_block_demo", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def decode_case(args) -> H.Case:
    dec = load_decode_module()
    state = dec.make_state("cuda", dim=args.dim, heads=args.heads, kv_len=args.kv_len)
    ref = dec.decode(dec.clone_state(state), args.decode_steps)
    return H.Case(size=args.kv_len, ref=ref, tol=DECODE_TOL, data=(dec, state), ops_per_rep=args.decode_steps,
                  extra={"steps": args.decode_steps, "dim": args.dim, "heads": args.heads, "kv_len": args.kv_len,
                         "dtype": "float32"})


def decode_setups(ctx: H.RunContext, steps: int) -> dict:
    def run(case: H.Case):
        dec, state = case.data
        return dec.decode(dec.clone_state(state), steps)
    return {"eager": lambda case: H.Prepared(lambda: run(case)), "gpuos_scheduler": H.scheduler_setup(ctx, run)}


# --------------------------------------------------------------------------------------------------
# torch.compile peers (child process, see _child.py)
# --------------------------------------------------------------------------------------------------
def compile_child(ctx: H.RunContext, params: dict, emit) -> None:
    iters = params["iters"]
    H.compile_sweep(ctx, W2, [W2_SIZE], lambda _: w2_case(iters, ctx.device), w2_step,
                    lambda case, compiled, mode: H.Prepared(lambda: w2_loop(compiled, *case.data, iters)), emit)


# --------------------------------------------------------------------------------------------------
# the suite's W2 (python -m benchmarks)
# --------------------------------------------------------------------------------------------------
def suite_params(quick: bool) -> dict:
    return {"iters": 200 if quick else 1000, "size": W2_SIZE, "ops_per_iter": OPS_PER_ITER, "dtype": "float32",
            "tolerance": W2_TOL}


def suite_units(params: dict, ctx: H.RunContext) -> int:
    return H.standard_units(1, W2_IN_PROCESS, ctx)


def run_workload(ctx: H.RunContext, params: dict, save) -> list:
    rows = H.run_standard_workload(ctx, W2, "bench_scheduler", [W2_SIZE],
                                   lambda _: w2_case(params["iters"], ctx.device), w2_setups(ctx, params["iters"]),
                                   params, save, IN_PROCESS_SHARE, NOT_APPLICABLE)
    return rows + host_us_rows(rows)


# --------------------------------------------------------------------------------------------------
# goals + report
# --------------------------------------------------------------------------------------------------
def evaluate_goals(rows):
    e = H.find_row(rows, "eager", W2_SIZE, W2)
    s = H.find_row(rows, "gpuos_scheduler", W2_SIZE, W2)
    missing = "no data" if s is None or e is None else (s.get("error") or e.get("error") or "no data")[:80]
    return [H.speedup_goal(f"W2 gpuos_scheduler vs eager, n={W2_SIZE} (x faster)", GOAL_VS_EAGER, e, s, missing)]


def print_report(meta, rows, goals, args, out_path):
    H.print_header("GPUOS scheduler benchmark", meta)
    print(f"W2: {args.iters} x 5 ops on {W2_SIZE} fp32 elements per rep; decode: {args.decode_steps} steps, "
          f"kv {args.kv_len}, dim {args.dim}; {args.reps} reps (+{args.warmup} warm-up); time = host "
          f"perf_counter around work + torch.cuda.synchronize()")
    headers = ["workload", "size", "config", "median ms", "min ms", "max ms", "host ms", "us/op", "vs eager",
               "correct"]
    table = []
    for wl, size, configs in ((W2, W2_SIZE, ["eager", "gpuos_scheduler", "compile", "compile_reduce_overhead",
                                             "cudagraph"]),
                              (DECODE, args.kv_len, DECODE_CONFIGS)):
        eager_ms = H.row_median(H.find_row(rows, "eager", size, wl))
        for cfg in configs:
            row = H.find_row(rows, cfg, size, wl)
            if row is None:
                continue
            if "error" in row:
                table.append([wl, str(size), cfg, "-", "-", "-", "-", "-", "-", "ERROR: " + row["error"][:60]])
                continue
            per = row.get("us_per_op", row.get("us_per_step"))
            table.append([wl, str(size), cfg, row["median_ms"], row["min_ms"], row["max_ms"],
                          row.get("host_median_ms"), per, H.fmt_ratio(H.ratio(eager_ms, row["median_ms"])),
                          "yes" if row.get("correct") else "NO"])
    H.print_table(headers, table, title="Timings (decode: us/op column = us per decode step)", plain=args.plain,
                  align="llrrrrrrrl")
    vals = [r for r in rows if "unit" in r or ("error" in r and r.get("config") in ("compile_time_s",))]
    if vals:
        vt = []
        for r in vals:
            if "error" in r:
                vt.append([r["config"], "-", "-", "-", "ERROR: " + r["error"][:60]])
            else:
                vt.append([r["config"], r.get("for_config", "-"), r["value"], r["unit"], ""])
        H.print_table(["figure", "config", "value", "unit", "note"], vt, title="Figures (W2)", plain=args.plain,
                      align="llrll")
    H.print_goals(goals, args.plain, title="Goal")
    for g in goals:
        print(f"GOAL {g['goal']}: {'PASS' if g['pass'] else 'MISS'} "
              f"({'-' if g['achieved'] is None else H.fmt_ratio(g['achieved'])} vs target {g['target']})")
    print(f"\nresults written to {out_path}")


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = H.new_parser(__doc__)
    p.add_argument("--iters", type=int, default=1000, help="W2 iterations of the 5-op chain per rep (default 1000)")
    H.add_reps_args(p, 10, 3, 2)
    p.add_argument("--quick", action="store_true", help="smoke test: 3 reps, 64 decode steps; scheduler_quick.json")
    H.add_configs_arg(p, CONFIGS, DEFAULT_CONFIGS)
    p.add_argument("--capacity", type=int, default=8192, help="scheduler_context(capacity=...) (default 8192)")
    p.add_argument("--no-decode", action="store_true", help="skip the decode workload")
    p.add_argument("--decode-steps", type=int, default=None, help="decode steps per rep (default 256; --quick 64)")
    p.add_argument("--kv-len", type=int, default=256, help="decode KV-cache length (the decode rows' size)")
    p.add_argument("--dim", type=int, default=512, help="decode model width (default 512)")
    p.add_argument("--heads", type=int, default=8, help="decode attention heads (default 8)")
    p.add_argument("--budget", type=float, default=75.0,
                   help="soft time budget in s (default 75): configs after it become 'skipped' error rows")
    p.add_argument("--config-budget", type=float, default=8.0,
                   help="seconds one config's timed reps may take (default 8): slow configs get fewer reps")
    p.add_argument("--compile-extra", type=float, default=25.0,
                   help="extra seconds past --budget the torch.compile child may use (default 25)")
    H.add_watchdog_arg(p, 115.0)
    H.add_output_args(p, NAME)
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 3 if args.quick else 10
    if args.decode_steps is None:
        args.decode_steps = 64 if args.quick else 256
    args.configs = H.select_configs(args.configs or DEFAULT_CONFIGS, CONFIGS, p.error)
    if args.iters <= 0 or args.reps <= 0 or args.warmup < 0 or args.decode_steps <= 0 or args.kv_len <= 0:
        p.error("--iters, --reps, --decode-steps, --kv-len must be positive, --warmup >= 0")
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GPUOS_TIMEOUT_S", "10")  # a hung GPU wait must not eat the whole run
    H.require_cuda(NAME)  # exits 0 with a message when there is no GPU
    H.start_watchdog(args.watchdog)

    out_path = H.result_path(NAME, args.quick, args.out)
    meta = H.env_metadata(NAME)
    params = {"iters": args.iters, "ops_per_iter": OPS_PER_ITER, "size": W2_SIZE, "reps": args.reps,
              "warmup": args.warmup, "configs": args.configs, "quick": args.quick, "capacity": args.capacity,
              "decode": None if args.no_decode else {"steps": args.decode_steps, "kv_len": args.kv_len,
                                                     "dim": args.dim, "heads": args.heads},
              "tolerances": {"W2": W2_TOL, "decode": DECODE_TOL}, "budget_s": args.budget,
              "cuda": torch.version.cuda, "gpuos_timeout_s": os.environ.get("GPUOS_TIMEOUT_S")}
    log(H.env_line(meta))
    log(f"W2 iters={args.iters} size={W2_SIZE} reps={args.reps} configs={args.configs}")

    gpuos, gpuos_err = H.import_gpuos_package()
    if gpuos is not None:
        try:
            gpuos.init(capacity=args.capacity)
            log(f"gpuos from {gpuos.__file__}; runtime {gpuos.runtime_info()}")
        except Exception as exc:
            gpuos, gpuos_err = None, H.format_exc(exc, 300)
    if gpuos is None:
        log(f"gpuos unavailable ({gpuos_err}); gpuos configs will be error rows")

    rows = []

    def save(partial=True):
        return H.save_results(NAME, meta, rows, out_path, params, partial, goals=evaluate_goals(rows))

    ctx = H.RunContext(budget=H.Budget(args.budget, start=_T_START), reps=args.reps, warmup=args.warmup, min_reps=2,
                       configs=frozenset(args.configs), log=log, gpuos=gpuos, gpuos_err=gpuos_err,
                       capacity=args.capacity, config_cap_s=args.config_budget)
    w2_setup = w2_setups(ctx, args.iters)
    ctx.units_left = sum(ctx.wants(c) for c in w2_setup) + (0 if args.no_decode else len(DECODE_CONFIGS))
    H.peer_sweep(ctx, W2, [W2_SIZE], lambda _: w2_case(args.iters), w2_setup, rows, save)
    g = evaluate_goals(rows)[0]
    log(f"goal so far: {g['goal']}: {'PASS' if g['pass'] else 'MISS'} (achieved {g['achieved']})")
    if not args.no_decode:
        n0 = len(rows)
        H.peer_sweep(ctx, DECODE, [args.kv_len], lambda _: decode_case(args), decode_setups(ctx, args.decode_steps),
                     rows, save)
        for row in rows[n0:]:
            if row.pop("ops_per_rep", None) is not None:
                row["us_per_step"] = row.pop("us_per_op")
    expected = [(W2_SIZE, c) for c, _ in H.COMPILE_MODES if c in args.configs]
    if expected:
        ctx.budget = H.Budget(args.budget + args.compile_extra, start=_T_START)
        rows += H.child_rows(ctx, W2, "bench_scheduler", {"iters": args.iters}, expected)
    rows += host_us_rows(rows)
    params["elapsed_s"] = round(time.perf_counter() - _T_START, 2)
    if gpuos is not None:
        params["final_stats"] = H.gpuos_stats(gpuos) or {}
    goals = evaluate_goals(rows)
    path = save(partial=False)
    faulthandler.cancel_dump_traceback_later()
    print_report(meta, rows, goals, args, path)
    log(f"done in {params['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Transparent-scheduler benchmark (issue 4): W2 small-op chains and an attention-decode block.

    python benchmarks/bench_scheduler.py                 # full run (< 120 s on an H200)
    python benchmarks/bench_scheduler.py --quick         # smoke test (fewer reps; scheduler_quick.json)
    python benchmarks/bench_scheduler.py --configs eager gpuos_scheduler --no-decode

W2 = ``iters`` (default 1,000) iterations of the 5-op chain

    x = a + b;  y = x * c;  z = relu(y);  w = sigmoid(z);  out = w / d

on 2,048-element fp32 CUDA tensors (a, b, c, d fixed; 5,000 ops per rep), in four configurations:

    eager            the Python loop, eager PyTorch
    gpuos_scheduler  the same loop inside one gpuos.scheduler_context(), flushed at exit
    compile          torch.compile of the 5-op function, called ``iters`` times (compiled in a child
                     process with a timeout; its compile time is the value row ``compile_time_s``)
    cudagraph        the whole ``iters``-iteration loop captured once into a torch.cuda.CUDAGraph; replay

Every timed rep: perf_counter around the work, then torch.cuda.synchronize() (C.time_reps). Each config is
checked first (its last ``out`` against eager, assert_close) and its row carries "correct". Value rows
``host_us_per_op`` (one per config, field "for_config"): host time until the work returned, per op.

decode: the block of examples/decode_block_demo.py (RMSNorm, q/k/v/o projections, softmax attention over a
ring KV cache of 256 slots, SwiGLU MLP; matmuls fall back to eager) for ``--decode-steps`` (default 256)
steps, eager vs gpuos_scheduler; size = KV length.

Goal: W2 under the scheduler >= 2.5x faster than eager (PASS/MISS). Results: benchmarks/results/scheduler.json
(BENCH_SCHEMA.md). Robustness: GPUOS_TIMEOUT_S defaults to 10 s; every failure is an error row; results
are saved after every config; torch.compile runs in a child process killed at the time budget; a
faulthandler watchdog (--watchdog, default 115 s) dumps stacks and exits if anything hangs outright.
Without a CUDA GPU: message, exit 0.
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: python benchmarks/bench_scheduler.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import _common as C
else:  # python -m benchmarks.bench_scheduler / import
    from . import _common as C

NAME = "scheduler"
W2 = "W2"
DECODE = "decode"
W2_SIZE = 2048
OPS_PER_ITER = 5
CONFIGS = ["eager", "gpuos_scheduler", "compile", "cudagraph"]
DECODE_CONFIGS = ["eager", "gpuos_scheduler"]
GOAL_VS_EAGER = 2.5
W2_TOL = dict(rtol=1e-5, atol=1e-5)
DECODE_TOL = dict(rtol=1e-4, atol=1e-3)
CHILD_MARK = "@@BENCH_SCHEDULER_CHILD@@"
_T_START = time.perf_counter()  # the time budget counts from here (imports included)


def log(msg: str) -> None:
    print(f"[{NAME}] {msg}", flush=True)


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


def w2_inputs(n, seed=1234):
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    a, b, c = (torch.randn(n, generator=g).cuda() for _ in range(3))
    d = (torch.rand(n, generator=g) + 0.5).cuda()  # away from 0: out = w / d stays O(1)
    return a, b, c, d


def check_close(got, exp, tol):
    import torch
    try:
        torch.testing.assert_close(got, exp, **tol)
        return True, None
    except AssertionError as exc:
        return False, " ".join(str(exc).split())[:400]
    except Exception as exc:  # wrong type / None
        return False, C.format_exc(exc, 400)


def load_decode_module():
    import importlib.util
    path = C.REPO_ROOT / "examples" / "decode_block_demo.py"
    spec = importlib.util.spec_from_file_location("decode_block_demo", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------------------------------
# stats
# --------------------------------------------------------------------------------------------------
def gpuos_stats(gpuos):
    try:
        return gpuos.stats()
    except Exception:
        return None


def stats_delta(before, after):
    """after - before for ints, and per key for dict-valued counters; mean_batch_size as is."""
    if before is None or after is None:
        return None
    out = {}
    for k, v in after.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            dv = v - before.get(k, 0)
            if dv:
                out[k] = dv
        elif isinstance(v, dict):
            dd = {kk: vv - before.get(k, {}).get(kk, 0) for kk, vv in v.items()
                  if isinstance(vv, int) and vv - before.get(k, {}).get(kk, 0)}
            if dd:
                out[k] = dd
    flushes = sum(out.get("flushes_by_cause", {}).values())
    if flushes:
        out["batch_ops_mean"] = round(out.get("ops_intercepted", 0) / flushes, 2)
    return out


# --------------------------------------------------------------------------------------------------
# runner
# --------------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, args, gpuos, gpuos_err, rows, save):
        self.args, self.gpuos, self.gpuos_err, self.rows, self.save = args, gpuos, gpuos_err, rows, save
        self.t_start = _T_START

    def elapsed(self):
        return time.perf_counter() - self.t_start

    def sched_ctx(self):
        return self.gpuos.scheduler_context(capacity=self.args.capacity)

    def record(self, workload, size, config, setup, ops_per_rep, ref, tol, extra=None):
        """setup() -> fn; fn() returns the output checked against ref. Appends timing + host_us rows."""
        import torch
        args = self.args
        if config.startswith("gpuos") and self.gpuos is None:
            self.rows.append(C.error_row(workload, size, config, f"gpuos unavailable: {self.gpuos_err}"))
            log(f"{workload} {config}: ERROR gpuos unavailable")
            return None
        if self.elapsed() > args.budget:
            self.rows.append(C.error_row(workload, size, config, f"skipped: time budget {args.budget:g} s spent"))
            log(f"{workload} {config}: skipped (time budget)")
            return None
        try:
            fn = setup()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            correct, detail = check_close(out, ref, tol)
            del out
            # a very slow config gets fewer reps, so the whole run stays inside its time limit
            reps = max(2, min(args.reps, int(args.config_budget / max(first_s, 1e-6))))
            warmup = args.warmup if first_s * (reps + args.warmup) <= args.config_budget else min(args.warmup, 1)
            st0 = gpuos_stats(self.gpuos) if config.startswith("gpuos") else None
            timing = C.time_reps(fn, reps=reps, warmup=warmup)
            st1 = gpuos_stats(self.gpuos) if config.startswith("gpuos") else None
        except Exception as exc:
            self.rows.append(C.error_row(workload, size, config, exc))
            log(f"{workload} {config}: ERROR {C.format_exc(exc, 300)}")
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            return None
        row = C.timing_row(workload, size, config, timing, correct, ops_per_rep=ops_per_rep,
                           us_per_op=C._r(timing.median_ms * 1e3 / ops_per_rep),
                           host_median_ms=C._r(timing.host_median_ms), **(extra or {}))
        if detail:
            row["correct_detail"] = detail
        d = stats_delta(st0, st1)
        if d:
            row["stats_delta"] = d
        self.rows.append(row)
        host_us = timing.host_median_ms * 1e3 / ops_per_rep
        if workload == W2:
            self.rows.append(C.value_row(workload, "host_us_per_op", host_us, "us", size=size, for_config=config))
        log(f"{workload} {config:<16} median {timing.median_ms:9.3f} ms (min {timing.min_ms:.3f}, "
            f"max {timing.max_ms:.3f}) host {timing.host_median_ms:.3f} ms = {host_us:.3f} us/op "
            f"correct={correct}")
        self.save(partial=True)
        return row

    # ---------------------------------------------------------------- W2
    def run_w2(self):
        import torch
        args = self.args
        n, iters = W2_SIZE, args.iters
        ops = iters * OPS_PER_ITER
        a, b, c, d = w2_inputs(n)
        ref = w2_step(a, b, c, d)
        torch.cuda.synchronize()
        extra = {"iters": iters, "ops_per_iter": OPS_PER_ITER, "dtype": "float32"}
        keep = []

        def setup_eager():
            return lambda: w2_loop(w2_step, a, b, c, d, iters)

        def setup_sched():
            def fn():
                with self.sched_ctx():
                    out = w2_loop(w2_step, a, b, c, d, iters)
                return out
            return fn

        def setup_graph():
            g, static_out, ms = C.capture_cuda_graph(lambda: w2_loop(w2_step, a, b, c, d, 3),
                                                     lambda: w2_loop(w2_step, a, b, c, d, iters))
            extra_g["capture_ms"] = C._r(ms, 2)
            keep.append(g)

            def fn():
                g.replay()
                return static_out
            return fn

        extra_g = dict(extra)
        # cudagraph before gpuos_scheduler: nothing of the runtime (worker, timer) is around during the capture
        for config in [c for c in ("eager", "cudagraph", "gpuos_scheduler") if c in args.configs]:
            if config == "eager":
                self.record(W2, n, "eager", setup_eager, ops, ref, W2_TOL, extra)
            elif config == "cudagraph":
                self.record(W2, n, "cudagraph", setup_graph, ops, ref, W2_TOL, extra_g)
                keep.clear()
            elif config == "gpuos_scheduler":
                self.record(W2, n, "gpuos_scheduler", setup_sched, ops, ref, W2_TOL,
                            dict(extra, capacity=args.capacity))
        del a, b, c, d
        gc.collect()

    def run_w2_compile(self):
        """torch.compile in a child process (killed at the budget): a slow or crashing compile costs a row."""
        args = self.args
        n = W2_SIZE
        remaining = args.budget + args.compile_extra - self.elapsed()
        if remaining < 10:
            self.rows.append(C.error_row(W2, n, "compile", f"skipped: time budget ({self.elapsed():.0f} s used)"))
            self.rows.append(C.error_row(W2, n, "compile_time_s", "skipped: time budget"))
            log("W2 compile: skipped (time budget)")
            return
        cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-child", "--iters", str(args.iters),
               "--reps", str(args.reps), "--warmup", str(args.warmup)]
        log(f"W2 compile: child process, timeout {remaining:.0f} s")
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=remaining, env=dict(os.environ))
        except subprocess.TimeoutExpired:
            self.rows.append(C.error_row(W2, n, "compile", f"torch.compile child timed out after {remaining:.0f} s"))
            self.rows.append(C.error_row(W2, n, "compile_time_s", "timed out"))
            log("W2 compile: ERROR timed out")
            return
        rows = None
        for line in res.stdout.splitlines():
            if line.startswith(CHILD_MARK):
                try:
                    rows = json.loads(line[len(CHILD_MARK):])
                except ValueError:
                    rows = None
        if rows is None:
            tail = (res.stderr or res.stdout or "").strip().splitlines()[-5:]
            why = f"child exited {res.returncode} without results: " + " | ".join(tail)
            self.rows.append(C.error_row(W2, n, "compile", why))
            self.rows.append(C.error_row(W2, n, "compile_time_s", why))
            log(f"W2 compile: ERROR {why[:300]}")
            return
        for r in rows:
            self.rows.append(r)
            if "error" in r:
                log(f"W2 {r['config']}: ERROR {r['error'][:300]}")
            elif "value" in r:
                log(f"W2 {r['config']} = {r['value']} {r['unit']}" +
                    (f" ({r['for_config']})" if r.get("for_config") else ""))
            else:
                log(f"W2 compile           median {r['median_ms']:9.3f} ms (min {r['min_ms']:.3f}, "
                    f"max {r['max_ms']:.3f}) host {r.get('host_median_ms')} ms correct={r.get('correct')}")
        self.save(partial=True)

    # ---------------------------------------------------------------- decode
    def run_decode(self):
        import torch
        args = self.args
        size = args.kv_len
        try:
            dec = load_decode_module()
            state = dec.make_state("cuda", dim=args.dim, heads=args.heads, kv_len=args.kv_len)
            ref = dec.decode(dec.clone_state(state), args.decode_steps)
            torch.cuda.synchronize()
        except Exception as exc:
            for cfg in DECODE_CONFIGS:
                self.rows.append(C.error_row(DECODE, size, cfg, exc))
            log(f"decode: ERROR {C.format_exc(exc, 300)}")
            return
        steps = args.decode_steps
        extra = {"steps": steps, "dim": args.dim, "heads": args.heads, "kv_len": args.kv_len, "dtype": "float32"}

        def setup_eager():
            return lambda: dec.decode(dec.clone_state(state), steps)

        def setup_sched():
            def fn():
                st = dec.clone_state(state)
                with self.sched_ctx():
                    out = dec.decode(st, steps)
                return out
            return fn

        for config in DECODE_CONFIGS:
            if config not in args.configs:
                continue
            row = self.record(DECODE, size, config, setup_eager if config == "eager" else setup_sched, steps, ref,
                              DECODE_TOL, dict(extra))
            if row is not None:
                row["us_per_step"] = row.pop("us_per_op")
        del state, ref
        gc.collect()


# --------------------------------------------------------------------------------------------------
# compile child
# --------------------------------------------------------------------------------------------------
def compile_child(args) -> int:
    """Runs in a child process: compile, check, time; prints CHILD_MARK + JSON rows."""
    import torch
    n, iters = W2_SIZE, args.iters
    ops = iters * OPS_PER_ITER
    rows = []
    try:
        a, b, c, d = w2_inputs(n)
        ref = w2_step(a, b, c, d)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cstep = torch.compile(w2_step)
        out = cstep(a, b, c, d)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        correct, detail = check_close(out, ref, W2_TOL)
        timing = C.time_reps(lambda: w2_loop(cstep, a, b, c, d, iters), reps=args.reps, warmup=args.warmup)
        row = C.timing_row(W2, n, "compile", timing, correct, ops_per_rep=ops,
                           us_per_op=C._r(timing.median_ms * 1e3 / ops), host_median_ms=C._r(timing.host_median_ms),
                           iters=iters, ops_per_iter=OPS_PER_ITER, dtype="float32", mode="default")
        if detail:
            row["correct_detail"] = detail
        rows.append(row)
        rows.append(C.value_row(W2, "compile_time_s", compile_s, "s", size=n))
        rows.append(C.value_row(W2, "host_us_per_op", timing.host_median_ms * 1e3 / ops, "us", size=n,
                                for_config="compile"))
    except Exception as exc:
        rows = [C.error_row(W2, n, "compile", exc), C.error_row(W2, n, "compile_time_s", exc)]
    print(CHILD_MARK + json.dumps(C.sanitize(rows)), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------
# goals + report
# --------------------------------------------------------------------------------------------------
def _ratio(num, den):
    if num is None or den is None or den <= 0:
        return None
    return num / den


def evaluate_goals(rows):
    e = C.find_row(rows, "eager", W2_SIZE, W2)
    s = C.find_row(rows, "gpuos_scheduler", W2_SIZE, W2)
    r = _ratio(C.row_median(e), C.row_median(s))
    name = f"W2 gpuos_scheduler vs eager, n={W2_SIZE} (x faster)"
    target = f">= {GOAL_VS_EAGER:g}x"
    if r is None:
        note = "no data" if s is None or e is None else (s.get("error") or e.get("error") or "no data")[:80]
        return [{"goal": name, "target": target, "achieved": None, "pass": False, "note": note}]
    bad = s.get("correct") is False
    return [{"goal": name, "target": target, "achieved": C._r(r), "pass": bool(r >= GOAL_VS_EAGER and not bad),
             "note": "results incorrect" if bad else ""}]


def print_report(meta, rows, goals, args, out_path):
    print()
    print(f"GPUOS scheduler benchmark: {meta['device']}  driver {meta['driver']}  torch {meta['torch']}  "
          f"gpuos {meta['gpuos']}  {meta['date']}")
    print(f"W2: {args.iters} x 5 ops on {W2_SIZE} fp32 elements per rep; decode: {args.decode_steps} steps, "
          f"kv {args.kv_len}, dim {args.dim}; {args.reps} reps (+{args.warmup} warm-up); time = host "
          f"perf_counter around work + torch.cuda.synchronize()")
    headers = ["workload", "size", "config", "median ms", "min ms", "max ms", "host ms", "us/op", "vs eager",
               "correct"]
    table = []
    for wl, size, configs in ((W2, W2_SIZE, ["eager", "gpuos_scheduler", "compile", "cudagraph"]),
                              (DECODE, args.kv_len, DECODE_CONFIGS)):
        eager_ms = C.row_median(C.find_row(rows, "eager", size, wl))
        for cfg in configs:
            row = C.find_row(rows, cfg, size, wl)
            if row is None:
                continue
            if "error" in row:
                table.append([wl, str(size), cfg, "-", "-", "-", "-", "-", "-", "ERROR: " + row["error"][:60]])
                continue
            per = row.get("us_per_op", row.get("us_per_step"))
            table.append([wl, str(size), cfg, row["median_ms"], row["min_ms"], row["max_ms"],
                          row.get("host_median_ms"), per, C.fmt_ratio(_ratio(eager_ms, row["median_ms"])),
                          "yes" if row.get("correct") else "NO"])
    C.print_table(headers, table, title="Timings (decode: us/op column = us per decode step)", plain=args.plain,
                  align="llrrrrrrrl")
    vals = [r for r in rows if "unit" in r or ("error" in r and r.get("config") in ("compile_time_s",))]
    if vals:
        vt = []
        for r in vals:
            if "error" in r:
                vt.append([r["config"], "-", "-", "-", "ERROR: " + r["error"][:60]])
            else:
                vt.append([r["config"], r.get("for_config", "-"), r["value"], r["unit"], ""])
        C.print_table(["figure", "config", "value", "unit", "note"], vt, title="Figures (W2)", plain=args.plain,
                      align="llrll")
    gt = []
    for g in goals:
        ach = "-" if g["achieved"] is None else C.fmt_ratio(g["achieved"])
        gt.append([g["goal"], g["target"], ach, ("PASS" if g["pass"] else "MISS") + (f" ({g['note']})" if g["note"]
                                                                                     else "")])
    C.print_table(["goal", "target", "achieved", "result"], gt, title="Goal", plain=args.plain, align="lrrl")
    for g in goals:
        print(f"GOAL {g['goal']}: {'PASS' if g['pass'] else 'MISS'} "
              f"({'-' if g['achieved'] is None else C.fmt_ratio(g['achieved'])} vs target {g['target']})")
    print(f"\nresults written to {out_path}")


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=1000, help="W2 iterations of the 5-op chain per rep (default 1000)")
    p.add_argument("--reps", type=int, default=None, help="timed reps per config (default 10; --quick 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up reps per config (default 2)")
    p.add_argument("--quick", action="store_true", help="smoke test: 3 reps, 64 decode steps; scheduler_quick.json")
    p.add_argument("--configs", nargs="+", default=None, help=f"subset of {' '.join(CONFIGS)}")
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
    p.add_argument("--watchdog", type=float, default=115.0,
                   help="hard limit in s (default 115; 0 = off): dump stacks and exit if the run hangs")
    p.add_argument("--out", default=None, help="result file (default benchmarks/results/scheduler.json)")
    p.add_argument("--plain", action="store_true", help="plain-text tables even if rich is installed")
    p.add_argument("--compile-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 3 if args.quick else 10
    if args.decode_steps is None:
        args.decode_steps = 64 if args.quick else 256
    args.configs = C.select_configs(args.configs, CONFIGS, p.error)
    if args.iters <= 0 or args.reps <= 0 or args.warmup < 0 or args.decode_steps <= 0 or args.kv_len <= 0:
        p.error("--iters, --reps, --decode-steps, --kv-len must be positive, --warmup >= 0")
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GPUOS_TIMEOUT_S", "10")  # a hung GPU wait must not eat the whole run
    C.require_cuda(NAME)  # exits 0 with a message when there is no GPU
    faulthandler.enable()
    if args.compile_child:
        return compile_child(args)
    if args.watchdog and args.watchdog > 0:
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    import torch

    out_path = Path(args.out) if args.out else C.RESULTS_DIR / (f"{NAME}_quick.json" if args.quick
                                                                else f"{NAME}.json")
    meta = C.env_metadata(NAME)
    params = {"iters": args.iters, "ops_per_iter": OPS_PER_ITER, "size": W2_SIZE, "reps": args.reps,
              "warmup": args.warmup, "configs": args.configs, "quick": args.quick, "capacity": args.capacity,
              "decode": None if args.no_decode else {"steps": args.decode_steps, "kv_len": args.kv_len,
                                                     "dim": args.dim, "heads": args.heads},
              "tolerances": {"W2": W2_TOL, "decode": DECODE_TOL}, "budget_s": args.budget,
              "cuda": torch.version.cuda, "gpuos_timeout_s": os.environ.get("GPUOS_TIMEOUT_S")}
    log(f"{meta['device']} | driver {meta['driver']} | torch {meta['torch']} | gpuos {meta['gpuos']}")
    log(f"W2 iters={args.iters} size={W2_SIZE} reps={args.reps} configs={args.configs}")

    C.ensure_repo_on_path()
    gpuos, gpuos_err = None, None
    try:
        import gpuos as _g
        _g.init(capacity=args.capacity)
        gpuos = _g
        log(f"gpuos from {_g.__file__}; runtime {_g.runtime_info()}")
    except Exception as exc:
        gpuos_err = C.format_exc(exc, 300)
        log(f"gpuos unavailable ({gpuos_err}); gpuos configs will be error rows")

    rows = []

    def save(partial):
        extra = {"params": params, "goals": evaluate_goals(rows)}
        if partial:
            extra["partial"] = True
        return C.write_results(NAME, meta, rows, path=out_path, **extra)

    runner = Runner(args, gpuos, gpuos_err, rows, save)
    for section in (runner.run_w2, None if args.no_decode else runner.run_decode,
                    runner.run_w2_compile if "compile" in args.configs else None):
        if section is None:
            continue
        try:
            section()
        except Exception as exc:  # should not happen: every config catches its own errors
            log(f"{section.__name__}: ERROR {C.format_exc(exc, 300)}")
            rows.append(C.error_row("all", None, section.__name__, exc))
        save(partial=True)
        g = evaluate_goals(rows)[0]
        if section == runner.run_w2:
            log(f"goal so far: {g['goal']}: {'PASS' if g['pass'] else 'MISS'} (achieved {g['achieved']})")
    params["elapsed_s"] = round(runner.elapsed(), 2)
    if gpuos is not None:
        params["final_stats"] = {k: v for k, v in (gpuos_stats(gpuos) or {}).items()}
    goals = evaluate_goals(rows)
    path = save(partial=False)
    faulthandler.cancel_dump_traceback_later()
    print_report(meta, rows, goals, args, path)
    log(f"done in {runner.elapsed():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

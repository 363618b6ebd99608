#!/usr/bin/env python
"""The GPUOS peer benchmark suite: every workload against every applicable peer, in one command (issue 6).

    python -m benchmarks                      # = python benchmarks/run_all.py; all of W1..W6 (< 9 min, H200)
    python -m benchmarks --quick              # smoke run: fewer sizes and steps, 5 reps (*_quick.json)
    python -m benchmarks --only W4 W5 --reps 30
    python -m benchmarks --configs eager cudagraph gpuos_scheduler     # a subset of the peers

Workloads (one module each, each also runnable alone): W1 microbatch (bench_microbatch: 10,000 independent
adds), W2 mixed chain (bench_scheduler: 1,000 x 5 ops), W3 last-dim reductions (bench_reduce), W4 attention
decode (bench_decode), W5 MLP block (bench_mlp), W6 dynamic shapes (bench_dynamic), W7 Hugging Face GPT-2 / Llama
decode (bench_models); FC = first-call costs.
Peers: eager, cudagraph, compile, compile_reduce_overhead, foreach (W1), gpuos_submit / gpuos_submit_many
(W1), gpuos_submit_reduce (W3), gpuos_scheduler. A peer that cannot run a workload gets a row saying why.

Per configuration: a correctness check against eager first (the row's "correct"), then warm-up and
``--reps`` (default 20) timed reps: median / min / max wall ms (perf_counter around the work and
torch.cuda.synchronize()), ``host_median_ms`` (until the work returned) and ``median_gpu_ms`` (CUDA events
around the work on the current stream). torch.compile peers run in a child process per workload and mode,
killed at the workload's time budget (fresh TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR: compiles are cold).

Time budget: ``--budget-s`` (default 480) is shared by the workloads in proportion to their weights, unused
time passing on; a late configuration gets fewer reps (row field ``reps_note``) or an error row
"time budget". Each JSON is written as soon as its workload is done: benchmarks/results/<name>.json
(BENCH_SCHEMA.md), then first_call.json (compile times, CUDA-graph capture, GPUOS JIT cold and warm start),
then PNG plots (benchmarks/plots.py; skipped with a message without matplotlib). README's results block is
regenerated from the JSON by ``python benchmarks/report.py``. Without a CUDA GPU: a message, exit 0
(``--allow-cpu`` runs the eager and compile peers on the CPU to debug the harness; the numbers mean nothing).
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "run_all"
# workload -> (result file, module, weight in the time budget)
WORKLOADS = {
    "W1": ("microbatch", "bench_microbatch", 90),
    "W2": ("chain", "bench_scheduler", 35),
    "W3": ("reduce", "bench_reduce", 50),
    "W4": ("decode", "bench_decode", 55),
    "W5": ("mlp", "bench_mlp", 75),
    "W6": ("dynamic", "bench_dynamic", 50),
    "W7": ("models", "bench_models", 90),
}
FIRST_CALL = "FC"
DEFAULT_BUDGET_S = 480.0
END_RESERVE_S = 25.0  # kept for the warm JIT probe, first_call.json and the plots
ALL_CONFIGS = ("eager", "eager_out", "foreach", "cudagraph", "compile", "compile_reduce_overhead", "gpuos_submit",
               "gpuos_submit_many", "gpuos_submit_reduce", "eager_softmax", "gpuos_softmax", "gpuos_scheduler",
               "gpuos_scheduler_worker_mm", "gpuos_scheduler_worker", "gpuos_program")
JIT_MARK = "@@GPUOS_JIT@@"
JIT_PROBE = ("import faulthandler, json, time\nfaulthandler.dump_traceback_later(150, exit=True)\n"
             "t0 = time.perf_counter()\nimport gpuos\nt1 = time.perf_counter()\ngpuos.init()\n"
             "t2 = time.perf_counter()\ns = gpuos.stats()\n"
             f"print({JIT_MARK!r} + json.dumps({{'import_s': t1 - t0, 'init_s': t2 - t1, "
             "'jit_compiles': s.get('jit_compiles'), 'disk_cache_hits': s.get('disk_cache_hits')}), flush=True)\n"
             "gpuos.shutdown()\n")


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="smoke run: fewer sizes / steps, 5 reps; *_quick.json")
    p.add_argument("--only", nargs="+", metavar="W", default=None,
                   help=f"workloads to run, of {' '.join(WORKLOADS)} {FIRST_CALL} (FC = the GPUOS JIT probe and "
                        f"first_call.json; default: all)")
    p.add_argument("--reps", type=int, default=None, help="timed reps per config (default 20; --quick 5)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up reps per config (default 2)")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"time budget of the whole run in s (default {DEFAULT_BUDGET_S:g}); late configs get "
                        f"fewer reps or 'time budget' error rows")
    p.add_argument("--configs", nargs="+", default=None, help=f"peers to run (default all): {' '.join(ALL_CONFIGS)}")
    p.add_argument("--out-dir", default=None, help="where the JSON and PNG files go (default benchmarks/results)")
    p.add_argument("--progress", choices=("auto", "rich", "tqdm", "plain"), default="auto",
                   help="progress display (auto: rich or tqdm on a terminal, else plain lines)")
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.add_argument("--allow-cpu", action="store_true",
                   help="debug the harness without a GPU: eager / compile peers on CPU tensors (numbers mean nothing)")
    args = p.parse_args(argv)
    only = [w.upper() for v in (args.only or []) for w in v.replace(",", " ").split()]
    bad = [w for w in only if w not in WORKLOADS and w != FIRST_CALL]
    if bad:
        p.error(f"unknown workload(s) {bad}; choose from {list(WORKLOADS) + [FIRST_CALL]}")
    args.only = only or list(WORKLOADS) + [FIRST_CALL]
    args.configs = H.select_configs(args.configs, ALL_CONFIGS, p.error) if args.configs else None
    if args.reps is None:
        args.reps = 5 if args.quick else 20
    if args.reps <= 0 or args.warmup < 0 or args.budget_s <= 0:
        p.error("--reps and --budget-s must be positive, --warmup >= 0")
    return args


# --------------------------------------------------------------------------------------------------
# GPUOS JIT probe: cold and warm start in child processes
# --------------------------------------------------------------------------------------------------
def start_jit_probe(cache_dir: Path, forbid_compile: bool) -> tuple:
    """Start ``import gpuos; gpuos.init()`` in a child with GPUOS_CACHE_DIR=cache_dir (stderr to a file, so
    a chatty child never blocks on a full pipe while the suite runs)."""
    env = dict(os.environ, GPUOS_CACHE_DIR=str(cache_dir))
    if forbid_compile:
        env["GPUOS_FORBID_COMPILE"] = "1"
    else:
        env.pop("GPUOS_FORBID_COMPILE", None)
    cache_dir.mkdir(parents=True, exist_ok=True)
    err_path = cache_dir.parent / f"probe{'_warm' if forbid_compile else '_cold'}.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", JIT_PROBE], cwd=str(H.REPO_ROOT), env=env, text=True,
                                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    return proc, time.perf_counter(), err_path


def finish_jit_probe(started: tuple, config: str, timeout_s: float, **extra: Any) -> dict:
    """Wait for a probe (at most timeout_s) and turn its report into a value row (or an error row)."""
    proc, t0, err_path = started
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return H.error_row("gpuos", None, config, f"time budget: the probe did not finish in {timeout_s:.0f} s",
                           **extra)
    wall = time.perf_counter() - t0
    err = err_path.read_text(errors="replace") if err_path.exists() else ""
    rep = None
    for line in (out or "").splitlines():
        if line.startswith(JIT_MARK):
            rep = json.loads(line[len(JIT_MARK):])
    if rep is None or proc.returncode != 0:
        tail = " | ".join((err or out or "").strip().splitlines()[-3:])
        return H.error_row("gpuos", None, config, f"probe exited with status {proc.returncode}: {tail[:400]}",
                           **extra)
    compiles = rep.get("jit_compiles")
    correct = (compiles == 0) if extra.get("forbid_compile") else (compiles is not None and compiles >= 1)
    return H.value_row("gpuos", config, rep["init_s"], "s", process_s=H.rnd(wall, 3),
                       import_s=H.rnd(rep["import_s"], 3), jit_compiles=compiles,
                       disk_cache_hits=rep.get("disk_cache_hits"), correct=correct, **extra)


def first_call_rows(docs: dict) -> list:
    """First-call costs gathered from the workloads' rows: compile time per workload and mode (first size),
    CUDA-graph capture (first size; W6: all recaptures)."""
    out = []
    for workload, doc in docs.items():
        rows = doc["rows"]
        for r in rows:
            if r.get("config") == "compile_time_s" and r.get("first_size") and "value" in r:
                out.append(H.value_row(workload, "compile_time_s", r["value"], "s", size=r.get("size"),
                                       for_config=r.get("for_config"), first_call_s=r.get("first_call_s"),
                                       inductor_cache=r.get("inductor_cache")))
        graphs = [r for r in rows if r.get("config") == "cudagraph" and "median_ms" in r]
        captured = {r["size"]: r["capture_ms"] for r in graphs if r.get("capture_ms") is not None}
        if captured:
            size, ms = next(iter(captured.items()))
            out.append(H.value_row(workload, "cudagraph_capture_ms", ms, "ms", size=size, all_sizes=captured))
        for r in graphs:
            if r.get("capture_ms_total") is not None:
                out.append(H.value_row(workload, "cudagraph_capture_ms", r["capture_ms_total"], "ms", size=r["size"],
                                       captures=r.get("captures"), note="every recapture of the run"))
    return out


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def main(argv: Optional[list] = None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    why = H.no_cuda_reason()
    if why and not args.allow_cpu:
        print(f"[benchmarks] no CUDA GPU available: {why}. Nothing to benchmark; run `python -m benchmarks` on a "
              f"machine with an NVIDIA GPU (--allow-cpu debugs the harness on the CPU). (exit 0)")
        return 0
    device = "cpu" if why else "cuda"
    os.environ.setdefault("GPUOS_TIMEOUT_S", "10")  # a hung GPU wait must not eat the whole run
    faulthandler.enable(file=sys.__stderr__)
    # a hang still ends (with every thread's stack) before the GPU machine's 10-minute limit
    faulthandler.dump_traceback_later(args.budget_s + 60, exit=True, file=sys.__stderr__)
    out_dir = Path(args.out_dir) if args.out_dir else H.RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    budget = H.Budget(args.budget_s, start=t_start)
    scratch = Path(tempfile.mkdtemp(prefix="gpuos-bench-"))  # the JIT probes' GPUOS_CACHE_DIR
    import torch

    workloads = [w for w in WORKLOADS if w in args.only]
    fc = FIRST_CALL in args.only
    jit_cold = start_jit_probe(scratch / "jit", False) if fc and device == "cuda" else None

    gpuos, gpuos_err, init_s = None, "CPU debug run" if device != "cuda" else None, None
    if device == "cuda":
        gpuos, gpuos_err = H.import_gpuos_package()
        if gpuos is not None:
            try:
                t0 = time.perf_counter()
                gpuos.init()
                init_s = time.perf_counter() - t0
            except Exception as exc:
                gpuos, gpuos_err = None, f"init failed: {H.format_exc(exc, 300)}"
    modules = {w: importlib.import_module(f"benchmarks.{WORKLOADS[w][1]}") for w in workloads}
    params = {w: modules[w].suite_params(args.quick) for w in workloads}
    ctx_base = dict(reps=args.reps, warmup=args.warmup, quick=args.quick, device=device,
                    configs=frozenset(args.configs) if args.configs else None, gpuos=gpuos, gpuos_err=gpuos_err)
    probe = H.RunContext(budget=budget, **ctx_base)
    units = {w: modules[w].suite_units(params[w], probe) for w in workloads}
    progress = H.Progress(sum(units.values()) + int(fc), kind=args.progress, desc="benchmarks")
    log = progress.log
    log(f"[benchmarks] {H.device_name()} | driver {H.driver_version()} | torch {torch.__version__} | "
        f"gpuos {H.git_sha()} | budget {args.budget_s:.0f} s | reps {args.reps} | workloads {' '.join(args.only)}")
    if gpuos is None:
        log(f"[benchmarks] gpuos unavailable ({gpuos_err}): its configs become error rows")

    docs: dict = {}
    try:
        for i, w in enumerate(workloads):
            name, module, _ = WORKLOADS[w]
            left = sum(WORKLOADS[v][2] for v in workloads[i:])
            seconds = max(0.0, budget.remaining() - (END_RESERVE_S if fc else 5.0)) * WORKLOADS[w][2] / left
            ctx = H.RunContext(budget=H.Budget(seconds), log=log, progress=progress, **ctx_base)
            meta = H.env_metadata(name)
            path = out_dir / f"{name}{suffix}.json"
            done_before = progress.done
            suite = {"workload": w, "title": modules[w].TITLE, "budget_s": round(seconds, 1), "reps": args.reps,
                     "warmup": args.warmup,
                     "quick": args.quick, "configs": args.configs, "device": device}

            def save(rows: list, partial: bool = True) -> Path:
                return H.write_results(name, meta, rows, path=path, params=params[w], suite=suite,
                                       **({"partial": True} if partial else {}))
            log(f"[benchmarks] {w} {name}: {modules[w].TITLE}; budget {seconds:.0f} s")
            t0 = time.perf_counter()
            try:
                rows = modules[w].run_workload(ctx, params[w], save)
            except Exception as exc:  # a workload that breaks costs its rows, never the suite
                log(f"[benchmarks] {w}: ERROR {H.format_exc(exc, 400)}")
                rows = [H.error_row(w, None, "all", exc)]
            if ctx.gpuos is None and ctx_base["gpuos"] is not None:  # gpuos failed for good: tell later workloads
                ctx_base.update(gpuos=None, gpuos_err=ctx.gpuos_err)
            suite["elapsed_s"] = round(time.perf_counter() - t0, 1)
            save(rows, partial=False)
            docs[w] = {"name": name, "rows": rows, "device": meta.get("device"), "gpuos": meta.get("gpuos")}
            progress.advance(f"{w} done", max(0, done_before + units[w] - progress.done))
            log(f"[benchmarks] {w} written to {path} ({suite['elapsed_s']} s)")

        if fc:
            rows = first_call_rows(docs)
            if init_s is not None:
                rows.append(H.value_row("gpuos", "gpuos_init_s", init_s, "s",
                                        note="this process's first gpuos.init(), with the cache as it was"))
            if jit_cold is not None:
                rows.append(finish_jit_probe(jit_cold, "gpuos_jit_cold_s", max(20.0, budget.remaining()),
                                             cache="fresh GPUOS_CACHE_DIR", forbid_compile=False,
                                             note="started with the suite; ran beside the first workload"))
                warm = start_jit_probe(scratch / "jit", True)
                rows.append(finish_jit_probe(warm, "gpuos_jit_warm_s", max(20.0, budget.remaining()),
                                             cache="the cold probe's GPUOS_CACHE_DIR", forbid_compile=True))
            elif device != "cuda":
                rows.append(H.error_row("gpuos", None, "gpuos_jit_cold_s", "needs CUDA (this is a CPU debug run)"))
            path = H.write_results("first_call", H.env_metadata("first_call"), rows,
                                   path=out_dir / f"first_call{suffix}.json")
            progress.advance("first-call costs")
            log(f"[benchmarks] first-call costs written to {path}")
    finally:
        progress.close()
        shutil.rmtree(scratch, ignore_errors=True)
        faulthandler.cancel_dump_traceback_later()

    if not args.no_plots:
        from benchmarks import plots
        plots.main(["--results", str(out_dir)] + (["--quick"] if args.quick else []))
    from benchmarks import report
    print()
    for line in report.summary_lines([dict(d, benchmark=d["name"]) for d in docs.values()]):
        print(line)
    print(f"\n[benchmarks] done in {time.perf_counter() - t_start:.0f} s; README block: python benchmarks/report.py")
    return 0


def standalone_main(workload: str, argv: Optional[list] = None) -> int:
    """``python benchmarks/bench_<x>.py [options]`` = ``python -m benchmarks --only <workload> [options]``."""
    return main(["--only", workload] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

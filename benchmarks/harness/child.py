"""torch.compile peers in a child process with a timeout: the parent side (run_child, child_rows) and the
child side (compile_sweep, emit_row; entry point benchmarks/_child.py), with dynamo's counters and reset.

Imports: env, timing, rows, results, suite.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

from .env import REPO_ROOT
from .results import json_default, sanitize
from .rows import error_row, format_exc, value_row
from .suite import Case, Prepared, RunContext, measure_config
from .timing import release_memory

COMPILE_MODES = (("compile", "default"), ("compile_reduce_overhead", "reduce-overhead"))
CHILD_MARK = "@@GPUOS_BENCH_ROW@@"
MIN_CHILD_S = 20.0  # a compile child is not started with less time than this


def emit_row(row: dict) -> None:
    """Child side: hand one row to the parent (one marked JSON line, flushed at once)."""
    print(CHILD_MARK + json.dumps(sanitize(row), default=json_default), flush=True)


def run_child(module: str, params: dict, timeout_s: float, env: Optional[dict] = None) -> tuple:
    """Parent side: run ``python -m benchmarks._child <module> <params>`` for at most ``timeout_s``.

    Returns (rows, problem): the rows the child emitted (also those before a timeout or a crash) and
    None, or a text saying why it stopped early. The child runs in its own process group, killed
    whole at the timeout (torch.compile's worker processes included).
    """
    import signal
    cmd = [sys.executable, "-m", "benchmarks._child", module, json.dumps(params)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    problem = None
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        out, err = proc.communicate()
        problem = f"time budget: the torch.compile child was stopped after {timeout_s:.0f} s"
    rows = []
    for line in (out or "").splitlines():
        if line.startswith(CHILD_MARK):
            try:
                rows.append(json.loads(line[len(CHILD_MARK):]))
            except ValueError:
                pass
    if problem is None and proc.returncode != 0:
        tail = " | ".join((err or out or "").strip().splitlines()[-4:])
        problem = f"torch.compile child exited with status {proc.returncode}: {tail[:400]}"
    return rows, problem


def child_rows(ctx: RunContext, workload: str, module: str, params: dict, expected: Sequence[tuple]) -> list:
    """Run a workload's torch.compile peers in one child process (fresh, private TORCHINDUCTOR_CACHE_DIR and
    TRITON_CACHE_DIR, so the first mode's compiles are cold), killed when the context's budget is spent.
    Every expected (size, config) that did not come back becomes an error row saying why (time budget,
    crash)."""
    import tempfile
    timeout = ctx.budget.remaining()
    order = [c for c, _ in COMPILE_MODES]
    configs = sorted({c for _, c in expected}, key=lambda c: order.index(c) if c in order else len(order))
    if timeout < MIN_CHILD_S:
        rows: list = []
        problem = f"time budget: {max(0.0, timeout):.0f} s left, a torch.compile child needs {MIN_CHILD_S:.0f} s"
    else:
        p = dict(params)
        p.update({"reps": ctx.reps, "warmup": ctx.warmup, "min_reps": ctx.min_reps, "quick": ctx.quick,
                  "device": ctx.device, "budget_s": timeout - 3.0, "configs": configs})
        ctx.log(f"{workload}: {' and '.join(configs)} in a child process (at most {timeout:.0f} s)")
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="gpuos-bench-compile-") as tmp:
            env = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"),
                   "TRITON_CACHE_DIR": os.path.join(tmp, "triton")}
            rows, problem = run_child(module, p, timeout, env=env)
        ctx.log(f"{workload}: compile child returned {len(rows)} rows in {time.perf_counter() - t0:.1f} s"
                + (f" ({problem})" if problem else ""))
    seen = {(r.get("size"), r.get("config")) for r in rows}
    rows += [error_row(workload, size, c, problem or "the compile child returned no row")
             for size, c in expected if (size, c) not in seen]
    for size, c in expected:
        ctx.advance(f"{workload} {size} {c}")
    return rows


def reset_dynamo() -> None:
    """Forget every compiled graph (each compile mode starts cold) and allow enough recompiles that no
    size silently falls back to eager."""
    import torch
    torch._dynamo.reset()
    try:
        torch._dynamo.config.recompile_limit = 64
    except Exception:  # older torch: cache_size_limit
        torch._dynamo.config.cache_size_limit = 64


def mark_static(*tensors) -> None:
    """Tell torch.compile(mode="reduce-overhead") that these inputs keep their address (weights, caches):
    its CUDA graphs then read them in place instead of copying them in on every replay."""
    import torch
    for t in tensors:
        torch._dynamo.mark_static_address(t)


class CompileCounters:
    """Context manager: graphs dynamo compiled, CUDA graphs cudagraph-trees recorded, and cudagraph
    skips (reduce-overhead falling back to no graphs) while it is open."""

    def __init__(self) -> None:
        self.recordings = 0
        self._before: dict = {}
        self._patched = None

    def _counts(self) -> dict:
        from torch._dynamo.utils import counters
        return {"graphs_compiled": counters["stats"]["unique_graphs"],
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}

    def __enter__(self) -> "CompileCounters":
        self._before = self._counts()
        try:
            from torch._inductor import cudagraph_trees as cgt
            orig = cgt.CUDAGraphTreeManager.record_function
            counter = self

            def record_function(mgr, *args, **kwargs):
                counter.recordings += 1
                return orig(mgr, *args, **kwargs)
            cgt.CUDAGraphTreeManager.record_function = record_function
            self._patched = (cgt.CUDAGraphTreeManager, orig)
        except Exception:  # internals moved: the recording count is then unknown
            self.recordings = None
        return self

    def __exit__(self, *exc) -> None:
        if self._patched is not None:
            cls, orig = self._patched
            cls.record_function = orig
        after = self._counts()
        self.fields = {k: after[k] - self._before.get(k, 0) for k in after}
        if self.recordings is not None:
            self.fields["cudagraph_recordings"] = self.recordings


def compile_sweep(ctx: RunContext, workload: str, sizes: Sequence[Any], make_case: Callable[[Any], Case],
                  target: Callable, prepare: Callable[[Case, Callable, str], Prepared],
                  emit: Callable[[dict], None], modes: Sequence[tuple] = COMPILE_MODES) -> None:
    """Child side: for each wanted (config, mode), within an equal share of the child's budget: dynamo reset,
    ``compiled = torch.compile(target, mode=)``, then every size (recompiling as torch.compile does by
    default: static first, dynamic shapes after a change). ``prepare(case, compiled, mode)`` returns the
    Prepared to measure. Emits each timing row (with graphs_compiled / cudagraph_recordings /
    cudagraph_skips / inductor_cache) and a ``compile_time_s`` value row: the first call minus one steady
    call, i.e. the compile (and CUDA-graph recording) cost at that size. The first mode compiles with cold
    caches; later modes find the graphs the earlier ones compiled in this process (inductor_cache "warm")."""
    import torch
    wanted = [(config, mode) for config, mode in modes if ctx.wants(config)]
    whole = ctx.budget
    for i, (config, mode) in enumerate(wanted):
        ctx.budget = whole.part(whole.remaining() / (len(wanted) - i))
        ctx.units_left = len(sizes)
        cache = "cold" if i == 0 else f"warm (after {wanted[0][0]} in this process)"
        reset_dynamo()
        compiled = torch.compile(target, mode=mode)
        first = True
        for size in sizes:
            try:
                case = make_case(size)
            except Exception as exc:
                emit(error_row(workload, size, config, f"inputs: {format_exc(exc, 300)}"))
                continue
            with CompileCounters() as cnt:
                row = measure_config(ctx, workload, case, config, lambda: prepare(case, compiled, mode),
                                     extra={"mode": mode, "inductor_cache": cache})
            row.update(cnt.fields)
            emit(row)
            ctx.advance(f"{workload} {case.size} {config}")
            if "error" not in row:
                compile_s = max(0.0, row["first_call_s"] - row["median_ms"] / 1e3)
                emit(value_row(workload, "compile_time_s", compile_s, "s", size=case.size, for_config=config,
                               first_size=first, first_call_s=row["first_call_s"], inductor_cache=cache,
                               **cnt.fields))
                first = False
            case = None
            release_memory(ctx.device)

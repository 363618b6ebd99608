"""Where the scheduler's host time per intercepted op goes (issue #5 goal: <= 4 us/op). Run on a GPU machine.

Each line is the median host us per op over the W2 chain (5 ops per step, 2,048 fp32 elements), same process:
  floor          a TorchDispatchMode that returns args[0] (PyTorch's cost of entering any Python mode)
  lookup         the scheduler's Python path (fast table emptied) with handlers that return args[0]: what the
                 C++ dispatcher (sched_dispatch) saves per op next to the Python __torch_dispatch__
  sched_ew_only  the 5 sched_ew calls of a step made directly from Python, no mode (the C++ record path)
  empty_only     5 torch.empty calls per step, no mode (allocation + Python wrapping, for scale)
  scheduler      the real scheduler (fusion on, __torch_function__ front), records only: the exit flush not timed
  sched_no_front the same with front=False (the TorchDispatchMode path alone)
  meta_*         x.shape / x.view(-1) per call: none (no mode), sched (under the scheduler with the front),
                 no_front (front=False)
  eager          the chain without any mode, synchronized at the end
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_scheduler import w2_step as step  # noqa: E402  (the W2 chain, one definition)

import gpuos
import gpuos_ext as ext
from gpuos import scheduler as S
from torch.utils._python_dispatch import TorchDispatchMode

N, ITERS, REPS = 2048, 400, 7
a, b, c, d = (torch.randn(N, device="cuda") for _ in range(4))
d = d.abs() + 0.5


def per_op(fn, enter=None, exit_=None):
    ts = []
    for _ in range(REPS + 1):
        torch.cuda.synchronize()
        ctx = enter() if enter else None
        t0 = time.perf_counter()
        for _ in range(ITERS):
            fn()
        t1 = time.perf_counter()
        if exit_:
            exit_(ctx)
        torch.cuda.synchronize()
        ts.append((t1 - t0) * 1e6 / (ITERS * 5))
    return statistics.median(ts[1:])


class Floor(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return args[0]


def main():
    gpuos.init(capacity=1 << 16)
    out = {}
    m = Floor()
    out["floor"] = per_op(lambda: step(a, b, c, d), lambda: m.__enter__(), lambda _: m.__exit__(None, None, None))

    saved = dict(S._HANDLERS)
    try:
        for k in list(S._HANDLERS):
            S._HANDLERS[k] = lambda thr, args, kwargs: args[0]

        def enter():
            cm = gpuos.scheduler_context(capacity=1 << 16, auto_flush_ms=0)
            cm.__enter__()
            ext.sched_set_fast({})  # every op through the Python path
            return cm
        out["lookup"] = per_op(lambda: step(a, b, c, d), enter, lambda cm: cm.__exit__(None, None, None))
    finally:
        S._HANDLERS.clear()
        S._HANDLERS.update(saved)
        ext.sched_set_fast(S._FAST)

    row = {r["name"]: r["id"] for r in ext.op_table()}
    ops = [(row["add"], (a, b), 1.0), (row["mul"], (a, c), 0.0), (row["relu"], (a,), 0.0),
           (row["sigmoid"], (a,), 0.0), (row["div"], (a, d), 0.0)]
    sched_ew = ext.sched_ew

    def direct():
        for op, ins, s0 in ops:
            sched_ew(op, 0, ins, None, s0, 0.0, 1 << 15)
    out["sched_ew_only"] = per_op(direct, None, lambda _: ext.sched_flush())

    def empties():
        for _ in range(5):
            torch.empty(N, device="cuda")
    out["empty_only"] = per_op(empties)

    def enter2():
        cm = gpuos.scheduler_context(capacity=1 << 16, auto_flush_ms=0)
        cm.__enter__()
        return cm
    out["scheduler"] = per_op(lambda: step(a, b, c, d), enter2, lambda cm: cm.__exit__(None, None, None))

    def enter3():
        cm = gpuos.scheduler_context(capacity=1 << 16, auto_flush_ms=0, front=False)
        cm.__enter__()
        return cm
    out["sched_no_front"] = per_op(lambda: step(a, b, c, d), enter3, lambda cm: cm.__exit__(None, None, None))

    def meta():  # 5 calls, as per_op divides by 5 per iteration
        a.shape, a.view(-1), a.shape, a.view(-1), a.shape
    out["meta_none"] = per_op(meta)
    out["meta_sched"] = per_op(meta, enter2, lambda cm: cm.__exit__(None, None, None))
    out["meta_no_front"] = per_op(meta, enter3, lambda cm: cm.__exit__(None, None, None))
    out["eager"] = per_op(lambda: step(a, b, c, d))
    for k, v in out.items():
        print(f"sched_cost {k:14s} {v:6.2f} us/op", flush=True)
    # The exit flush's host work by phase (sched_stats flush_host_us), W2 fused, one batch of ITERS steps.
    before = ext.sched_stats()["flush_host_us"]
    per_op(lambda: step(a, b, c, d), enter2, lambda cm: cm.__exit__(None, None, None))
    after = ext.sched_stats()["flush_host_us"]
    ops = (REPS + 1) * ITERS * 5
    print("sched_cost flush phases (us/op): " +
          ", ".join(f"{k[:-3]} {(after[k] - before[k]) / ops:.3f}" for k in after), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Fusion benchmark (issue #5): what flush-time chain fusion buys W2, and the first use of a new expression.

    python benchmarks/bench_fusion.py [--iters 1000] [--reps 20]

W2 = ``iters`` iterations of ``x=a+b; y=x*c; z=relu(y); w=sigmoid(z); out=w/d`` on 2,048-element fp32 tensors.

GPU time (the device's share, with the host taken out of the picture):
  eager      the whole loop captured in a CUDA graph and replayed: the 5,000 kernels back to back (events)
  gpuos      the loop recorded under scheduler_context(capacity large enough for one batch, no timer); events
             around the context's exit, which publishes everything in stream order: the descriptor copies and
             the worker's time for the batch
             (fused: one interpreter sub-op per iteration; unfused: five sub-ops per iteration). The runtime is
             initialised with that capacity first (init is idempotent: a runtime made with a smaller one would
             publish every capacity / 8 ops during the loop, and the events would time only the last batch);
             every rep checks that nothing but the exit flush published.
  Both are timed behind a gate (gpu_ms_of): a busy kernel holds the stream while the host enqueues (graph
  launch; the exit flush's lowering and publication), so host time never counts as GPU time; a check raises if
  the host was not done before the gate ended.
Host time per op: wall time of the loop under the context plus the exit flush's host work (lowering, fusion,
publication; not the GPU wait) / 5,000 (with the __torch_function__ front, and with the dispatch mode alone:
front=False); next to it the floor of any TorchDispatchMode (a mode returning args[0]), a mode that only
allocates outputs, and a TorchFunctionMode returning args[0]; measured in interleaved rounds (host_costs),
medians.
first_use_us: record + flush(sync) of a never-seen fused expression (a constant no earlier chain used, so its
program is new: built and uploaded on the spot, no NVRTC), median of ``--reps``; next to it the same for a
chain seen before.

Rows (BENCH_SCHEMA.md) are merged by config into benchmarks/results/injection.json (bench_injection.py writes
handover_us there): w2_fused_gpu_fraction_of_eager, w2_unfused_gpu_fraction_of_eager, w2_*_gpu_ms,
w2_*_host_us_per_op (incl. w2_dispatch_only_host_us_per_op), first_use_us, seen_use_us. Without a CUDA GPU: a
message, exit 0.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H
from benchmarks.bench_scheduler import w2_step

NAME = "injection"
N = 2048
CAPACITY = 1 << 16  # descriptor ring slots: the scheduler publishes at capacity / 8 deferred ops (> 5,000)


def eager_graph_gpu_ms(data, iters, reps):
    g, out, _ = H.capture_cuda_graph(lambda: [w2_step(*data) for _ in range(3)][-1],
                                     lambda: [w2_step(*data) for _ in range(iters)][-1])
    g.replay()  # the first launch uploads the graph
    times = [H.gpu_ms_of(g.replay)[0] for _ in range(reps)]
    return statistics.median(times), out


def gpuos_w2(gpuos, ext, data, iters, reps, fused, front=True):
    """(GPU ms, host us/op, outputs) of W2 recorded under the scheduler and published by the context's exit
    (behind the gate: the exit must not wait for the GPU, which the gate check enforces)."""
    ext.set_fusion(fused)
    try:
        gpu, host, outs, gate, exits = [], [], None, None, []
        st0 = ext.stats()
        for rep in range(reps + 1):
            torch.cuda.synchronize()
            before = dict(ext.sched_stats()["flushes_by_cause"])
            ctx = gpuos.scheduler_context(capacity=CAPACITY, auto_flush_ms=0, front=front)
            ctx.__enter__()
            t0 = time.perf_counter()
            for _ in range(iters):
                outs = w2_step(*data)
            t_rec = time.perf_counter() - t0
            if rep == 0:  # warm-up: its exit, ungated, sizes the gate for the timed reps
                t1 = time.perf_counter()
                ctx.__exit__(None, None, None)
                gate = H.gate_for((time.perf_counter() - t1) * 1e3)
                torch.cuda.synchronize()
                continue
            # The exit flush (lowering, publication) behind the gate
            gpu_ms, exit_s = H.gpu_ms_of(lambda: ctx.__exit__(None, None, None), gate)
            H.check_one_batch(ext, before)
            exits.append(exit_s * 1e6 / (iters * 5))
            gpu.append(gpu_ms)
            host.append((t_rec + exit_s) * 1e6 / (iters * 5))
        st1 = ext.stats()
        print(f"W2 {'fused' if fused else 'unfused'} (front={front}, {iters} iterations): per batch "
              + ", ".join(f"{k} {(st1[k] - st0[k]) / (reps + 1):.0f}" for k in ("subops", "levels_split", "flushes")
                          if k in st0)
              + f"; GPU {statistics.median(gpu):.3f} ms, host {statistics.median(host):.2f} us/op (of which "
              f"exit flush {statistics.median(exits):.2f})", flush=True)
        return statistics.median(gpu), statistics.median(host), outs
    finally:
        ext.set_fusion(True)


def host_costs(gpuos, data, iters, reps):
    """Host us/op of the W2 loop (recording, and the exit flush's host work) under the scheduler, with the
    __torch_function__ front and without it, next to modes that do nothing but return (the floor of any
    mode-based scheduler: TorchDispatchMode, TorchFunctionMode) or only allocate the output. The variants are
    measured in interleaved rounds (one of each per round; medians): this host's speed drifts between runs."""
    import gc

    import gpuos_ext
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Floor(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return args[0]

    class Alloc(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return torch.empty_like(args[0])

    class FunctionFloor(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return args[0]

    variants = {
        "fused": lambda: gpuos.scheduler_context(capacity=CAPACITY, auto_flush_ms=0),
        "dispatch_only": lambda: gpuos.scheduler_context(capacity=CAPACITY, auto_flush_ms=0, front=False),
        "floor": Floor, "alloc": Alloc, "function_floor": FunctionFloor,
    }
    ts: dict = {k: [] for k in variants}
    for r in range(reps + 1):
        for name, make in variants.items():
            torch.cuda.synchronize()
            gc.collect()
            before = dict(gpuos_ext.sched_stats()["flushes_by_cause"])
            ctx = make()
            ctx.__enter__()
            t0 = time.perf_counter()
            for _ in range(iters):
                w2_step(*data)
            ctx.__exit__(None, None, None)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            H.check_one_batch(gpuos_ext, before)
            if r:
                ts[name].append((t1 - t0) * 1e6 / (iters * 5))
    return {k: statistics.median(v) for k, v in ts.items()}


def first_use(gpuos, ext, reps):
    x = torch.randn(N, device="cuda")
    new, seen = [], []
    for i in range(reps):
        c = 1.0 + (time.time_ns() % 1000003) * 1e-7 + i  # a constant no chain used before: a new program
        for bucket, const in ((new, c), (seen, 0.5)):
            p0 = ext.stats()["programs"]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with gpuos.scheduler_context(auto_flush_ms=0):
                y = torch.sigmoid(x * const) + 1.0
            ext.flush(sync=True)
            bucket.append((time.perf_counter() - t0) * 1e6)
            if bucket is new:
                assert ext.stats()["programs"] == p0 + 1, "expected a never-seen program"
            torch.testing.assert_close(y, torch.sigmoid(x * const) + 1.0, rtol=1e-5, atol=1e-5)
    return statistics.median(new[1:]), statistics.median(seen[1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    if H.skip_without_cuda("bench_fusion"):
        return 0
    import gpuos
    import gpuos_ext as ext
    gpuos.init(capacity=CAPACITY)  # before any scheduler context (one_batch_check catches a smaller runtime)
    g = torch.Generator().manual_seed(0)
    data = tuple(torch.randn(N, generator=g).cuda() for _ in range(3)) + ((torch.rand(N, generator=g) + 0.5).cuda(),)
    ref = w2_step(*data)
    eager_gpu, gout = eager_graph_gpu_ms(data, args.iters, args.reps)
    torch.testing.assert_close(gout, ref)
    ext.set_specialize_after(0)  # tier 1 alone first: every fused chain through the interpreter
    fused_gpu, _, fout = gpuos_w2(gpuos, ext, data, args.iters, args.reps, True)
    _, _, dout = gpuos_w2(gpuos, ext, data, 50, 1, True, front=False)
    unfused_gpu, unfused_host, uout = gpuos_w2(gpuos, ext, data, args.iters, args.reps, False)
    host = host_costs(gpuos, data, args.iters, args.reps)
    # Tier 2: let the W2 program get straight-line code (background compile), hand over once the worker idles
    ext.set_specialize_after(1)
    t0 = time.perf_counter()
    gpuos_w2(gpuos, ext, data, 2, 1, True)
    ext.wait_generations()
    spec_compile_s = time.perf_counter() - t0
    ext.yield_worker()
    torch.cuda.synchronize()
    spec_gpu, spec_host, sout = gpuos_w2(gpuos, ext, data, args.iters, args.reps, True)
    ext.set_specialize_after(64)
    active = ext.generation_info()["active"]
    ok = True
    for o in (fout, dout, uout, sout):
        try:
            torch.testing.assert_close(o, ref, rtol=1e-5, atol=1e-5)
        except AssertionError:
            ok = False
    new_us, seen_us = first_use(gpuos, ext, args.reps)
    rows = [
        H.value_row("W2", "w2_fused_gpu_fraction_of_eager", fused_gpu / eager_gpu, "ratio", size=N, correct=ok,
                    goal="<= 0.333"),
        H.value_row("W2", "w2_unfused_gpu_fraction_of_eager", unfused_gpu / eager_gpu, "ratio", size=N, correct=ok,
                    note="5 dependency levels of 1,000 sub-ops (one per op of the chain), intermediates written"),
        H.value_row("W2", "w2_fused_spec_gpu_fraction_of_eager", spec_gpu / eager_gpu, "ratio", size=N, correct=ok,
                    note=f"tier 2 (specialized code, generation {dict(active)}); compile+handover "
                         f"{spec_compile_s:.1f} s in the background"),
        H.value_row("W2", "w2_fused_spec_gpu_ms", spec_gpu, "ms", size=N),
        H.value_row("W2", "w2_eager_graph_gpu_ms", eager_gpu, "ms", size=N),
        H.value_row("W2", "w2_fused_gpu_ms", fused_gpu, "ms", size=N),
        H.value_row("W2", "w2_unfused_gpu_ms", unfused_gpu, "ms", size=N),
        H.value_row("W2", "w2_fused_host_us_per_op", host["fused"], "us", size=N, goal="<= 4",
                    note="scheduler_context() (fusion, __torch_function__ front): recording + the exit flush's host work"),
        H.value_row("W2", "w2_unfused_host_us_per_op", unfused_host, "us", size=N),
        H.value_row("W2", "w2_dispatch_only_host_us_per_op", host["dispatch_only"], "us", size=N,
                    note="fused, scheduler_context(front=False): the TorchDispatchMode path alone"),
        H.value_row("W2", "w2_function_mode_floor_host_us_per_op", host["function_floor"], "us", size=N,
                    note="TorchFunctionMode returning args[0]: the floor of the front"),
        H.value_row("W2", "w2_mode_floor_host_us_per_op", host["floor"], "us", size=N,
                    note="TorchDispatchMode returning args[0]: the interception floor"),
        H.value_row("W2", "w2_mode_alloc_host_us_per_op", host["alloc"], "us", size=N,
                    note="TorchDispatchMode returning torch.empty_like(args[0])"),
        H.value_row("first_use", "first_use_us", new_us, "us", size=N, correct=True, goal="<= 1000"),
        H.value_row("first_use", "seen_use_us", seen_us, "us", size=N, correct=True),
    ]
    path = H.merge_and_print_values(NAME, rows)
    print(f"results merged into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

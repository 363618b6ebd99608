#!/usr/bin/env python
"""Operator-injection benchmark (issue #5): generation handover time and alias-switch latency.

    python benchmarks/bench_injection.py [--reps 50]

handover_us (goal <= 1 ms): drain + module load + relaunch, as gpuos_ext._force_handover() measures it on the
host: a batch of 2,000 sub-ops is published (the worker is resident and busy), then the handover asks the
worker to leave, waits until it has (the published batch finishes first), loads the active generation's image
again as a new CUmodule and launches the worker from it. Median of --reps. Components in
handover_drain_us / handover_load_us / handover_launch_us; handover_idle_us is the same with no worker
resident (load + launch only). Each rep is checked: the batch's outputs are right.
switch_us: host time of gpuos.switch(name, slot) / rollback (an alias-table version written by stream memory
operations on the control stream and waited for), median of --reps, with a worker resident.
first_flush_new_generation_us: submit + flush(sync) of the first sub-op that needs the newly compiled
generation, which the compile thread already took over while no worker was resident (idle_adoptions): the
handover the user sees when work pauses; compare steady_flush_us.
generation_compile_s: wall time of the one registration this benchmark makes (a new generation: the worker
and every op through NVRTC; milliseconds when GPUOS_CACHE_DIR already holds it).

Rows (BENCH_SCHEMA.md value rows) are merged by config into benchmarks/results/injection.json (bench_fusion.py
writes its rows there too). Without a CUDA GPU: a message, exit 0.
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

NAME = "injection"
OP = "bench_inj_sw"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--subops", type=int, default=2000, help="sub-ops in flight when a handover starts")
    args = ap.parse_args(argv)
    if H.skip_without_cuda("bench_injection"):
        return 0
    import gpuos
    import gpuos_ext as ext

    gpuos.init(capacity=max(4096, 2 * args.subops))
    x1 = torch.randn(256, device="cuda")
    o1 = torch.empty_like(x1)

    def one_flush_us(op):
        torch.cuda.synchronize()
        t = time.perf_counter()
        gpuos.submit(op, [x1, x1], o1)
        gpuos.flush(sync=True)
        return (time.perf_counter() - t) * 1e6

    one_flush_us("add")
    adopt0 = ext.stats()["idle_adoptions"]
    t0 = time.perf_counter()
    new_generation = OP not in {o["name"] for o in gpuos.user_ops()}
    if new_generation:
        with gpuos.batch_install():  # one generation for both slots
            gpuos.register_elementwise(OP, "a + b")
            gpuos.install(OP, "a - b", slot=1)
    compile_s = time.perf_counter() - t0
    adopted = ext.stats()["idle_adoptions"] - adopt0
    first_flush = one_flush_us(OP)  # the first sub-op that needs the new generation
    steady_flush = statistics.median(one_flush_us(OP) for _ in range(max(5, args.reps // 5)))

    n = args.subops
    a = torch.randn(n, 256, device="cuda")
    b = torch.rand(n, 256, device="cuda") + 0.5
    out = torch.empty_like(a)
    ref = a + b
    x0, y0, o0 = a[0], b[0], out[0]
    # Warm up: the generation is active, the worker has run once.
    gpuos.submit(OP, [x0, y0], o0)
    gpuos.flush(sync=True)

    busy, idle, correct = [], [], True
    for _ in range(args.reps):
        out.fill_(float("nan"))
        for i in range(n):
            gpuos.submit(OP, [a[i], b[i]], out[i])
        gpuos.flush()                     # published: the worker is resident and busy
        busy.append(ext._force_handover())  # drain (the batch finishes), load, relaunch
        gpuos.flush(sync=True)
        torch.cuda.synchronize()
        correct &= bool(torch.equal(out, ref))
    for _ in range(args.reps):
        torch.cuda.synchronize()
        time.sleep(0.002)                 # past idle_us: no worker resident
        idle.append(ext._force_handover())

    switch = []
    for _ in range(args.reps):
        gpuos.submit(OP, [x0, y0], o0)
        gpuos.flush()
        t = time.perf_counter()
        gpuos.switch(OP, 1)
        switch.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        gpuos.rollback(OP)
        switch.append((time.perf_counter() - t) * 1e6)
    gpuos.flush(sync=True)

    med = lambda xs: statistics.median(xs)  # noqa: E731
    total = [h["total_us"] for h in busy]
    rows = [
        H.value_row("handover", "handover_us", med(total), "us", reps=args.reps, min=min(total), max=max(total),
                    subops_in_flight=n, correct=correct, goal="<= 1000 us"),
        H.value_row("handover", "handover_drain_us", med([h["drain_us"] for h in busy]), "us", reps=args.reps),
        H.value_row("handover", "handover_load_us", med([h["load_us"] for h in busy]), "us", reps=args.reps),
        H.value_row("handover", "handover_launch_us", med([h["launch_us"] for h in busy]), "us", reps=args.reps),
        H.value_row("handover", "handover_idle_us", med([h["total_us"] for h in idle]), "us", reps=args.reps),
        H.value_row("switch", "switch_us", med(switch), "us", reps=len(switch), min=min(switch), max=max(switch)),
        H.value_row("handover", "first_flush_new_generation_us", first_flush, "us", new_generation=new_generation,
                    idle_adoptions=adopted, steady_flush_us=round(steady_flush, 2),
                    note="submit + flush(sync) of the first sub-op that needs a generation that became ready while "
                         "the worker was idle (the compile thread loaded it: idle_adoptions); steady_flush_us: "
                         "the same flush later"),
        H.value_row("generation", "generation_compile_s", compile_s, "s",
                    note="register + install of one op (one generation) incl. NVRTC; ~0 from a warm cache"),
    ]
    path = H.merge_and_print_values(NAME, rows)
    print(f"handovers counted: {ext.stats()['handovers']}; results merged into {path}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())

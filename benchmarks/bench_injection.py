#!/usr/bin/env python
"""Operator-injection benchmark (issues #5, #18): generation handover time, alias-switch latency, and how fast
an injection is ready with linked generations.

    python benchmarks/bench_injection.py [--reps 50] [--link-subops 100000] [--no-link]

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

Linked generations (issue #18; gpuos_ext.link_info() says which mode runs; every row below carries it):
register_to_result_s (goal <= 0.5 s): register_elementwise of a never-seen op (a fresh name: its object is not
cached) -> submit -> flush(sync) -> the result checked. install_s (goal <= 0.5 s): install of slot 1 of that op
(block=True: its generation is ready and adopted); switch_to_result_s: then switch + the first result.
specialize_s (goal <= 0.5 s): from the scheduler run that requests tier-2 code of a hot fused chain (a constant
unique to the run: never cached) until its generation is ready (wait_generations).
linked_subops_gpu_ms / inlined_subops_gpu_ms: GPU time (behind a gate kernel: host time excluded) of a batch of
--link-subops 256-float sub-ops of one injected op, run from a linked generation and from a whole-compiled one
(gpuos_ext._set_link_override(0) in the same process: the same op inlined into the worker); the linked layout is
measured in the linked generations before and after the whole one, medians of --link-reps each;
linked_vs_inlined_gpu_ratio (goal <= 1.10). The whole compile costs this benchmark ~10 s of NVRTC.

Rows (BENCH_SCHEMA.md value rows) are merged by config into benchmarks/results/injection.json (bench_fusion.py
writes its rows there too). Without a CUDA GPU: a message, exit 0.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "injection"
OP = "bench_inj_sw"


def link_rows(gpuos, ext, args) -> tuple:
    """Issue #18's rows (see the module docstring). Returns (rows, all results correct)."""
    mode = ext.link_info()["mode"]
    nonce = f"{os.getpid()}_{time.time_ns() % 10**12}"
    x = torch.randn(4096, device="cuda")
    y = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)

    def result(op, s0):
        out.fill_(float("nan"))
        gpuos.submit(op, [x, y], out, s0=s0)
        gpuos.flush(sync=True)
        return out

    name = f"bench_lnk_{nonce}"
    t0 = time.perf_counter()
    gpuos.register_elementwise(name, "a * s0 + b")
    ok = torch.allclose(result(name, 2.0), x * 2.0 + y)
    register_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    gpuos.install(name, "a * s0 - b", slot=1)
    install_s = time.perf_counter() - t0
    gpuos.switch(name, 1)
    ok &= torch.allclose(result(name, 2.0), x * 2.0 - y)
    switch_s = time.perf_counter() - t0

    # Tier 2: a chain with a constant of this run only (its code is in no cache), hot after 3 runs.
    c = 0.25 + (time.time_ns() % 100_000) / 1e6
    a = torch.randn(3000, device="cuda")
    b = torch.randn(3000, device="cuda")
    f = lambda a, b: torch.tanh(a * b) * c + b  # noqa: E731
    exp = f(a, b)
    ext.wait_generations()
    ext.set_specialize_after(3)
    try:
        for _ in range(2):
            with gpuos.scheduler_context(auto_flush_ms=0):
                f(a, b)
        req0 = gpuos.stats()["specializations_requested"]
        t0 = time.perf_counter()
        with gpuos.scheduler_context(auto_flush_ms=0):
            got = f(a, b)
        requested = gpuos.stats()["specializations_requested"] - req0
        ext.wait_generations()
        specialize_s = time.perf_counter() - t0
    finally:
        ext.set_specialize_after(64)
    ok &= torch.allclose(got, exp, rtol=1e-5, atol=1e-5) and requested >= 1
    with gpuos.scheduler_context(auto_flush_ms=0):
        got = f(a, b)
    ok &= torch.allclose(got, exp, rtol=1e-5, atol=1e-5)

    # GPU time of --link-subops sub-ops of one injected op: linked (gen L1), inlined (whole gen), linked (L2).
    n = args.link_subops
    A = torch.randn(n, 256, device="cuda")
    B = torch.randn(n, 256, device="cuda")
    O = torch.empty_like(A)
    ra, rb, ro = list(A.unbind(0)), list(B.unbind(0)), list(O.unbind(0))
    sub = f"bench_lnk_sub_{nonce}"

    def batch(op):
        if op == "add":
            ext.submit_many("add", ra, rb, ro)
        else:
            for i in range(n):
                gpuos.submit(op, [ra[i], rb[i]], ro[i], s0=0.5)
        gpuos.flush()

    def measure(op):
        gpu = []
        batch(op)  # warm: the generation is taken over, the worker has run it
        torch.cuda.synchronize()
        t = time.perf_counter()
        batch(op)
        torch.cuda.synchronize()
        gate = H.gate_for(host_ms=(time.perf_counter() - t) * 1e3)  # 3x the host's recording time
        for _ in range(args.link_reps):
            O.fill_(float("nan"))
            ms = float("nan")
            for _ in range(4):
                try:
                    ms, _host_s = H.gpu_ms_of(lambda: batch(op), gate=gate)
                    break
                except RuntimeError:  # the host outlasted the gate: a longer one
                    gate *= 2
            gpu.append(ms)
        good = torch.allclose(O, A + B if op == "add" else A * 0.5 + B)
        return gpu, good

    def measure_both():  # the injected op, then the built-in add, on the active generation
        (u, ok_u), (b, ok_b) = measure(sub), measure("add")
        return u, b, ok_u and ok_b, ext.generation_info()["active"][torch.cuda.current_device()]

    gpuos.register_elementwise(sub, "a * s0 + b")
    linked1, blinked1, ok1, g1 = measure_both()
    whole_gen_s = None
    if mode == "linked":
        ext._set_link_override(0)
        try:
            t0 = time.perf_counter()
            gpuos.register_elementwise(f"bench_whl_{nonce}", "a - b")  # a whole generation holding `sub` inlined
            whole_gen_s = time.perf_counter() - t0
        finally:
            ext._set_link_override(-1)
        inlined, binlined, ok2, g2 = measure_both()
        gpuos.register_elementwise(f"bench_lnk2_{nonce}", "a + b")  # linked again
        linked2, blinked2, ok3, g3 = measure_both()
        ok &= ok2 and ok3
    else:
        inlined, binlined, linked2, blinked2, g2, g3 = linked1, blinked1, [], [], g1, g1
    ok &= ok1
    med = statistics.median
    lk = linked1 + linked2
    common = dict(link_mode=mode, correct=bool(ok))
    rows = [
        H.value_row("link", "register_to_result_s", register_s, "s", goal="<= 0.5 s", **common),
        H.value_row("link", "install_s", install_s, "s", goal="<= 0.5 s", **common),
        H.value_row("link", "switch_to_result_s", switch_s, "s", **common,
                    note="install of slot 1 + switch + its first result"),
        H.value_row("link", "specialize_s", specialize_s, "s", goal="<= 0.5 s", **common),
        H.value_row("link", "linked_subops_gpu_ms", med(lk), "ms", subops=n, reps=len(lk), min=min(lk),
                    max=max(lk), generations=[g1, g3], **common),
        H.value_row("link", "inlined_subops_gpu_ms", med(inlined), "ms", subops=n, reps=len(inlined),
                    min=min(inlined), max=max(inlined), generation=g2, whole_compile_s=whole_gen_s, **common),
        H.value_row("link", "linked_vs_inlined_gpu_ratio", med(lk) / med(inlined), "x", goal="<= 1.10", **common),
        H.value_row("link", "builtin_linked_vs_inlined_gpu_ratio", med(blinked1 + blinked2) / med(binlined), "x",
                    linked_ms=med(blinked1 + blinked2), inlined_ms=med(binlined), subops=n,
                    note="built-in add (submit_many) in the linked generations vs the whole one", **common),
    ]
    return rows, bool(ok)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--subops", type=int, default=2000, help="sub-ops in flight when a handover starts")
    ap.add_argument("--link-subops", type=int, default=100_000, help="sub-ops of the linked vs inlined batch")
    ap.add_argument("--link-reps", type=int, default=3)
    ap.add_argument("--no-link", action="store_true", help="skip the linked-generation rows (issue #18)")
    args = ap.parse_args(argv)
    if H.skip_without_cuda("bench_injection"):
        return 0
    import gpuos
    import gpuos_ext as ext

    gpuos.init(capacity=max(4096, 2 * args.subops, H.pow2_at_least(2 * args.link_subops)))
    link, link_ok = ([], True) if args.no_link else link_rows(gpuos, ext, args)
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
    ] + link
    path = H.merge_and_print_values(NAME, rows)
    print(f"handovers counted: {ext.stats()['handovers']}; link: {ext.link_info()}; results merged into {path}")
    return 0 if correct and link_ok else 1


if __name__ == "__main__":
    sys.exit(main())

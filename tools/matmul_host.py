"""Where a live chain of worker matmuls spends its time: the host's recording and publication against the device.

    python tools/matmul_host.py             # on a GPU machine; env MH_M (rows, default 1), MH_NK (4,096), MH_L (8)
    MH_ITEMS=1024,512,1024,512 python tools/matmul_host.py   # one round per GPUOS_MM_ITEMS value, in one process

L dependent (chain) or independent x @ W_i.t() products, fp16, N = K = MH_NK, each pattern three ways in one process:
cuBLAS (torch.mm), live (gpuos.submit_matmul per product + one flush: the host stages, copies and publishes every
item while the worker runs) and a program (the same products as F.linear, gpuos.capture'd once and replayed: one
doorbell per call). Per product: the host's time to return from the call (no sync) and the GPU time (CUDA events),
the sub-ops the runtime wrote, and for the live rows the publication's host time split as the runtime's own
counters split it (publish_copy_ns: the descriptors' DMA, publish_launch_ns: worker launches, publish_memop_ns:
the ready words). Host ~ GPU on a live row means the host bounds it. Two rounds: the GPU's state drifts within a
call (bench_matmul's cuBLAS 56-97 % of copy on one H200), so compare rows of one round. MH_ITEMS: instead, one
round per value of GPUOS_MM_ITEMS (the runtime shut down and started again with it, the programs captured anew),
so that settings are compared in one process, alternated (the fortieth session compared them across processes).

Fortieth session (H200, M = 1, 4,096^2, L = 8): live chain host 35 / GPU 37-38 us per product (host-bound), the
program 30-31 us, cuBLAS 25-26 us in that round (DEVELOPING *Next* 5).
"""
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpuos  # noqa: E402

PUBLISH = ("publish_ns", "publish_copy_ns", "publish_launch_ns", "publish_memop_ns")


def main() -> int:
    if not torch.cuda.is_available():
        print("matmul_host: no CUDA GPU; nothing to measure")
        return 0
    from benchmarks.bench_matmul import linears, sequences
    gpuos.init()
    gpuos.set_worker_matmul(True)
    M, NK, L = (int(os.environ.get(k, d)) for k, d in (("MH_M", "1"), ("MH_NK", "4096"), ("MH_L", "8")))
    reps, dt = 12, torch.float16
    ws = [torch.randn(NK, NK, device="cuda", dtype=dt) / NK ** 0.5 for _ in range(L)]
    x = torch.randn(M, NK, device="cuda", dtype=dt)
    outs = [torch.empty(M, NK, device="cuda", dtype=dt) for _ in range(L)]
    src = torch.empty(L * NK * NK, device="cuda", dtype=dt)
    dst = torch.empty_like(src)

    def timed(fn):
        host, gpu = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            e1.record()
            torch.cuda.synchronize()
            host.append((t1 - t0) * 1e6 / L)
            gpu.append(e0.elapsed_time(e1) * 1e3 / L)
        return statistics.median(host), statistics.median(gpu)

    seqs = sequences(ws, x, outs)  # bench_matmul's: (pattern, "cublas" / "gpuos_worker") -> fn

    def one_round(label):
        progs = {p: gpuos.capture(linears(ws, chain=p == "chain"), x) for p in ("chain", "independent")}
        torch.testing.assert_close(progs["chain"](x).float(), linears(ws, chain=True)(x).float(), rtol=3e-2,
                                   atol=3e-2)
        _, copy_us = timed(lambda: dst.copy_(src))
        cells = []
        for pattern in ("chain", "independent"):
            for name, fn in (("cublas", seqs[pattern, "cublas"]), ("live", seqs[pattern, "gpuos_worker"]),
                             ("program", lambda: progs[pattern](x))):
                s0 = gpuos.stats()
                h, g = timed(fn)
                s1 = gpuos.stats()
                per = reps * L
                cell = (f"{pattern} {name}: host {h:.1f} gpu {g:.2f} us ({copy_us / g:.0%} of copy)"
                        f", {(s1['subops'] - s0['subops']) / per:.0f} sub-ops")
                if name == "live":
                    pubs = max(1, s1["publications"] - s0["publications"])
                    cell += ", per publication (us): " + " / ".join(
                        f"{(s1[k] - s0[k]) / pubs / 1e3:.1f}" for k in PUBLISH) + " (all / copy / launch / memop)"
                cells.append(cell)
        levels = {p: prog.info()["levels"] for p, prog in progs.items()}
        print(f"{label}: copy {copy_us:.2f} us per product's bytes; program levels {levels}; " + "; ".join(cells),
              flush=True)

    print(f"matmul_host: M {M}, N = K {NK}, {L} products, fp16")
    items = [v for v in os.environ.get("MH_ITEMS", "").split(",") if v]
    for rnd, v in enumerate(items or ["", ""]):
        if v:
            os.environ["GPUOS_MM_ITEMS"] = v
            gc.collect()  # the last round's programs released while their runtime is up
            gpuos.shutdown()
            gpuos.init()
        one_round(f"round {rnd}" + (f" GPUOS_MM_ITEMS={v}" if v else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

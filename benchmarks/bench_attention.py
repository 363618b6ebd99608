#!/usr/bin/env python
"""Worker decode attention vs torch's SDPA backends (issue #16 microbenchmark): GPU time per attention.

    python benchmarks/bench_attention.py             # llama (32/8/128) and small (4/2/64) x KV 128..8192 x fp16,bf16
    python benchmarks/bench_attention.py --quick     # llama x KV 128, 4096 x fp16

For each (heads, KV length, dtype): L independent decode attentions (query length 1, batch 1; one KV cache per
"layer", L sized so the caches exceed the L2 cache, at most 64), timed with CUDA events around the whole sequence
(median of reps), reported per attention. Configs: torch_flash, torch_efficient, torch_math (each forced with
torch.nn.attention.sdpa_kernel; enable_gqa=True), torch_cudnn timed separately (cuDNN builds a plan per KV
length, DESIGN F10: here the length is fixed, so its plan is built in the warm-up and the row is its best case),
and gpuos_worker (gpuos.submit_attention per attention + one flush: one level, the items of every attention run
concurrently). A backend torch refuses for a shape gets a row with its error. torch_best is the fastest of
flash / efficient / math (named in the row's "backend" field); "of_best" = worker time / torch_best time.
Goal (issue #16): worker within 1.2x of torch_best. Rows (BENCH_SCHEMA.md, workload "ATTN"): "value" in us, "gbps"
(K and V bytes per second). Results: benchmarks/results/attention.json. Without a CUDA GPU: message, exit 0.
"""
from __future__ import annotations

import argparse
import statistics
import sys

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "attention"
WORKLOAD = "ATTN"
SHAPES = {"llama": (32, 8, 128), "small": (4, 2, 64)}  # query heads, KV heads, head_dim


def _events_ms(fn, reps: int) -> float:
    import torch
    times = []
    for i in range(reps + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 2:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def run_size(shape: str, kv: int, dtype, reps: int, rows: list) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import gpuos
    dev = "cuda"
    Hq, Hkv, D = SHAPES[shape]
    esz = torch.tensor([], dtype=dtype).element_size()
    kvbytes = 2 * Hkv * kv * D * esz
    L = max(4, min(64, (256 << 20) // kvbytes))
    qs = [torch.randn(1, Hq, 1, D, device=dev, dtype=dtype) for _ in range(L)]
    ks = [torch.randn(1, Hkv, kv, D, device=dev, dtype=dtype) for _ in range(L)]
    vs = [torch.randn(1, Hkv, kv, D, device=dev, dtype=dtype) for _ in range(L)]
    outs = [torch.empty(1, Hq, 1, D, device=dev, dtype=dtype) for _ in range(L)]
    size = f"{shape}-Hq{Hq}-Hkv{Hkv}-D{D}-KV{kv}-{str(dtype).split('.')[-1]}"

    def torch_fn(backend):
        def fn():
            with sdpa_kernel(backend):
                for q, k, v in zip(qs, ks, vs):  # (outputs from the caching allocator: no extra copy timed)
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return fn

    def worker():
        for q, k, v, o in zip(qs, ks, vs, outs):
            gpuos.submit_attention(q, k, v, o)
        gpuos.flush()

    # correctness first: the worker against the math backend in fp32
    worker()
    torch.cuda.synchronize()
    G = Hq // Hkv
    ref = [F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(G, 1),
                                          v.float().repeat_interleave(G, 1)) for q, k, v in zip(qs, ks, vs)]
    correct = all(torch.allclose(o.float(), r, rtol=2e-2, atol=2e-2) for o, r in zip(outs, ref))
    results = {}
    for config, backend in (("torch_flash", SDPBackend.FLASH_ATTENTION),
                            ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION),
                            ("torch_math", SDPBackend.MATH), ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            results[config] = _events_ms(torch_fn(backend), reps)
        except Exception as e:  # noqa: BLE001 -- a backend that refuses the shape: a row that says why
            rows.append({"workload": WORKLOAD, "size": size, "config": config, "error": H.format_exc(e)})
    results["gpuos_worker"] = _events_ms(worker, reps)
    best = min((c for c in results if c in ("torch_flash", "torch_efficient", "torch_math")),
               key=lambda c: results[c], default=None)
    for config, ms in results.items():
        us = ms * 1e3 / L
        row = H.value_row(WORKLOAD, config, us, "us", size=size) | {
            "gbps": round(kvbytes * L / (ms * 1e-3) / 1e9, 1), "attentions": L}
        if config == "gpuos_worker":
            row["correct"] = correct
            if best:
                row["of_best"] = round(ms / results[best], 3)
                row["best_backend"] = best
        rows.append(row)
    if best:
        rows.append(H.value_row(WORKLOAD, "torch_best", results[best] * 1e3 / L, "us", size=size)
                    | {"backend": best.replace("torch_", "")})
    print(f"{size}: " + "; ".join(f"{c} {ms * 1e3 / L:.2f} us" for c, ms in results.items())
          + (f"; worker/best({best}) {results['gpuos_worker'] / results[best]:.2f}x" if best else "")
          + ("" if correct else "  WRONG RESULTS"), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    if H.skip_without_cuda("bench_attention.py"):
        return 0
    import torch
    import gpuos
    gpuos.init()
    meta = H.env_metadata(NAME)
    print(H.env_line(meta), flush=True)
    rows: list = []
    shapes = ["llama"] if a.quick else list(SHAPES)
    kvs = [128, 4096] if a.quick else [128, 512, 2048, 8192]
    dts = [torch.float16] if a.quick else [torch.float16, torch.bfloat16]
    for dt in dts:
        for shape in shapes:
            for kv in kvs:
                try:
                    run_size(shape, kv, dt, a.reps, rows)
                except Exception as e:  # noqa: BLE001 -- a row that says why, never an aborted run
                    rows.append({"workload": WORKLOAD, "size": f"{shape}-KV{kv}-{dt}", "config": "gpuos_worker",
                                 "error": H.format_exc(e)})
                H.release_memory()
    path = H.write_results(NAME, meta, rows)
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

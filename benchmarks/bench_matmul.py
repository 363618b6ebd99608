#!/usr/bin/env python
"""Worker skinny matmul vs cuBLAS (issue #16 microbenchmark): GPU time per product, and the bandwidth it reaches.

    python benchmarks/bench_matmul.py                # M 1,4,16,64 x N=K 1024,4096 x fp16,bf16
    python benchmarks/bench_matmul.py --quick        # M 1,16 x N=K 1024 x fp16
    python benchmarks/bench_matmul.py --only M1-N4096-torch.float16 M16-N4096-torch.float16   # cases by label

For each (M, N=K, dtype), L distinct weights W_i (N x K, the layout of nn.Linear; L sized so the weights exceed
the L2 cache) and two patterns, each timed with CUDA events around the whole sequence (median of reps):
    independent  y_i = x @ W_i.t() for every i: cuBLAS runs them in turn; the worker gets them as one flush
                 (one level: its warps run them concurrently)
    chain        x_{i+1} = x_i @ W_i.t(): every product depends on the previous one (levels), as in a model
Configs: cublas (torch.mm with out=, what eager runs), gpuos_worker (gpuos.submit_matmul + one flush: the host
records and publishes every item while the worker runs, so a live chain also shows the host's cost per descriptor),
gpuos_program (the same products as F.linear captured once with gpuos.capture and replayed: one doorbell per call,
the levels walked on the device -- the worker's own rate; matmul-only programs have nothing for tier 2 to specialize).
Rows (BENCH_SCHEMA.md, workload "MM"): per-product GPU µs ("value", unit "us"), the weights' bytes per second
("gbps" field), and a "copy" row per size: a device-to-device copy of the same bytes (the HBM reference).
Goal (issue #16): worker at M = 1 reads weights at >= 70 % of the copy's rate, and at M <= 16 takes <= 1.2x
cuBLAS's time. Results: benchmarks/results/matmul.json. Without a CUDA GPU: message, exit 0.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "matmul"
WORKLOAD = "MM"


def sequences(ws, x, outs) -> dict:
    """The timed sequences over the weights `ws` (each N x K) from x (M x K) into `outs`: {(pattern, config): fn}
    for pattern independent / chain and config cublas (torch.mm with out=) / gpuos_worker (gpuos.submit_matmul, then
    one flush). tools/matmul_host.py times the same ones."""
    import torch
    import gpuos

    def run(chain, submit, flush):
        def fn():
            cur = x
            for w, o in zip(ws, outs):
                submit(cur, w.t(), o)
                cur = o if chain else x
            flush()
        return fn
    impls = (("cublas", lambda a, b, o: torch.mm(a, b, out=o), lambda: None),
             ("gpuos_worker", gpuos.submit_matmul, gpuos.flush))
    return {(p, c): run(p == "chain", submit, flush) for p in ("independent", "chain") for c, submit, flush in impls}


def linears(ws, chain: bool):
    """The same products as F.linear, to capture as a program: x -> [x @ W_i.t() for each W_i], or the chain's
    last output."""
    import torch.nn.functional as F

    def independent(x):
        return [F.linear(x, w) for w in ws]

    def chained(x):
        for w in ws:
            x = F.linear(x, w)
        return x
    return chained if chain else independent


def run_size(M: int, NK: int, dtype, reps: int, rows: list) -> None:
    import torch
    import gpuos
    dev = "cuda"
    esz = torch.tensor([], dtype=dtype).element_size()
    L = max(4, min(64, (256 << 20) // (NK * NK * esz)))   # >= 256 MiB of weights: past the L2 cache
    ws = [torch.randn(NK, NK, device=dev, dtype=dtype) / NK ** 0.5 for _ in range(L)]
    x = torch.randn(M, NK, device=dev, dtype=dtype)
    outs = [torch.empty(M, NK, device=dev, dtype=dtype) for _ in range(L)]
    size = f"M{M}-N{NK}-K{NK}-{str(dtype).split('.')[-1]}"
    wbytes = L * NK * NK * esz

    seqs = sequences(ws, x, outs)
    progs = {p: H.capture_program(gpuos, linears(ws, chain=p == "chain"), (x,), torch.cuda.synchronize)[0]
             for p in ("independent", "chain")}

    # correctness first: the worker's products (live and replayed) against cuBLAS's
    close = lambda a, b: torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)  # noqa: E731
    seqs["chain", "cublas"]()
    ref_chain = outs[-1].clone()
    seqs["independent", "cublas"]()
    ref = [o.clone() for o in outs]
    for o in outs:
        o.fill_(float("nan"))
    seqs["independent", "gpuos_worker"]()
    torch.cuda.synchronize()
    correct = all(close(o, r) for o, r in zip(outs, ref))
    correct_prog = (all(close(o, r) for o, r in zip(progs["independent"](x), ref))
                    and close(progs["chain"](x), ref_chain))
    src = torch.empty(wbytes // esz, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    copy_ms = H.events_ms(lambda: dst.copy_(src), reps)
    copy_gbps = wbytes / (copy_ms * 1e-3) / 1e9
    rows.append(H.value_row(WORKLOAD, "copy", copy_ms * 1e3 / L, "us", size=size) | {"gbps": round(copy_gbps, 1)})
    n0 = len(rows)
    for pattern in ("independent", "chain"):
        prog = progs[pattern]
        for config in ("cublas", "gpuos_worker", "gpuos_program"):
            fn = (lambda: prog(x)) if config == "gpuos_program" else seqs[pattern, config]
            ms = H.events_ms(fn, reps)
            gbps = wbytes / (ms * 1e-3) / 1e9
            rows.append(H.value_row(WORKLOAD, config, ms * 1e3 / L, "us", size=f"{size}-{pattern}")
                        | {"gbps": round(gbps, 1), "of_copy": round(gbps / copy_gbps, 3), "products": L,
                           "correct": correct_prog if config == "gpuos_program" else correct}
                        | ({"levels": sum(prog.info()["levels"]), "fallbacks": len(prog.info()["fallbacks"])}
                           if config == "gpuos_program" else {}))
    print(f"{size}: copy {copy_gbps:.0f} GB/s; " + "; ".join(
        f"{r['config']} {r['size'].rsplit('-', 1)[-1]} {r['value']:.2f} us ({r['of_copy']:.0%} of copy)"
        for r in rows[n0:]), flush=True)


def grid(quick: bool) -> list:
    import torch
    ms = [1, 16] if quick else [1, 4, 16, 64]
    nks = [1024] if quick else [1024, 4096]
    dts = [torch.float16] if quick else [torch.float16, torch.bfloat16]
    return [(m, nk, dt) for dt in dts for nk in nks for m in ms]


def main(argv=None) -> int:
    return H.grid_main(__doc__, argv, "bench_matmul.py", NAME, WORKLOAD, grid, run_size,
                       lambda m, nk, dt: f"M{m}-N{nk}-{dt}")


if __name__ == "__main__":
    sys.exit(main())

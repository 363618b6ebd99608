#!/usr/bin/env python
"""Worker decode attention vs torch's SDPA backends (issue #16 microbenchmark): GPU time per attention.

    python benchmarks/bench_attention.py             # llama (32/8/128) and small (4/2/64) x KV 128..8192 x fp16,bf16
    python benchmarks/bench_attention.py --quick     # llama x KV 128, 4096 x fp16

For each (heads, KV length, dtype): L independent decode attentions (query length 1, batch 1; one KV cache per
"layer", L sized so the caches exceed the L2 cache, 4..64), timed with CUDA events (median of reps), reported per
attention ("value", us). Rows ("config"):
  torch_<b>        b in flash / efficient / math / cudnn (forced with sdpa_kernel; enable_gqa=True): the L calls
                   issued from Python -- host-inclusive (at short KV the launch overhead of each call dominates).
  torch_<b>_graph  the same L calls captured once in a CUDA graph, the replay timed: GPU-kernel time, no Python.
                   (cuDNN builds its plan per KV length, DESIGN F10: the length is fixed here, so the plan is built
                   in the warm-up and its rows are its best case.)
  gpuos_worker     gpuos.submit_attention per attention + ONE flush of all L (one level: the items of every
                   attention run concurrently) -- includes the host's L submits.
  gpuos_worker_1   one attention per flush, L times in sequence (the decode case: one attention per layer, each
                   layer's flush) -- includes a flush's host cost and the worker's launch / wake-up per attention.
  gpuos_program    the L torch calls (F.scaled_dot_product_attention, enable_gqa, worker attention on) captured
                   once as a program (gpuos.capture) and replayed: GPU time without Python per attention, as the
                   torch_*_graph rows; the L attentions are independent (one level: they run side by side).
  gpuos_program_chain  the same, but attention i + 1's query is attention i's output (one level per attention,
                   run one after another as a decode step's layers are; a CUDA graph runs its L kernels one
                   after another either way): the row to hold against torch_best for a decode step.
A backend torch refuses (or a graph capture that fails) gets a row with its error. torch_best (row) is the fastest
torch_*_graph row (its "backend" field); "of_best" on the worker rows = worker time / torch_best time (the issue's
goal: <= 1.2); "of_best_host" = worker time / the fastest host-inclusive torch row. Worker rows also carry
"stats": deltas of gpuos.stats() counters over one timed call (batches, worker launches, burst launches, ring-room
waits), to tell where worker time goes. "gbps": K and V bytes per second. Rows: BENCH_SCHEMA.md, workload "ATTN";
results: benchmarks/results/attention.json. Without a CUDA GPU: message, exit 0.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "attention"
WORKLOAD = "ATTN"
SHAPES = {"llama": (32, 8, 128), "small": (4, 2, 64)}  # query heads, KV heads, head_dim


def capture_with_worker_attention(fn):
    """gpuos.capture(fn) with the worker's decode attention on (restored after): the program's SDPA calls are
    worker tasks."""
    import gpuos
    was = gpuos.worker_attention_enabled()
    gpuos.set_worker_attention(True)
    try:
        return gpuos.capture(fn)
    finally:
        gpuos.set_worker_attention(was)


def chain_of_attentions(q, ks, vs):
    """fn() -> attention L's output, where attention i + 1's query is attention i's output (one level each)."""
    import torch.nn.functional as F

    def chain():
        x = q
        for k, v in zip(ks, vs):
            x = F.scaled_dot_product_attention(x, k, v, enable_gqa=True)
        return x
    return chain


def chain_reference(q, ks, vs):
    """chain_of_attentions' result in fp32 (math), rounded to q's dtype between attentions as the worker's output
    is; GQA by repeating the KV heads."""
    import torch.nn.functional as F
    x = q.float()
    for k, v in zip(ks, vs):
        G = q.shape[1] // k.shape[1]
        x = F.scaled_dot_product_attention(x, k.float().repeat_interleave(G, 1),
                                           v.float().repeat_interleave(G, 1)).to(q.dtype).float()
    return x


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

    def graph_fn(backend):  # the L calls captured once (after a warm-up on a side stream); the replay is timed
        fn = torch_fn(backend)
        g, _, _ = H.capture_cuda_graph(fn, fn)
        return g.replay

    def worker():
        for q, k, v, o in zip(qs, ks, vs, outs):
            gpuos.submit_attention(q, k, v, o)
        gpuos.flush()

    def worker_1():
        for q, k, v, o in zip(qs, ks, vs, outs):
            gpuos.submit_attention(q, k, v, o)
            gpuos.flush()

    def program_fns():  # (independent, chain) replays of programs captured with the worker's attention on
        def independent():
            return [F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for q, k, v in zip(qs, ks, vs)]
        return (capture_with_worker_attention(independent),
                capture_with_worker_attention(chain_of_attentions(qs[0], ks, vs)))

    def counters(fn):
        keys = ("batches", "publications", "worker_launches", "gated_launches", "burst_launches", "room_waits",
                "early_publishes", "joined_batches", "flushes")
        before = gpuos.stats()
        fn()
        torch.cuda.synchronize()
        after = gpuos.stats()
        return {k: after[k] - before[k] for k in keys if k in before and k in after}

    # correctness first: the worker against the math backend in fp32
    G = Hq // Hkv
    ref = [F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(G, 1),
                                          v.float().repeat_interleave(G, 1)) for q, k, v in zip(qs, ks, vs)]
    correct = {}
    for name, fn in (("gpuos_worker", worker), ("gpuos_worker_1", worker_1)):
        for o in outs:
            o.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        correct[name] = all(torch.allclose(o.float(), r, rtol=2e-2, atol=2e-2) for o, r in zip(outs, ref))
    prog_ind, prog_chain = program_fns()
    correct["gpuos_program"] = all(torch.allclose(o.float(), r, rtol=2e-2, atol=2e-2)
                                   for o, r in zip(prog_ind(), ref))
    correct["gpuos_program_chain"] = torch.allclose(prog_chain().float(), chain_reference(qs[0], ks, vs),
                                                    rtol=2e-2, atol=2e-2)
    levels = {c: {"levels": sum(i["levels"]), "segments": i["segments"], "eager_ops": len(i["fallbacks"])}
              for c, i in (("gpuos_program", prog_ind.info()), ("gpuos_program_chain", prog_chain.info()))}
    results, stats = {}, {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("math", SDPBackend.MATH), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        for config, make in ((f"torch_{name}", torch_fn), (f"torch_{name}_graph", graph_fn)):
            try:
                results[config] = H.events_ms(make(backend), reps)
            except Exception as e:  # noqa: BLE001 -- a backend that refuses the shape: a row that says why
                rows.append({"workload": WORKLOAD, "size": size, "config": config, "error": H.format_exc(e)})
    for config, fn in (("gpuos_worker", worker), ("gpuos_worker_1", worker_1), ("gpuos_program", prog_ind),
                       ("gpuos_program_chain", prog_chain)):
        results[config] = H.events_ms(fn, reps)
        stats[config] = counters(fn)
        stats[config] |= levels.get(config, {})
    best = min((c for c in results if c.endswith("_graph")), key=lambda c: results[c], default=None)
    best_host = min((c for c in results if c.startswith("torch_") and not c.endswith("_graph")),
                    key=lambda c: results[c], default=None)
    for config, ms in results.items():
        row = H.value_row(WORKLOAD, config, ms * 1e3 / L, "us", size=size) | {
            "gbps": round(kvbytes * L / (ms * 1e-3) / 1e9, 1), "attentions": L}
        if config in stats:
            row |= {"correct": correct[config], "stats": stats[config]}
            if best:
                row |= {"of_best": round(ms / results[best], 3), "best_backend": best}
            if best_host:
                row |= {"of_best_host": round(ms / results[best_host], 3), "best_host_backend": best_host}
        rows.append(row)
    if best:
        rows.append(H.value_row(WORKLOAD, "torch_best", results[best] * 1e3 / L, "us", size=size)
                    | {"backend": best.replace("torch_", "")})
    print(f"{size} (L={L}): " + "; ".join(f"{c} {ms * 1e3 / L:.2f}" for c, ms in results.items()) + " us/attn"
          + "".join(f"; {c}/best({best}) {results[c] / results[best]:.2f}x" for c in stats if best)
          + f"; stats {stats}"
          + "".join(f"  {c} WRONG RESULTS" for c in correct if not correct[c]), flush=True)


def grid(quick: bool) -> list:
    import torch
    shapes = ["llama"] if quick else list(SHAPES)
    kvs = [128, 4096] if quick else [128, 512, 2048, 8192]
    dts = [torch.float16] if quick else [torch.float16, torch.bfloat16]
    return [(shape, kv, dt) for dt in dts for shape in shapes for kv in kvs]


def main(argv=None) -> int:
    return H.grid_main(__doc__, argv, "bench_attention.py", NAME, WORKLOAD, grid, run_size,
                       lambda shape, kv, dt: f"{shape}-KV{kv}-{dt}")


if __name__ == "__main__":
    sys.exit(main())

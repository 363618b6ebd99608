#!/usr/bin/env python
"""Where a replayed program's time goes (issue #17), GPU machine, ~1 min. Prints one JSON line per probe.

* chain: D dependent tiny elementwise ops (one sub-op per level): GPU us per call and per level for the program,
  its CUDA-graph replay and eager; host us of one prog() call (no sync).
* wide: W independent tiny ops (one level).
* walk: the device's cost of a level alone: programs of D dependent tiny levels (a fused chain; a softmax chain)
  replayed while the stream is held by a sleeping kernel, so that every call is published before the GPU
  starts on them; GPU us per level from events recorded after the sleep.
* norm: programs of 16 dependent RMSNorms (HF's hand-written form) / LayerNorms at hidden 256 / 768 / 4096 (fp16),
  replayed gated as in walk: GPU us per norm and the levels they take (row programs: one level per norm).
* matmul: 12 dependent M=1 products N=K (fp16, the worker's matmul in the program) vs their CUDA graph (cuBLAS).
* mix: whether a level pays for the op class before it (cold code): gated programs at hidden H (env MIX_HIDDEN,
  256) of 16 RMSNorms, of 16 linears, and of 16 (RMSNorm, linear) pairs: us per level of each; the pairs' level
  against the mean of the two uniform chains' levels.
* hf: W7's llama-small / gpt2-small static decode replayed as a program, with the capture's size threshold at
  the scheduler's default and at 2**18 (fewer eager steps), ms per step.
* host: host us of one call by path (the C++ call + image replay, the Python call + image replay, the Python
  call staging entry by entry), median of calls each started on an idle GPU; small programs and W7's llama-small /
  gpt2-small static decode steps.

* callcost: a call's fixed cost (forty-second session): programs of k mean-subtract rounds on a 16 x 256 tensor
  (k = 0: a fused elementwise chain), one call then a device sync (its latency: a resident worker's idle timeout
  is in it), and 1,000 calls back to back (us per call; the host's per-call p10 / p50 / p90 -- a p90 near
  GPUOS_IDLE_US is the host blocked in a standby launch while the resident worker waits out its idle time; the
  spans between CUDA events recorded between calls); launches per call; the CUDA graph of k = 1 / 8 (back to back,
  and one replay then a sync). single_split_us: one call's medians until it returns (host), until the caller's
  stream has passed it (stream), until the device sync (sync: the worker's exit in it), and the GPU time between
  events around it on the caller's stream (event_span).
* loop: W5's block called back to back as bench_mlp's loop does (outputs kept or dropped; one doorbell per run
  or per level): us per call until a device sync / the stream's last event, host us per call, stats per call.

`python tools/program_probe.py chain wide` runs those probes only (default: all).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpuos  # noqa: E402  (sets CUDA_MODULE_LOADING before CUDA starts)
import gpuos_ext  # noqa: E402
import torch  # noqa: E402


def gpu_us(fn, reps=200, warmup=3, gated=False):
    """GPU us per call of `fn` (CUDA events around `reps` calls). gated: every call is published while the stream
    sleeps (~0.1 s, far longer than publishing them), so the host's cost is hidden."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if gated:
        torch.cuda._sleep(200_000_000)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def host_us(fn, reps=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    h = (time.perf_counter() - t) * 1e6 / reps
    torch.cuda.synchronize()
    return h


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def out(d):
    print(json.dumps(d), flush=True)


def chain(depth):
    def f(x):
        for _ in range(depth):
            x = x * 1.0001 + 0.5
        return x
    return f


def chain_probe():
    x = torch.randn(1024, device="cuda")
    for depth in (1, 16, 64, 256):
        f = chain(depth)
        prog = gpuos.capture(f, x)
        lv = sum(prog.info()["levels"])
        s0 = gpuos.stats()
        p = gpu_us(lambda: prog(x))
        s1 = gpuos.stats()
        h = host_us(lambda: prog(x))
        g = graph_of(lambda: f(x))
        gr = gpu_us(g.replay)
        e = gpu_us(lambda: f(x), reps=50)
        out({"probe": "chain", "depth": depth, "levels": lv, "program_us": round(p, 1), "per_level_us":
             round(p / max(lv, 1), 2), "host_us": round(h, 1), "cudagraph_us": round(gr, 1), "eager_us": round(e, 1),
             "x_graph": round(gr / p, 2), "handovers": s1["handovers"] - s0["handovers"],
             "batches_per_call": round((s1["batches"] - s0["batches"]) / 203, 1)})


def wide_probe():
    ys = [torch.randn(1024, device="cuda") for _ in range(256)]

    def wide(*ts):
        return [t * 2.0 + 1.0 for t in ts]
    prog = gpuos.capture(wide, *ys)
    p, h = gpu_us(lambda: prog(*ys)), host_us(lambda: prog(*ys))
    g = graph_of(lambda: wide(*ys))
    out({"probe": "wide", "ops": 512, "levels": sum(prog.info()["levels"]), "program_us": round(p, 1),
         "host_us": round(h, 1), "cudagraph_us": round(gpu_us(g.replay), 1)})


def walk_probe():
    x = torch.randn(1024, device="cuda")

    def soft(x, depth=64):
        for _ in range(depth):
            x = torch.softmax(x, -1) * 2.0
        return x
    for name, f in (("fused chain 256", chain(256)), ("softmax chain 64", soft)):
        prog = gpuos.capture(f, x)
        lv = sum(prog.info()["levels"])
        reps = max(1, 600 // max(lv, 1))  # in-flight batches stay well under kMaxBatches
        t = [gpu_us(lambda: prog(x), reps, warmup=1, gated=True) for _ in range(3)]
        out({"probe": "walk", "program": name, "levels": lv, "reps": reps, "gated_us_per_call": round(min(t), 1),
             "us_per_level": round(min(t) / max(lv, 1), 2)})


def norm_probe():
    import torch.nn.functional as F

    def rms(x, w):
        for _ in range(16):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            x = w * h.to(x.dtype)
        return x

    def ln(x, w):
        for _ in range(16):
            x = F.layer_norm(x, (x.shape[-1],), w, w, 1e-5)
        return x
    for hidden in [int(h) for h in os.environ.get("PROBE_NORM_HIDDEN", "256,768,4096").split(",")]:
        x = torch.randn(1, 1, hidden, device="cuda", dtype=torch.float16)
        w = torch.rand(hidden, device="cuda", dtype=torch.float16) + 0.5
        for name, f in (("rmsnorm", rms), ("layernorm", ln)):
            for rows in (True, False):
                gpuos.set_row_fusion(rows)
                prog = gpuos.capture(f, x, w)
                lv = sum(prog.info()["levels"])
                reps = max(1, 600 // max(lv, 1))  # in-flight batches stay well under kMaxBatches
                for tier2 in (False, True):
                    if tier2:  # 16 uses of each program per call: past specialize_after, then its generation
                        for _ in range(8):
                            prog(x, w)
                        gpuos_ext.wait_generations()
                    t = [gpu_us(lambda: prog(x, w), reps, warmup=2, gated=True) for _ in range(3)]
                    ok = bool(torch.allclose(prog(x, w).float(), f(x, w).float(), rtol=2e-2, atol=2e-2))
                    out({"probe": "norm", "norm": name, "hidden": hidden, "row_fusion": rows, "tier2_waited": tier2,
                         "levels": lv, "us_per_norm": round(min(t) / 16, 2),
                         "us_per_level": round(min(t) / max(lv, 1), 2), "equal_eager": ok})
    gpuos.set_row_fusion(True)


def matmul_probe():
    gpuos.set_worker_matmul(True)
    for n in (768, 3072):
        ws = [torch.randn(n, n, device="cuda", dtype=torch.float16) * (1.0 / n ** 0.5) for _ in range(12)]
        h0 = torch.randn(1, n, device="cuda", dtype=torch.float16)

        def mlp(h):
            for w in ws:
                h = torch.nn.functional.linear(h, w)
            return h
        prog = gpuos.capture(mlp, h0)
        p = gpu_us(lambda: prog(h0))
        g = graph_of(lambda: mlp(h0))
        gr = gpu_us(g.replay)
        out({"probe": "matmul", "n": n, "products": 12, "tiles": prog.info()["tiles"],
             "levels": sum(prog.info()["levels"]), "program_us": round(p, 1), "cudagraph_us": round(gr, 1),
             "x_graph": round(gr / p, 2), "weights_MB": round(12 * n * n * 2 / 2**20, 1),
             "program_GBps": round(12 * n * n * 2 / p / 1e3, 1), "graph_GBps": round(12 * n * n * 2 / gr / 1e3, 1)})
    gpuos.set_worker_matmul(False)


def mix_probe():
    gpuos.set_worker_matmul(True)
    h = int(os.environ.get("MIX_HIDDEN", "256"))
    ws = [torch.randn(h, h, device="cuda", dtype=torch.float16) * (1.0 / h ** 0.5) for _ in range(16)]
    g = torch.rand(h, device="cuda", dtype=torch.float16) + 0.5
    x = torch.randn(1, 1, h, device="cuda", dtype=torch.float16)

    def norm(x):
        t = x.to(torch.float32)
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)
        return g * t.to(x.dtype)

    def norms(x):
        for _ in range(16):
            x = norm(x)
        return x

    def linears(x):
        for w in ws:
            x = torch.nn.functional.linear(x, w)
        return x

    def pairs(x):
        for w in ws:
            x = torch.nn.functional.linear(norm(x), w)
        return x
    per = {}
    for name, f in (("norms", norms), ("linears", linears), ("pairs", pairs)):
        prog = gpuos.capture(f, x)
        lv = sum(prog.info()["levels"])
        reps = max(1, 600 // max(lv, 1))
        t = [gpu_us(lambda: prog(x), reps, warmup=2, gated=True) for _ in range(3)]
        ok = bool(torch.allclose(prog(x).float(), f(x).float(), rtol=3e-2, atol=3e-2))
        per[name] = min(t) / max(lv, 1)
        out({"probe": "mix", "hidden": h, "program": name, "levels": lv, "gated_us_per_call": round(min(t), 1),
             "us_per_level": round(per[name], 2), "equal_eager": ok})
    out({"probe": "mix", "hidden": h, "pairs_level_over_mean_uniform": round(
        per["pairs"] / ((per["norms"] + per["linears"]) / 2), 2)})
    gpuos.set_worker_matmul(False)


def hf_probe():
    try:
        import transformers  # noqa: F401  (bench_models needs it)
    except ImportError:
        return
    from benchmarks import bench_models as B
    import gpuos.programs as P
    for label in ("llama-small-fp16-sdpa-static", "gpt2-small-fp16-sdpa-static"):
        case = B.make_case(label, 8, "cuda")
        thresholds = [int(t) for t in os.environ.get("PROBE_HF_THRESHOLDS", f"{1 << 15},{1 << 18}").split(",")]
        for thr, rows in ((t, r) for t in thresholds for r in (True, False)):
            P.DEFAULT_SIZE_THRESHOLD = thr
            if hasattr(gpuos, "set_row_fusion"):
                gpuos.set_row_fusion(rows)
            elif not rows:
                continue
            prep = B.setup_program(case, settle=False)  # timed before and after tier 2
            toks, _ = prep.fn()
            ok = bool(torch.equal(toks, case.ref[0]))
            t = gpu_us(prep.fn, reps=10) / 1e3 / 8
            gpuos_ext.wait_generations()  # the hot programs' tier-2 code (requested after 64 uses) is in
            t2 = gpu_us(prep.fn, reps=10) / 1e3 / 8
            out({"probe": "hf", "label": label, "size_threshold": thr, "row_fusion": rows, "ms_per_step": round(t, 3),
                 "ms_per_step_tier2_waited": round(t2, 3), "tokens_equal": ok,
                 **{k: prep.extra[k] for k in ("subops_per_step", "segments_per_step", "levels_per_step",
                                               "eager_ops_per_step", "tiles_per_step") if k in prep.extra}})
    if hasattr(gpuos, "set_row_fusion"):
        gpuos.set_row_fusion(True)


def host_call_us(fn, reps):
    """Median host us of one call of `fn` started on an idle GPU (a sync before each call, outside the timing): the
    call's own cost, never a wait for earlier work (the ring and the arena are empty)."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return sorted(ts)[len(ts) // 2] * 1e6


def host_probe():
    """Host cost of one call by path (issue #17 acceptance 4): the C++ call with an image replay (the default),
    the Python call with an image replay, the Python call staging entry by entry (before images)."""
    from torch.utils import _pytree as pytree
    set_images = gpuos_ext._testing.set_tape_images

    def paths(prog, args, reps):
        flat, spec = pytree.tree_flatten((tuple(args), {}))
        keys = ("program_call_ns", "replay_stage_ns", "publish_ns", "publish_copy_ns", "publish_memop_ns",
                "publish_launch_ns")
        s0 = gpuos.stats()
        r = {"cpp_image": host_call_us(lambda: prog(*args), reps)}
        s1 = gpuos.stats()
        r.update({k.replace("_ns", "_us"): (s1[k] - s0[k]) / 1e3 / reps for k in keys})
        r["program_bells"] = (s1["program_bells"] - s0["program_bells"]) / reps
        r["ref_site_writes"] = (s1["ref_site_writes"] - s0["ref_site_writes"]) / reps
        gpuos_ext._testing.set_program_runs(False)  # a ready word per level (before program runs)
        r["cpp_image_level_bells"] = host_call_us(lambda: prog(*args), reps)
        gpuos_ext._testing.set_program_runs(True)
        r["py_image"] = host_call_us(lambda: prog._run(flat, spec), reps)
        set_images(False)
        r["py_entries"] = host_call_us(lambda: prog._run(flat, spec), reps)
        set_images(True)
        return {k: round(v, 1) for k, v in r.items()}

    x = torch.randn(1024, device="cuda")
    for depth in (1, 16):
        prog = gpuos.capture(chain(depth), x)
        i = prog.info()
        out({"probe": "host", "what": f"chain{depth}", "fast_call": i["fast_call"], "levels": sum(i["levels"]),
             "tiles": i["tiles"], **paths(prog, (x,), 200)})
    a, b = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    prog = gpuos.capture(lambda p, q: (torch.softmax(p * q, -1), (p - q).abs().sum(-1)), a, b)
    i = prog.info()
    out({"probe": "host", "what": "two_outputs", "fast_call": i["fast_call"], "levels": sum(i["levels"]),
         "tiles": i["tiles"], **paths(prog, (a, b), 200)})
    try:
        import transformers  # noqa: F401
    except ImportError:
        return
    from benchmarks import bench_models as B
    for label in ("llama-small-fp16-sdpa-static", "gpt2-small-fp16-sdpa-static"):
        case = B.make_case(label, 8, "cuda")
        prep = B.setup_program(case)
        prep.fn()
        # the step program is the closure's `prog`: replay step 0's arguments (positions are device tensors)
        prog = next(c.cell_contents for c in prep.fn.__closure__ if isinstance(c.cell_contents, gpuos.programs.Program))
        d = case.data
        tok = d.forced[0].contiguous().clone()
        i = prog.info()
        out({"probe": "host", "what": label, "fast_call": i["fast_call"], "segments": i["segments"],
             "levels": sum(i["levels"]), "tiles": i["tiles"], **paths(prog, (tok, d.positions[0]), 50)})


def loop_probe():
    """W5's MLP block (fp16, worker matmul) captured and called back to back as bench_mlp's gpuos_program loop
    does: us per call until a device sync, until the stream's last event, and the host's; per call stats.
    Variants: outputs kept (the bench keeps every step's output) or dropped; one doorbell per run or per level;
    gated standby launches deciding at their first idle poll or after 32 polls (the behaviour before)."""
    from benchmarks import bench_mlp as M
    from benchmarks.harness import suite as H
    keys = ("publications", "worker_launches", "gated_launches", "batches", "dma_batches", "program_bells",
            "ref_site_writes", "room_waits")
    for size in ("1x256", "1x1024"):
        case = M.make_case(size, 1000, "cuda")
        d = case.data
        prog, _ = H.capture_program(gpuos, lambda x: M.mlp_block(x, *M._weights(d)), (d.x,), torch.cuda.synchronize)
        # outputs kept, one doorbell per run, standbys' first look; the first variant again last (order effects)
        variants = [(True, True, True), (True, True, False), (False, True, True), (True, False, True), (True, True, True)]
        n = 1000
        warm = [prog(d.x) for _ in range(n)]  # the caching allocator holds n outputs before any timed loop
        torch.cuda.synchronize()
        del warm
        for keep, runs, look in variants:
            gpuos_ext._testing.set_program_runs(runs)
            gpuos_ext._testing.set_standby_first_look(look)
            for _ in range(20):
                prog(d.x)
            torch.cuda.synchronize()
            s0 = gpuos.stats()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            kept = []
            t0 = time.perf_counter()
            e0.record()
            for _ in range(n):
                y = prog(d.x)
                if keep:
                    kept.append(y)
            e1.record()
            th = time.perf_counter()
            e1.synchronize()
            ts = time.perf_counter()
            torch.cuda.synchronize()
            td = time.perf_counter()
            s1 = gpuos.stats()
            out({"probe": "loop", "size": size, "keep_outputs": keep, "runs": runs, "standby_first_look": look,
                 "us_per_call_device_sync": round((td - t0) * 1e6 / n, 1),
                 "us_per_call_stream": round((ts - t0) * 1e6 / n, 1),
                 "us_per_call_events": round(e0.elapsed_time(e1) * 1e3 / n, 1),
                 "host_us_per_call": round((th - t0) * 1e6 / n, 1),
                 **{k: round((s1[k] - s0[k]) / n, 2) for k in keys}})
        gpuos_ext._testing.set_program_runs(True)
        gpuos_ext._testing.set_standby_first_look(True)
        from benchmarks import harness as HH
        g, _, _ = HH.capture_cuda_graph(lambda: M.mlp_block(d.x, *M._weights(d)), lambda: M.mlp_block(d.x, *M._weights(d)))
        out({"probe": "loop", "size": size, "cudagraph_us_per_call": round(gpu_us(g.replay, reps=1000), 1)})


def _q(v, p):
    v = sorted(v)
    return round(v[min(len(v) - 1, int(p * len(v)))], 1)


def _call_then_sync_us(fn, reps=200):
    """Host us of `fn()` then torch.cuda.synchronize(), `reps` times."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e6)
    return times


def callcost_fn(k):
    """callcost's program body on a 16 x 256 tensor: k mean-subtract rounds (row programs), or for k = 0 a fused
    elementwise chain (one level). Also tools/worker_trace.py calls' CALLS_SIZE=ew / rounds<k>."""
    def f(t):
        for _ in range(k):
            t = (t - t.mean(-1, keepdim=True)) * 0.5
        return t
    return f if k else (lambda t: torch.sigmoid(torch.relu(t + 1.0) * 2.0))


def callcost_probe():
    x = torch.randn(16, 256, device="cuda")
    for k in (0, 1, 2, 4, 8):
        f = callcost_fn(k)
        prog = gpuos.capture(f, x)
        torch.testing.assert_close(prog(x), f(x), rtol=1e-4, atol=1e-5)
        for _ in range(50):
            prog(x)
        torch.cuda.synchronize()
        single = _call_then_sync_us(lambda: prog(x))
        # The same single call split: until the call returns (host), until the caller's stream has passed it (an
        # event after it, synchronized: the output is ready), until the device sync (the worker's exit); and the
        # GPU time between events recorded before and after it on the caller's stream.
        parts = {"host": [], "stream": [], "sync": [], "event_span": []}
        for _ in range(200):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            t = time.perf_counter()
            prog(x)
            t_host = time.perf_counter()
            e1.record()
            e1.synchronize()
            t_stream = time.perf_counter()
            torch.cuda.synchronize()
            t_sync = time.perf_counter()
            parts["host"].append((t_host - t) * 1e6)
            parts["stream"].append((t_stream - t) * 1e6)
            parts["sync"].append((t_sync - t) * 1e6)
            parts["event_span"].append(e0.elapsed_time(e1) * 1e3)
        n = 1000
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        host = []
        s0 = gpuos.stats()
        s0_gen = gpuos.generation_info()["active"][torch.cuda.current_device()]
        t0 = time.perf_counter()
        for i in range(n):
            evs[i].record()
            t = time.perf_counter()
            prog(x)
            host.append((time.perf_counter() - t) * 1e6)
        evs[n].record()
        th = time.perf_counter()
        torch.cuda.synchronize()
        td = time.perf_counter()
        s1 = gpuos.stats()
        span = [evs[i].elapsed_time(evs[i + 1]) * 1e3 for i in range(n)]
        out({"probe": "callcost", "rounds": k, "levels": prog.info()["levels"], "single_call_us": _q(single, .5),
             "single_split_us": {key: _q(v, .5) for key, v in parts.items()},
             "back_to_back_us": round((td - t0) * 1e6 / n, 1), "host_us": round((th - t0) * 1e6 / n, 1),
             "host_p10_p50_p90": [_q(host, .1), _q(host, .5), _q(host, .9)],
             "span_p10_p50_p90": [_q(span, .1), _q(span, .5), _q(span, .9)],
             **{key: round((s1[key] - s0[key]) / n, 3) for key in ("worker_launches", "working_launches")},
             # the generation the loop ended on (a program's tier-2 code: a newer one than at its start) and the
             # handovers during it (busy_adoptions: taken while the worker was resident)
             "generation": [s0_gen, gpuos.generation_info()["active"][torch.cuda.current_device()]],
             "busy_adoptions": s1["busy_adoptions"] - s0["busy_adoptions"]})
    for k in (1, 8):
        f = callcost_fn(k)
        g = graph_of(lambda: f(x))
        out({"probe": "callcost", "rounds": k, "cudagraph_us": round(gpu_us(g.replay, reps=1000), 1),
             "cudagraph_single_call_us": _q(_call_then_sync_us(g.replay), .5)})  # what single_call_us compares with


PROBES = {"chain": chain_probe, "wide": wide_probe, "walk": walk_probe, "norm": norm_probe, "matmul": matmul_probe,
          "mix": mix_probe, "hf": hf_probe, "host": host_probe, "loop": loop_probe,
          "callcost": callcost_probe}


def main(names=tuple(PROBES)):
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        raise SystemExit(f"program_probe: unknown probe(s) {unknown}; choose from {list(PROBES)}")
    gpuos.init()
    # PROBE_STREAM=new: every probe on a fresh torch stream (non-blocking) instead of the legacy default stream.
    stream = torch.cuda.Stream() if os.environ.get("PROBE_STREAM") == "new" else torch.cuda.current_stream()
    print(json.dumps({"probe_stream": "new" if stream != torch.cuda.default_stream() else "default"}), flush=True)
    with torch.cuda.stream(stream):
        for n in names:
            PROBES[n]()


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or tuple(PROBES))

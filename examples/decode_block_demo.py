"""An attention-decode-style transformer block, one token at a time, under gpuos.scheduler_context().

    python examples/decode_block_demo.py [--steps 256] [--kv-len 256] [--dim 512] [--heads 8]

Per step (batch 1): RMSNorm -> q/k/v projections -> write k/v into a ring KV cache of kv_len slots ->
scores = q @ K^T * scale -> softmax -> @ V -> output projection + residual -> RMSNorm -> SwiGLU MLP + residual.
The projections (matmul / bmm) and the cache writes fall back to eager; the small elementwise ops, the
mean of the norms and the softmax are batched. Runs 256 decode steps eagerly and under the scheduler
from the same state, compares the final hidden state (exit 1 on a mismatch), prints eager vs scheduler
ms and gpuos.stats(). Without a GPU it says so, checks CPU pass-through on a few steps, and exits 0.

benchmarks/bench_scheduler.py imports make_state / clone_state / decode for its "decode" workload.
"""
import argparse
import faulthandler
import os
import sys
import time

import torch
import torch.nn.functional as F

os.environ.setdefault("GPUOS_TIMEOUT_S", "10")
import gpuos  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-3)  # fp32; the hidden state grows to O(100) over 256 residual steps


def make_state(device, dim=512, heads=8, kv_len=256, ffn=1024, dtype=torch.float32, seed=0):
    """Weights, a pre-filled ring KV cache of kv_len slots, and the first hidden state x (1, dim)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)
    hd = dim // heads
    return dict(
        heads=heads,
        wq=r(dim, dim, scale=dim ** -0.5), wk=r(dim, dim, scale=dim ** -0.5), wv=r(dim, dim, scale=dim ** -0.5),
        wo=r(dim, dim, scale=0.5 * dim ** -0.5),
        w1=r(dim, ffn, scale=dim ** -0.5), w3=r(dim, ffn, scale=dim ** -0.5), w2=r(ffn, dim, scale=0.5 * ffn ** -0.5),
        n1=1 + r(dim, scale=0.1), n2=1 + r(dim, scale=0.1),
        K=r(heads, kv_len, hd), V=r(heads, kv_len, hd),
        x=r(1, dim),
    )


def clone_state(s):
    """A copy whose KV cache (mutated by decode) is private; weights are shared."""
    c = dict(s)
    c["K"], c["V"], c["x"] = s["K"].clone(), s["V"].clone(), s["x"].clone()
    return c


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def decode_step(s, x, i):
    H = s["heads"]
    K, V = s["K"], s["V"]
    T, hd = K.shape[1], K.shape[2]
    D = x.shape[-1]
    h = rms_norm(x, s["n1"])                                   # batched: pow, mean, add, rsqrt, mul, mul
    q = (h @ s["wq"]).view(H, 1, hd)                           # projections: eager (cuBLAS)
    K[:, i % T] = (h @ s["wk"]).view(H, hd)                    # ring KV-cache write: eager copy
    V[:, i % T] = (h @ s["wv"]).view(H, hd)
    p = torch.softmax((q @ K.transpose(1, 2)) * hd ** -0.5, dim=-1)   # bmm eager; mul + softmax batched
    x = x + (p @ V).reshape(1, D) @ s["wo"]                    # residual add batched
    h = rms_norm(x, s["n2"])
    u = F.silu(h @ s["w1"]) * (h @ s["w3"])                    # silu, mul batched
    return x + u @ s["w2"]


def decode(s, steps):
    x = s["x"]
    for i in range(steps):
        x = decode_step(s, x, i)
    return x


def cpu_only(args) -> int:
    print("gpuos decode block demo: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
          "nothing is batched here.")
    s = make_state("cpu", dim=args.dim, heads=args.heads, kv_len=args.kv_len)
    steps = min(args.steps, 4)
    exp = decode(clone_state(s), steps)
    with gpuos.scheduler_context():
        got = decode(clone_state(s), steps)
    same = torch.equal(got, exp)
    print(f"  {steps} CPU decode steps pass through the context unchanged: {'yes' if same else 'NO'}")
    return 0 if same else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="attention-decode block: eager vs gpuos scheduler")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--kv-len", type=int, default=256)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    faulthandler.dump_traceback_later(300, exit=True)
    if not torch.cuda.is_available():
        return cpu_only(args)
    gpuos.init()
    s = make_state("cuda", dim=args.dim, heads=args.heads, kv_len=args.kv_len)

    exp = decode(clone_state(s), args.steps)
    before = gpuos.stats()
    with gpuos.scheduler_context():
        got = decode(clone_state(s), args.steps)
    after = gpuos.stats()
    try:
        torch.testing.assert_close(got, exp, **TOL)
        ok = True
        print(f"{args.steps} decode steps: scheduler matches eager (max |diff| "
              f"{(got - exp).abs().max().item():.2e}, max |x| {exp.abs().max().item():.1f})")
    except AssertionError as e:
        ok = False
        print(f"{args.steps} decode steps: MISMATCH {' '.join(str(e).split())[:300]}")
    n_int = after["ops_intercepted"] - before["ops_intercepted"]
    print(f"ops batched per step: {n_int / args.steps:.1f}")

    def timed(fn):
        best = float("inf")
        for _ in range(args.reps):
            st = clone_state(s)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(st)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    def sched(st):
        with gpuos.scheduler_context():
            return decode(st, args.steps)

    t_e = timed(lambda st: decode(st, args.steps))
    t_s = timed(sched)
    print(f"eager     {t_e:8.2f} ms  ({t_e * 1e3 / args.steps:7.1f} us/step)")
    print(f"scheduler {t_s:8.2f} ms  ({t_s * 1e3 / args.steps:7.1f} us/step)  speedup {t_e / t_s:.2f}x")
    print("gpuos.stats():", gpuos.stats())
    print("result:", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Transparent scheduler, quick correctness demo: ordinary PyTorch code under gpuos.scheduler_context().

    python examples/pytorch_scheduler_demo.py

The same code runs eagerly and under the context; results are compared (exit 1 on a mismatch). Matmuls
fall back to eager; the small elementwise ops, softmax and last-dim reductions are batched onto the GPUOS
worker. Prints the timings of both and gpuos.stats(). Without a GPU it says so, checks that CPU tensors
pass through the context unchanged, and exits 0.
"""
import faulthandler
import os
import sys

import torch
import torch.nn.functional as F

os.environ.setdefault("GPUOS_TIMEOUT_S", "10")  # a stuck GPU wait becomes an error, not a hang
import gpuos  # noqa: E402
from _timing import timed  # noqa: E402


def mlp_block(x, p):
    """Pre-norm MLP block with a residual: layernorm from mean/var, GELU, softmax over the output."""
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    h = xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + 1e-5) * p["g"] + p["b"]
    h = F.gelu(h @ p["w1"] + p["b1"])                 # matmul: eager; + and gelu: batched
    y = x + (h @ p["w2"] + p["b2"])
    return y, torch.softmax(y * 0.5, dim=-1)


def small_ops(a, b, c, iters):
    """Many tiny ops: the launch-bound case the scheduler is for."""
    out = a
    for _ in range(iters):
        x = out + b
        y = x * c
        out = torch.sigmoid(torch.relu(y)) - 0.25
    return out


def under_scheduler(fn):
    def run():
        with gpuos.scheduler_context():
            return fn()
    return run


def make_params(device, dim=256, hidden=1024):
    g = torch.Generator().manual_seed(0)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)
    return dict(g=1 + r(dim, scale=0.1), b=r(dim, scale=0.1), w1=r(dim, hidden, scale=dim ** -0.5), b1=r(hidden),
                w2=r(hidden, dim, scale=hidden ** -0.5), b2=r(dim, scale=0.1))


def check(name, got, exp, rtol, atol):
    try:
        torch.testing.assert_close(got, exp, rtol=rtol, atol=atol)
        print(f"  {name:<28} matches eager")
        return True
    except AssertionError as e:
        print(f"  {name:<28} MISMATCH: {' '.join(str(e).split())[:300]}")
        return False


def cpu_only() -> int:
    print("gpuos scheduler demo: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
          "nothing is batched here.")
    p = make_params("cpu")
    x = torch.randn(8, 256)
    exp = mlp_block(x, p)
    with gpuos.scheduler_context():
        got = mlp_block(x, p)
    same = all(torch.equal(g, e) for g, e in zip(got, exp))
    print(f"  CPU tensors pass through the context unchanged: {'yes' if same else 'NO'}")
    return 0 if same else 1


def main() -> int:
    faulthandler.dump_traceback_later(300, exit=True)
    if not torch.cuda.is_available():
        return cpu_only()
    torch.manual_seed(0)
    dev = "cuda"
    gpuos.init()
    p = make_params(dev)
    x = torch.randn(8, 256, device=dev)
    a, b, c = (torch.randn(4096, device=dev) for _ in range(3))
    iters = 200

    ok = True
    print("correctness (eager vs scheduler):")
    exp = mlp_block(x, p)
    with gpuos.scheduler_context():
        got = mlp_block(x, p)
    ok &= check("mlp block output", got[0], exp[0], 1e-4, 1e-4)
    ok &= check("mlp block softmax", got[1], exp[1], 1e-4, 1e-6)
    exp_s = small_ops(a, b, c, iters)
    with gpuos.scheduler_context():
        got_s = small_ops(a, b, c, iters)
    ok &= check(f"{4 * iters} small ops", got_s, exp_s, 1e-4, 1e-5)

    before = gpuos.stats()
    print("\ntimings (best of 5, host wall clock incl. torch.cuda.synchronize()):")
    t_e = timed(lambda: small_ops(a, b, c, iters))
    t_s = timed(under_scheduler(lambda: small_ops(a, b, c, iters)))
    print(f"  {4 * iters} small ops   eager {t_e:8.3f} ms   scheduler {t_s:8.3f} ms   ({t_e / t_s:.2f}x)")
    t_e = timed(lambda: mlp_block(x, p))
    t_s = timed(under_scheduler(lambda: mlp_block(x, p)))
    print(f"  mlp block        eager {t_e:8.3f} ms   scheduler {t_s:8.3f} ms   ({t_e / t_s:.2f}x)")
    st = gpuos.stats()
    print("\ngpuos.stats():", {k: st[k] for k in ("ops_intercepted", "fallbacks", "flushes_by_cause",
                                                  "mean_batch_size", "batches", "worker_launches")})
    print(f"ops batched during the timings: {st['ops_intercepted'] - before['ops_intercepted']}")
    print("result:", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

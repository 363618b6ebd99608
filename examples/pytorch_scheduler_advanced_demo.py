"""Transparent scheduler, the harder cases: broadcasting, non-contiguous views, mixed fp16 + fp32 (+ bf16),
in-place updates on views of pending tensors, host reads inside the context.

    python examples/pytorch_scheduler_advanced_demo.py

Every case runs eagerly and under gpuos.scheduler_context() from the same inputs and is compared
(exit 1 on a mismatch); timings of the whole case list are printed for both. Without a GPU it says so,
checks that CPU tensors pass through the context unchanged, and exits 0.
"""
import faulthandler
import os
import sys

import torch
import torch.nn.functional as F

os.environ.setdefault("GPUOS_TIMEOUT_S", "10")
import gpuos  # noqa: E402
from _timing import timed  # noqa: E402


def make_inputs(device):
    g = torch.Generator().manual_seed(1)

    def r(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)
    return dict(
        x=r(64, 96), row=r(96), col=r(64, 1), s=r(1, 96),
        t=r(96, 64),                       # used transposed
        wide=r(64, 192),                   # used with a step-2 slice
        h=r(64, 96, dtype=torch.float16), bf=r(96, dtype=torch.bfloat16),
        e=r(1, 96),                        # expanded to (64, 96)
    )


def broadcast(d):
    x = d["x"]
    return x + d["row"], x * d["col"], (x - d["s"]) / (d["col"].abs() + 1), torch.maximum(x, d["row"][None, :])


def noncontiguous(d):
    tt = d["t"].t()                          # (64, 96), column-major
    sl = d["wide"][:, ::2]                   # (64, 96), stride 2
    ex = d["e"].expand(64, 96)               # stride 0
    return tt + sl, torch.tanh(tt) * ex, F.gelu(sl - tt), (tt * 2).sum(-1), torch.softmax(sl, -1)


def mixed_precision(d):
    h, x = d["h"], d["x"]
    return (h + x,                           # f16 + f32 -> f32
            h * 0.5 + 1,                     # stays f16
            F.silu(h) * d["bf"],             # f16 x bf16 -> f32
            torch.softmax(h, -1),            # f16 softmax
            x.half() - h)


def views_of_pending(d):
    y = d["x"] * 2 + 1                       # pending
    top = y[:8]                              # a view of it (falls back: flushes first)
    top.mul_(-1)                             # in place through the view, batched
    y[:, :4].relu_()                         # in place on a strided view
    return y, y.t() + d["row"][:, None], y.mean(-1, keepdim=True)


def host_reads(d):
    x = d["x"]
    z = torch.sigmoid(x * 3)
    n = int((z > 0.5).sum().item())          # host read inside the context: pending work flushed first
    scale = 1.0 / max(n, 1)
    return z * scale, torch.tensor(float(n))


CASES = [("broadcast", broadcast), ("non-contiguous views", noncontiguous), ("fp16 + fp32 + bf16", mixed_precision),
         ("views of pending tensors", views_of_pending), ("host reads", host_reads)]
TOL = dict(rtol=2e-3, atol=2e-3)  # half-precision cases; fp32 cases agree far closer


def run_all(d):
    return [fn(d) for _, fn in CASES]


def clone(d):
    return {k: v.clone() for k, v in d.items()}


def compare(got, exp, exact=False):
    bad = []
    for (name, _), g, e in zip(CASES, got, exp):
        for i, (gi, ei) in enumerate(zip(g, e)):
            try:
                if exact:
                    assert torch.equal(gi, ei) and gi.dtype == ei.dtype, "not identical"
                else:
                    torch.testing.assert_close(gi, ei, **TOL)
            except AssertionError as err:
                bad.append(f"{name}[{i}]: {' '.join(str(err).split())[:200]}")
    return bad


def cpu_only() -> int:
    print("gpuos advanced scheduler demo: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
          "nothing is batched here.")
    d = make_inputs("cpu")
    exp = run_all(clone(d))
    with gpuos.scheduler_context():
        got = run_all(clone(d))
    bad = compare(got, exp, exact=True)
    print(f"  CPU tensors pass through the context unchanged: {'yes' if not bad else 'NO: ' + '; '.join(bad)}")
    return 0 if not bad else 1


def main() -> int:
    faulthandler.dump_traceback_later(300, exit=True)
    if not torch.cuda.is_available():
        return cpu_only()
    gpuos.init()
    d = make_inputs("cuda")
    exp = run_all(clone(d))
    before = gpuos.stats()
    with gpuos.scheduler_context():
        got = run_all(clone(d))
    after = gpuos.stats()
    bad = compare(got, exp)
    for name, _ in CASES:
        print(f"  {name:<26} {'MISMATCH' if any(b.startswith(name + '[') for b in bad) else 'matches eager'}")
    for b in bad:
        print("   ", b)
    print(f"ops batched: {after['ops_intercepted'] - before['ops_intercepted']}, fallbacks: "
          f"{ {k: v - before['fallbacks'].get(k, 0) for k, v in after['fallbacks'].items()} }")

    def sched():
        with gpuos.scheduler_context():
            return run_all(clone(d))
    t_e = timed(lambda: run_all(clone(d)))
    t_s = timed(sched)
    print(f"timings (best of 5): eager {t_e:.3f} ms, scheduler {t_s:.3f} ms ({t_e / t_s:.2f}x)")
    print("gpuos.stats():", {k: gpuos.stats()[k] for k in ("ops_intercepted", "flushes_by_cause", "mean_batch_size")})
    print("result:", "OK" if not bad else "MISMATCH")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())

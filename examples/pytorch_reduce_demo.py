"""Last-dim reductions two ways: the explicit API (gpuos.submit_reduce + gpuos.flush) and the transparent
scheduler (x.sum(-1) / x.mean(-1, keepdim=True) under gpuos.scheduler_context()).

    python examples/pytorch_reduce_demo.py

Covers sum and mean over the last dim, keepdim, and non-contiguous inputs (transposed, stepped slices);
every result is compared with eager PyTorch (exit 1 on a mismatch). Then times 1,000 small row sums three
ways. Without a GPU it says so, checks that CPU tensors pass through the context unchanged, and exits 0.
"""
import faulthandler
import os
import sys

import torch

os.environ.setdefault("GPUOS_TIMEOUT_S", "10")
import gpuos  # noqa: E402
from _timing import timed  # noqa: E402

OPS = {"sum": torch.sum, "mean": torch.mean}
TOL = dict(rtol=1e-5, atol=1e-5)


def layouts(device):
    g = torch.Generator().manual_seed(2)
    base = torch.randn(48, 130, generator=g).to(device)
    wide = torch.randn(48, 260, generator=g).to(device)
    tall = torch.randn(130, 48, generator=g).to(device)
    return {"contiguous": base, "transposed": tall.t(), "step-2 slice": wide[:, ::2],
            "3-d": torch.randn(4, 12, 130, generator=g).to(device), "1-d": torch.randn(777, generator=g).to(device)}


def explicit(xs):
    """gpuos.submit_reduce for every op x keepdim x layout, one flush; returns {(op, keepdim, name): out}."""
    outs = {}
    for op in OPS:
        for keepdim in (False, True):
            for name, x in xs.items():
                shape = tuple(x.shape[:-1]) + ((1,) if keepdim else ())
                out = torch.full(shape, float("nan"), device=x.device)
                gpuos.submit_reduce(op, x, out, keepdim)
                outs[(op, keepdim, name)] = out
    gpuos.flush()  # stream-ordered: later torch work on this stream sees the outputs
    return outs


def scheduled(xs):
    outs = {}
    for op, fn in OPS.items():
        for keepdim in (False, True):
            for name, x in xs.items():
                outs[(op, keepdim, name)] = fn(x, dim=-1, keepdim=keepdim)
    return outs


def compare(label, got, xs):
    bad = 0
    for (op, keepdim, name), out in got.items():
        exp = OPS[op](xs[name], dim=-1, keepdim=keepdim)
        try:
            torch.testing.assert_close(out, exp, **TOL)
        except AssertionError as e:
            bad += 1
            print(f"  {label}: {op} keepdim={keepdim} {name}: MISMATCH {' '.join(str(e).split())[:200]}")
    print(f"  {label:<22} {len(got) - bad}/{len(got)} results match eager")
    return bad == 0


def cpu_only() -> int:
    print("gpuos reduce demo: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
          "gpuos.submit_reduce needs CUDA tensors, so only the scheduler's pass-through is checked.")
    xs = layouts("cpu")
    exp = scheduled(xs)
    with gpuos.scheduler_context():
        got = scheduled(xs)
    same = all(torch.equal(got[k], exp[k]) for k in exp)
    print(f"  CPU tensors pass through the context unchanged: {'yes' if same else 'NO'}")
    return 0 if same else 1


def main() -> int:
    faulthandler.dump_traceback_later(300, exit=True)
    if not torch.cuda.is_available():
        return cpu_only()
    gpuos.init()
    xs = layouts("cuda")
    print("correctness (sum / mean over the last dim, keepdim, non-contiguous):")
    ok = compare("gpuos.submit_reduce", explicit(xs), xs)
    before = gpuos.stats()
    with gpuos.scheduler_context():
        got = scheduled(xs)
    after = gpuos.stats()
    ok &= compare("scheduler_context", got, xs)
    print(f"  scheduler batched {after['ops_intercepted'] - before['ops_intercepted']} of {len(got)} reductions")

    count = 1000
    rows = [torch.randn(32, 256, device="cuda") for _ in range(count)]
    outs = [torch.empty(32, device="cuda") for _ in range(count)]

    def eager():
        return [x.sum(-1) for x in rows]

    def submit():
        for x, o in zip(rows, outs):
            gpuos.submit_reduce("sum", x, o)
        gpuos.flush()

    def sched():
        with gpuos.scheduler_context():
            return [x.sum(-1) for x in rows]

    submit()
    with gpuos.scheduler_context():
        s_res = [x.sum(-1) for x in rows]
    e_res = eager()
    try:
        torch.testing.assert_close(torch.stack(outs), torch.stack(e_res), **TOL)
        torch.testing.assert_close(torch.stack(s_res), torch.stack(e_res), **TOL)
    except AssertionError as e:
        ok = False
        print(f"  timed workload MISMATCH: {' '.join(str(e).split())[:200]}")
    t_e, t_x, t_s = timed(eager), timed(submit), timed(sched)
    print(f"\n{count} row sums of 32x256 fp32 (best of 5, incl. torch.cuda.synchronize()):")
    print(f"  eager {t_e:.3f} ms | gpuos.submit_reduce {t_x:.3f} ms ({t_e / t_x:.2f}x) | "
          f"scheduler {t_s:.3f} ms ({t_e / t_s:.2f}x)")
    st = gpuos.stats()
    print("gpuos.stats():", {k: st[k] for k in ("submitted", "batches", "ops_intercepted", "flushes_by_cause",
                                                "mean_batch_size")})
    print("result:", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

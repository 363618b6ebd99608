"""A small workload touching every part of the runtime, for compute-sanitizer (memcheck, racecheck, synccheck):
the explicit API (seed ops, strided and broadcast operands, submit_many, reductions), the scheduler with fused
chains, reductions and dependency flushes, injected ops with a dual-slot switch and rollback, and a handover.
Each result is checked against eager; exits 1 on a mismatch. Small sizes: under the sanitizer every memory access
is instrumented.

    compute-sanitizer --tool memcheck python3 tools/sanitize_workload.py
(tools/gpu_check.sh sanitize runs all three tools and keeps their logs.)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

import gpuos  # noqa: E402
import gpuos_ext  # noqa: E402
import _inj_ops  # noqa: E402  (the op set the GPU injection tests register: its generation is in the cache)

FAILED = []


def check(name, got, want, **tol):
    try:
        torch.testing.assert_close(got, want, **tol)
    except AssertionError as e:
        FAILED.append(f"{name}: {e}")


def main() -> int:
    dev = "cuda"
    torch.manual_seed(0)
    gpuos_ext.init()
    # Explicit API: seed ops, a transposed operand, a broadcast, fp16, submit_many, reductions.
    a, b = torch.randn(3000, device=dev), torch.randn(3000, device=dev)
    o1, o2 = torch.empty_like(a), torch.empty_like(a)
    gpuos_ext.submit_add(a, b, o1)
    gpuos_ext.submit_mul(o1, b, o2)
    m = torch.randn(64, 48, device=dev)
    mt = torch.empty(48, 64, device=dev)
    gpuos.submit("neg", [m.t()], mt)
    h = torch.randn(5000, device=dev, dtype=torch.float16)
    ho = torch.empty_like(h)
    gpuos.submit("mul", [h, 0.5], ho)
    A = [torch.randn(700, device=dev) for _ in range(8)]
    B = [torch.randn(700, device=dev) for _ in range(8)]
    C = [torch.empty(700, device=dev) for _ in range(8)]
    gpuos_ext.submit_many("sub", A, B, C)
    x = torch.randn(37, 300, device=dev)
    s, sm = torch.empty(37, device=dev), torch.empty_like(x)
    gpuos.submit_reduce("sum", x, s)
    gpuos.submit_reduce("softmax", x, sm)
    gpuos_ext.flush(sync=True)
    check("add", o1, a + b)
    check("mul", o2, (a + b) * b)
    check("neg strided", mt, -m.t())
    check("fp16 scalar", ho, h * 0.5)
    for i in range(8):
        check(f"submit_many[{i}]", C[i], A[i] - B[i])
    check("sum", s, x.sum(-1), rtol=1e-4, atol=1e-4)
    check("softmax", sm, torch.softmax(x, -1))
    # Scheduler: fused chains, broadcast, in-place, a reduction, a dependency flush (.item()).
    xs = [torch.randn(1000, device=dev) for _ in range(6)]
    bias = torch.randn(1000, device=dev)
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        ys = [torch.tanh(t) * 0.5 + bias for t in xs]
        z = torch.sigmoid(ys[0] - ys[1])
        z.mul_(2.0)
        r = torch.softmax(x, -1)
        mean = float(ys[2].mean().item())
    torch.cuda.synchronize()
    for t, y in zip(xs, ys):
        check("sched chain", y, torch.tanh(t) * 0.5 + bias)
    check("sched in-place", z, torch.sigmoid(ys[0] - ys[1]) * 2.0)
    check("sched softmax", r, torch.softmax(x, -1))
    check("sched item", torch.tensor(mean), ys[2].mean().cpu(), rtol=1e-5, atol=1e-5)
    # Injection: registered ops (one generation), slot switch and rollback, then a handover.
    _inj_ops.register_all(gpuos, wait=True)
    p, q = torch.randn(2000, device=dev), torch.rand(2000, device=dev) + 0.5
    io = torch.empty_like(p)
    gpuos.submit("inj_axb1", [p, q], io)
    gpuos.flush(sync=True)
    check("injected", io, p * q + 1.0)
    gpuos.switch("inj_sw", 1)
    gpuos.submit("inj_sw", [p, q], io)
    gpuos.flush(sync=True)
    check("slot 1", io, p - q)
    gpuos.rollback("inj_sw")
    gpuos.submit("inj_sw", [p, q], io)
    gpuos.flush(sync=True)
    check("rolled back", io, p + q)
    gpuos_ext._force_handover()
    gpuos_ext.submit_add(p, q, io)
    gpuos_ext.flush(sync=True)
    check("after handover", io, p + q)
    gpuos_ext.shutdown()
    for f in FAILED:
        print("MISMATCH", f[:400])
    print("SANITIZE_WORKLOAD", "OK" if not FAILED else f"{len(FAILED)} mismatches")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

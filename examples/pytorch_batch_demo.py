"""Explicit-API demo: record many small adds/muls, flush once, check against torch.

Run:  python examples/pytorch_batch_demo.py
On a machine without a GPU it checks what can be checked (NVRTC compiles the worker) and exits 0.
"""
import sys
import time

import torch

import gpuos
import gpuos_ext


def main() -> int:
    if not torch.cuda.is_available():
        print("gpuos demo: no CUDA GPU on this machine; GPU work cannot run here.")
        try:
            major, minor = gpuos.nvrtc_version()
            image = gpuos.jit_compile("sm_90")
            print(f"  NVRTC {major}.{minor} compiled the worker module for sm_90 ({len(image)} bytes): OK")
        except gpuos.GpuosError as e:
            print(f"  NVRTC check skipped: {e}")
        try:
            gpuos_ext.init()
        except gpuos.CudaError as e:
            print(f"  gpuos_ext.init() says, as expected without a GPU: {e}")
        return 0

    gpuos_ext.init(capacity=4096, threads_per_block=256)
    print("runtime:", gpuos.runtime_info())
    n, count = 1024, 1000
    a = [torch.randn(n, device="cuda") for _ in range(count)]
    b = [torch.randn(n, device="cuda") for _ in range(count)]
    out = [torch.empty(n, device="cuda") for _ in range(count)]
    prod = [torch.empty(n, device="cuda") for _ in range(count)]

    t0 = time.perf_counter()
    for i in range(count):
        gpuos_ext.submit_add(a[i], b[i], out[i])
    gpuos_ext.submit_many("mul", out, b, prod)  # reads the adds' outputs: a second dependency level
    gpuos_ext.flush(sync=True)
    dt = time.perf_counter() - t0

    ok = all(torch.allclose(prod[i], (a[i] + b[i]) * b[i]) for i in range(count))
    half = torch.randn(3, 5, device="cuda", dtype=torch.float16)
    half_out = torch.empty(5, 3, device="cuda", dtype=torch.float16)
    gpuos_ext.submit_div(half.t(), half.t() + 2, half_out)  # strided input
    gpuos_ext.flush()
    ok &= torch.allclose(half_out, half.t() / (half.t() + 2), rtol=1e-3, atol=1e-3)  # stream-ordered, no sync
    print(f"{2 * count} sub-ops of {n} floats: {dt * 1e3:.2f} ms end to end; correct={ok}")
    print("stats:", gpuos.stats())
    gpuos_ext.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

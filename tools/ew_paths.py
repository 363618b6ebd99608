"""The built-in elementwise ops' paths, GPU-bound: one `gpuos_ext.submit` of 4,096^2 elements per path, timed with
CUDA events around submit + flush(sync=True), median of 12; each result checked against torch.

    python tools/ew_paths.py      # on a GPU machine (device_src/elementwise.h ew_op)

Paths: the 16-byte vector loop (fp16 add: every operand contiguous, aligned, of the output's dtype), the contiguous
element loop (mixed fp16 + fp32 add), the strided element loop (a transposed operand: add, sin, fp16 mul). Every
op has its own loops again since the fortieth session (shared per arity before: 14-27 % slower); an A/B of them runs
this once per variant (tools/gpu_variants.sh).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpuos  # noqa: E402
import gpuos_ext  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("ew_paths: no CUDA GPU; nothing to measure")
        return 0
    gpuos.init()
    n = 4096
    a32, b32 = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    a16, b16 = a32.half(), b32.half()
    cases = {
        "vec_add_f16": ("add", [a16, b16], torch.empty_like(a16)),
        "mixed_add_f16_f32": ("add", [a16, b32], torch.empty_like(a32)),
        "strided_add_f32": ("add", [a32.t(), b32], torch.empty_like(a32)),
        "strided_sin_f32": ("sin", [a32.t()], torch.empty_like(a32)),
        "strided_mul_f16": ("mul", [a16.t(), b16], torch.empty_like(a16)),
    }
    for name, (op, ins, out) in cases.items():
        ref = getattr(torch, op)(*[x.float() for x in ins]).to(out.dtype)
        ts = []
        for _ in range(12):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            gpuos_ext.submit(op, ins, out)
            gpuos_ext.flush(sync=True)
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        ok = torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2)
        ts.sort()
        print(f"EW {name}: median {ts[len(ts) // 2]:.1f} us (min {ts[0]:.1f}) for {out.numel()} elements, "
              f"correct={ok}", flush=True)
    gpuos.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

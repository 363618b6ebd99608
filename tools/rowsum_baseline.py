"""Bandwidth a plain persistent row-sum kernel reaches with the worker's grid (issue #3 diagnosis).

    python tools/rowsum_baseline.py        # GPU machine with Triton (torch's CUDA wheels ship it)

A Triton kernel with P programs x W warps walks the 128,000 rows of one (128000, 1024) fp32 tensor (512 MB,
what W3's 128x1024 shape reads), one row per program per iteration, and writes the row sums. Prints GB/s for
the worker's default grid (33 programs x 8 warps), 4x the warps, 4x the programs and the full GPU, next to
gpuos's submit_reduce over the same tensor (1,000 row blocks of 128 rows, one submit each). If the plain kernel
is much faster on the same grid, the worker's claim/row path, not the grid, bounds W3.
"""
import time

import torch
import triton
import triton.language as tl


@triton.jit
def rowsum(x_ptr, out_ptr, rows, COLS: tl.constexpr, P: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, COLS)
    for r in range(pid, rows, P):
        v = tl.load(x_ptr + r * COLS + cols)
        tl.store(out_ptr + r, tl.sum(v, axis=0))


def gbps(fn, nbytes, reps=10):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return nbytes / ts[len(ts) // 2] / 1e9, ts[len(ts) // 2] * 1e3


def main():
    rows, cols = 128000, 1024
    x = torch.randn(rows, cols, device="cuda")
    out = torch.empty(rows, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for p, w in ((sms // 4, 8), (sms // 4, 32), (sms, 8), (4 * sms, 8)):
        g, ms = gbps(lambda: rowsum[(p,)](x, out, rows, COLS=cols, P=p, num_warps=w), x.numel() * 4)
        torch.testing.assert_close(out, x.sum(-1), rtol=1e-4, atol=1e-3)
        print(f"rowsum_baseline triton {p} programs x {w} warps: {ms:.3f} ms, {g:.0f} GB/s", flush=True)
    import gpuos
    gpuos.init(capacity=65536)
    blocks = list(x.view(1000, 128, cols).unbind(0))
    outs = list(out.view(1000, 128).unbind(0))

    def run():
        for xb, ob in zip(blocks, outs):
            gpuos.submit_reduce("sum", xb, ob)
        gpuos.flush(sync=True)
    g, ms = gbps(run, x.numel() * 4)
    torch.testing.assert_close(out, x.sum(-1), rtol=1e-4, atol=1e-3)
    print(f"rowsum_baseline gpuos submit_reduce x1000 + flush: {ms:.3f} ms, {g:.0f} GB/s "
          f"({gpuos.runtime_info()})", flush=True)
    big = [x]
    bigo = [out]

    def run1():
        gpuos.submit_reduce("sum", big[0], bigo[0])
        gpuos.flush(sync=True)
    g, ms = gbps(run1, x.numel() * 4)
    print(f"rowsum_baseline gpuos one submit_reduce of 128000 rows + flush: {ms:.3f} ms, {g:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()

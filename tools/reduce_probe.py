"""What bounds batched last-dim reductions (W3)? Run on a GPU machine: python tools/reduce_probe.py

For each worker shape (GPUOS_WORKER_BLOCKS x threads_per_block, one child process each) and W3 shape, prints
the host time of 1,000 submit_reduce calls and the time of the flush(sync=True) that follows (the GPU work:
the worker starts at the flush), medians of 10 reps. GPU time that scales with the number of worker warps
means per-warp latency bounds it; time that does not, something serial (descriptor / TensorRef fetch).
"""
import os
import subprocess
import sys

CHILD = r"""
import statistics, time, torch, gpuos
gpuos.init(capacity=65536, threads_per_block=int({tpb}))
for rows, cols in ((8, 256), (64, 512), (128, 1024)):
    X = [torch.randn(rows, cols, device="cuda") for _ in range(1000)]
    O = [torch.empty(rows, device="cuda") for _ in range(1000)]
    sub, fl = [], []
    for rep in range(11):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, o in zip(X, O):
            gpuos.submit_reduce("sum", x, o)
        t1 = time.perf_counter()
        gpuos.flush(sync=True)
        t2 = time.perf_counter()
        if rep:
            sub.append((t1 - t0) * 1e3); fl.append((t2 - t1) * 1e3)
    torch.testing.assert_close(O[7], X[7].sum(-1), rtol=1e-5, atol=1e-4)
    eff = rows * cols * 4 * 1000 / (statistics.median(fl) * 1e-3) / 1e9
    print(f"reduce_probe blocks={{blocks}} tpb={tpb} {{rows}}x{{cols}}: submit {{statistics.median(sub):.3f}} ms, "
          f"flush+gpu {{statistics.median(fl):.3f}} ms ({{eff:.0f}} GB/s)", flush=True)
"""

for blocks, tpb in ((0, 256), (33, 128), (132, 256)):  # threads_per_block <= 256 (device_src/config.h)
    env = dict(os.environ)
    if blocks:
        env["GPUOS_WORKER_BLOCKS"] = str(blocks)
    code = CHILD.format(tpb=tpb).replace("{blocks}", str(blocks or "default"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    print(r.stdout.strip() or r.stderr[-2000:], flush=True)

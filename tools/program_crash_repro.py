#!/usr/bin/env python
"""Reproduce the open program crash (issue #17), GPU machine, < 1 min per variant.

At e662c7f on an H200 the full suite (`python -m benchmarks`, W1-W4 first) lost the CUDA context
(CUDA_ERROR_ILLEGAL_ADDRESS) in W5's gpuos_program setup (MLP block 1x256, 1,000 steps per repetition); the quick
run at a5fbcfd (W2, W4 first, 200 steps) and tests/test_gpu_programs.py passed. This runs W4's program, then
W5's, in one process and prints each repetition's error against eager, so the variants below can bisect it:

    python tools/program_crash_repro.py w4w5           # the suite's order
    python tools/program_crash_repro.py w5             # W5 alone
    GPUOS_DMA_LEVELS=0 python tools/program_crash_repro.py w4w5        # without the one-copy DMA of levels
    GPUOS_SPECIALIZE_AFTER=0 python tools/program_crash_repro.py w4w5  # without tier-2 code (replays count)
    compute-sanitizer --tool memcheck python tools/program_crash_repro.py w5
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import harness as H  # noqa: E402  (first: CUDA_MODULE_LOADING before CUDA starts)
from benchmarks import bench_decode as D, bench_mlp as M  # noqa: E402
import gpuos  # noqa: E402
import torch  # noqa: E402


def main(which: str) -> None:
    ctx = H.RunContext(budget=H.Budget(300), gpuos=gpuos)
    if "w4" in which:
        case = D.make_case(1024, 256, "cuda")
        prep = D.make_setups(ctx)["gpuos_program"](case)
        for _ in range(3):
            prep.fn()
        torch.cuda.synchronize()
        print("w4 ok", prep.extra, flush=True)
    if "w5" in which:
        case = M.make_case("1x256", 1000, "cuda")
        prep = M.make_setups(ctx)["gpuos_program"](case)
        print("w5 captured", prep.extra, flush=True)
        for i in range(5):
            y = prep.fn()
            torch.cuda.synchronize()
            err = (y.float() - case.ref.float()).abs().max().item()
            print(f"w5 rep {i}: max |err| {err:.3g}, handovers {gpuos.stats()['handovers']}", flush=True)
    print("OK", which, flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "w4w5")

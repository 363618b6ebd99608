"""Shared by the examples: best-of-N wall-clock timing of GPU work."""
import time

import torch


def timed(fn, reps: int = 5) -> float:
    """Best of `reps` runs of fn() in ms, host wall clock including torch.cuda.synchronize()."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3

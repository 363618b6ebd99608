"""Repro for the scheduler stall seen on the H200 at e170448 (1000 dependent intercepted ops, timer on/off).
Prints progress; faulthandler dumps every thread after 25 s if it hangs."""
import faulthandler, sys, time, os
faulthandler.dump_traceback_later(25, exit=True)
import torch, gpuos, gpuos_ext
sys.path.insert(0, "examples")
gpuos.init()
a, b, c = (torch.randn(4096, device="cuda") for _ in range(3))
def step(out, i):
    x = out + b; y = x * c; return torch.sigmoid(torch.relu(y)) - 0.25
for timer in (0.0, 2.0):
    out = a
    t0 = time.perf_counter()
    with gpuos.scheduler_context(auto_flush_ms=timer):
        for i in range(200):
            out = step(out, i)
            if i % 50 == 0:
                print("timer", timer, "iter", i, round(time.perf_counter() - t0, 3), gpuos_ext.stats()["batches"], flush=True)
    print("exit ok", time.perf_counter() - t0, flush=True)
    torch.cuda.synchronize(); print("sync ok", flush=True)

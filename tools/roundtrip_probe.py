"""Round-trip breakdown (submit / flush / wait) and host-memory write costs; run on a GPU machine."""
import time, torch, gpuos, gpuos_ext, os
gpuos_ext.init()
print("probe", gpuos_ext._testing.probe_host_memory(1 << 20), flush=True)
a = torch.randn(256, device='cuda'); b = torch.randn(256, device='cuda'); c = torch.empty(256, device='cuda')
def med(f, n=2000):
    for _ in range(200): f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    ts.sort(); return ts[len(ts)//2] * 1e6
def rt():
    gpuos_ext.submit_add(a, b, c); gpuos_ext.flush(sync=True)
print("roundtrip us", med(rt), flush=True)
def sub(): gpuos_ext.submit_add(a, b, c)
def fl(): gpuos_ext.flush(sync=False)
ts_s, ts_f, ts_w = [], [], []
for i in range(2000):
    t0 = time.perf_counter(); gpuos_ext.submit_add(a, b, c); t1 = time.perf_counter(); gpuos_ext.flush(); t2 = time.perf_counter(); gpuos_ext.flush(sync=True); t3 = time.perf_counter()
    ts_s.append(t1-t0); ts_f.append(t2-t1); ts_w.append(t3-t2)
for nm, ts in (("submit", ts_s), ("flush", ts_f), ("wait", ts_w)):
    ts.sort(); print(nm, "us", ts[len(ts)//2]*1e6, flush=True)
def ev():
    d = a + b; torch.cuda.synchronize()
print("eager a+b + sync us", med(ev), flush=True)
x = [torch.randn(256, device='cuda') for _ in range(10000)]
def noop_loop():
    t0 = time.perf_counter()
    for i in range(10000): gpuos_ext.is_initialized()
    return (time.perf_counter() - t0) / 10000 * 1e6
print("pybind noop call us", noop_loop(), flush=True)
t0 = time.perf_counter()
for i in range(10000): gpuos_ext.submit_add(x[i], x[i], x[i])
t1 = time.perf_counter(); gpuos_ext.flush(sync=True); print("submit loop us/op", (t1 - t0) / 10000 * 1e6, flush=True)

"""Timing: warm-up + timed reps (host wall clock around work + sync, CUDA events), CUDA-graph capture, GPU time
with the host taken out (a gate kernel), and the syncs and memory release around them.

Imports nothing from the harness.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence


def summarize(samples: Sequence[float]) -> dict:
    if not samples:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples)}


@dataclass
class Timing:
    """Per-rep samples in milliseconds.

    ``samples_ms``: perf_counter from before the work until after the trailing sync (end to end).
    ``host_ms``: perf_counter from before the work until the work callable returned (before the sync).
    ``gpu_ms``: CUDA events recorded on the current stream just before and just after the work: the
    stream's span for the rep (empty when events were not used, e.g. on the CPU).
    """
    samples_ms: list = field(default_factory=list)
    host_ms: list = field(default_factory=list)
    gpu_ms: list = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return summarize(self.samples_ms)["median"]

    @property
    def min_ms(self) -> float:
        return summarize(self.samples_ms)["min"]

    @property
    def max_ms(self) -> float:
        return summarize(self.samples_ms)["max"]

    @property
    def host_median_ms(self) -> float:
        return summarize(self.host_ms)["median"]

    @property
    def gpu_median_ms(self) -> Optional[float]:
        return summarize(self.gpu_ms)["median"] if self.gpu_ms else None

    @property
    def reps(self) -> int:
        return len(self.samples_ms)


def events_ms(fn: Callable[[], Any], reps: int, warmup: int = 2) -> float:
    """Median milliseconds between two CUDA events around fn() (host enqueue and GPU work both inside), after
    `warmup` untimed calls: the per-call time of GPU work whose launches are cheap or batched."""
    import torch
    times = []
    for i in range(reps + warmup):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def cuda_sync() -> None:
    import torch
    torch.cuda.synchronize()


def no_sync() -> None:
    """The sync of CPU runs (nothing to wait for)."""


def try_sync() -> None:
    """torch.cuda.synchronize(), ignoring any error (after a failed configuration)."""
    try:
        cuda_sync()
    except Exception:
        pass


def _events_usable() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


def time_reps(fn: Callable[[], Any], reps: int = 20, warmup: int = 3,
              sync: Optional[Callable[[], None]] = None, disable_gc: bool = True,
              gpu_events: Optional[bool] = None) -> Timing:
    """Warm up, then time ``reps`` calls of ``fn`` end to end on the host (and on the GPU stream).

    Each rep: sync(); [start event]; t0 = perf_counter(); r = fn(); t1; [end event]; sync(); t2.
    ``samples_ms`` = t2 - t0, ``host_ms`` = t1 - t0, ``gpu_ms`` = end - start event (CUDA events on the
    current stream; ``gpu_events`` None = when CUDA is initialised). Whatever ``fn`` returns is kept alive
    until after the sync (so freeing eager outputs is not timed) and dropped before the next rep. Python's
    GC is disabled during the timed reps (collected before) so a collection does not land inside one rep.
    """
    sync = sync or cuda_sync
    if gpu_events is None:
        gpu_events = sync is cuda_sync and _events_usable()
    for _ in range(max(0, warmup)):
        r = fn()
        sync()
        del r
    events = []
    if gpu_events:
        import torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
    gc.collect()
    was_enabled = gc.isenabled()
    if disable_gc:
        gc.disable()
    t = Timing()
    try:
        for i in range(reps):
            sync()
            if events:
                events[i][0].record()
            t0 = time.perf_counter()
            r = fn()
            t1 = time.perf_counter()
            if events:
                events[i][1].record()
            sync()
            t2 = time.perf_counter()
            del r
            t.samples_ms.append((t2 - t0) * 1e3)
            t.host_ms.append((t1 - t0) * 1e3)
    finally:
        if disable_gc and was_enabled:
            gc.enable()
    t.gpu_ms = [start.elapsed_time(end) for start, end in events]
    return t


def capture_cuda_graph(warmup, capture):
    """Run warmup() on a side stream (as the CUDA graphs docs recommend), then capture one capture() call into
    a torch.cuda.CUDAGraph. Returns (graph, capture()'s result, capture time in ms)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warmup()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    try:  # thread_local: a runtime helper thread touching CUDA must not invalidate our capture
        ctx = torch.cuda.graph(g, capture_error_mode="thread_local")
    except TypeError:
        ctx = torch.cuda.graph(g)
    with ctx:
        result = capture()
    torch.cuda.synchronize()
    return g, result, (time.perf_counter() - t0) * 1e3


def release_memory(device: str = "cuda") -> None:
    """Collect garbage and return cached GPU memory between sizes."""
    gc.collect()
    if device == "cuda":
        try:
            import torch
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------------
# GPU time with the host's enqueue time taken out: the stream waits behind a busy "gate" kernel
# --------------------------------------------------------------------------------------------------
GATE_CYCLES = 60_000_000  # ~30 ms of GPU clock to start with; doubled while the host part outlasts it
_CYCLES_PER_MS: list = []


def gpu_ms_of(fn, gate=None) -> tuple:
    """(GPU ms, host s) of the stream work `fn` enqueues, with the host's enqueue time taken out of the GPU
    time: the stream is held by a busy kernel (the gate, `gate` cycles) while the host runs `fn`, so the events
    time only the device's work. If the host was not done before the gate ended (its time would leak into the
    result), the measurement is discarded and repeated with a gate twice as long; with an explicit `gate` (for
    work that cannot be repeated), it raises instead."""
    global GATE_CYCLES
    import torch
    for _ in range(6):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(gate or GATE_CYCLES)
        s.record()
        t0 = time.perf_counter()
        fn()
        host_s = time.perf_counter() - t0
        e.record()
        leaked = s.query()
        torch.cuda.synchronize()
        if not leaked:
            return s.elapsed_time(e), host_s
        if gate:
            raise RuntimeError(f"gpu_ms_of: the host part ({host_s * 1e3:.1f} ms) outlasted a GPU gate of "
                               f"{gate} cycles")
        GATE_CYCLES *= 2
    raise RuntimeError(f"gpu_ms_of: the host part ({host_s * 1e3:.1f} ms) outlasted a GPU gate of "
                       f"{GATE_CYCLES // 2} cycles")


def gate_for(host_ms: float) -> int:
    """Gate cycles for host work of about `host_ms` (three times that, at least GATE_CYCLES)."""
    import torch
    if not _CYCLES_PER_MS:
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(GATE_CYCLES)
        e.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS.append(GATE_CYCLES / s.elapsed_time(e))
    return max(GATE_CYCLES, int(3 * host_ms * _CYCLES_PER_MS[0]))

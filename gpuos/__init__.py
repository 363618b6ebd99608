"""GPUOS: run many small PyTorch GPU ops as batches on an elastic persistent worker.

Explicit API (seed-compatible names)::

    import gpuos
    gpuos.init()                      # or gpuos_ext.init(capacity=4096, threads_per_block=256)
    gpuos.submit_add(a, b, out)       # also submit_sub / submit_mul / submit_div
    gpuos.submit_many("mul", A, B, C)
    gpuos.submit("gelu", [x], out)    # any table op; broadcasting, mixed dtypes, scalars
    gpuos.submit_reduce("softmax", x, out)
    gpuos.flush()                     # stream-ordered on torch's current stream; sync=True waits

See README.md for the design, measured results and limitations.
"""
from __future__ import annotations

import gpuos_ext as _ext  # first: it sets CUDA_MODULE_LOADING=EAGER (unless chosen), imports torch, checks the build

from gpuos_ext import (  # noqa: E402
    CompileError,
    CudaError,
    GpuosError,
    clear_index_faults,
    device_sources,
    is_initialized,
    jit_cache_dir,
    jit_arch_for,
    jit_base_cached,
    jit_compile,
    jit_warm,
    link_info,
    set_whole_build,
    wait_whole_builds,
    whole_build_info,
    nvrtc_version,
    op_table,
    pending,
    runtime_info,
    set_fusion,
    set_row_fusion,
    set_worker_matmul,
    worker_matmul_enabled,
    set_worker_attention,
    worker_attention_enabled,
    submit_attention,
    set_specialize_after,
    shutdown,
    submit,
    submit_add,
    submit_div,
    submit_many,
    submit_mul,
    submit_reduce,
    submit_matmul,
    submit_sub,
    worker_trace,
    yield_worker,
)

from . import _log  # noqa: E402
from ._log import logger  # noqa: E402,F401  (GPUOS_LOG=INFO: start-up, NVRTC compiles, eager fallbacks)


def init(capacity: int = 0, threads_per_block: int = 0, worker_blocks: int = 0, idle_us: float = 200.0) -> None:
    """gpuos_ext.init (start the runtime on the current device; idempotent), logging what a start costs (the
    first run of a build on a machine compiles the worker with NVRTC)."""
    _log.start_runtime(_ext, capacity=capacity, threads_per_block=threads_per_block, worker_blocks=worker_blocks,
                       idle_us=idle_us)


def flush(sync: bool = False, stream=None, device=None) -> None:
    """Publish pending work (explicit submits and the scheduler's deferred ops), stream-ordered, no host sync.

    Parameters
    ----------
    sync
        Also wait (bounded by ``GPUOS_TIMEOUT_S``) until the flushed devices' work is done.
    stream
        A ``torch.cuda.Stream`` (or ``ExternalStream``, or a raw ``cudaStream_t`` int of ``device`` / the current
        device): only its device is flushed, and later work on this stream sees the results. None: the calling
        thread's current stream of each flushed device.
    device
        Flush only this CUDA device (int, ``"cuda:1"``, ``torch.device``). With neither ``stream`` nor ``device``,
        every device with pending work is flushed, each on the calling thread's current stream of that device.
        With one thread per device, pass the thread's device (or stream): another thread's work stays for its own
        flush.

    The scheduler's deferred ops go out on the stream they were recorded under; the target stream then waits for
    that stream (an event on the same device). A ``gpuos.flush[explicit]`` range while a torch profiler records.
    """
    import torch

    dev = None
    if device is not None:
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if d.type != "cuda":
            raise ValueError(f"gpuos.flush(device={device!r}): not a CUDA device. Fix: pass a CUDA device index "
                             "or 'cuda:N', or None for every device.")
        dev = d.index if d.index is not None else torch.cuda.current_device()
    target, raw = None, stream
    if isinstance(stream, torch.cuda.Stream):
        if dev is not None and stream.device_index != dev:
            raise ValueError(f"gpuos.flush(stream=<stream of cuda:{stream.device_index}>, device={device!r}): the "
                             "stream belongs to another device. Fix: pass a stream of that device, or only one.")
        dev, target, raw = stream.device_index, stream, stream.cuda_stream
    elif stream is not None and not isinstance(stream, int):
        raise TypeError(f"gpuos.flush(stream=...): expected a torch.cuda.Stream or a raw cudaStream_t int, got "
                        f"{type(stream).__name__}")
    elif stream is not None and dev is None:
        dev = torch.cuda.current_device()
    others = _log.traced("explicit", _ext.flush, sync, raw, dev)
    if others:  # deferred ops went out on the stream they were recorded under: the target waits for it
        from ._streams import torch_stream, wait_for
        wait_for(others, target if target is not None or raw is None else torch_stream(dev, raw))
    _log.note_runtime_events(_ext)


from ._version import __version__  # noqa: E402  (the one definition; the extension was built with it)

from .scheduler import GpuosScheduler, intercepted_ops, scheduler_context, scheduler_stats  # noqa: E402
from .programs import CaptureError, GuardError, Program, capture, wrap  # noqa: E402
from . import injection as _injection  # noqa: E402
from .injection import (  # noqa: E402
    batch_install,
    generation_info,
    install,
    register_elementwise,
    register_op,
    rollback,
    switch,
    user_ops,
    wait_generations,
)


def stats() -> dict:
    """Runtime counters (gpuos_ext.stats: submitted, batches, flushes, worker_launches, jit_compiles, ...)
    plus the scheduler's: ops_intercepted, fallbacks (by reason), fallback_ops (by aten overload: what stayed
    eager), flushes_by_cause with the batches and worker launches of those flushes (batches_by_cause,
    launches_by_cause), mean_batch_size."""
    d = dict(_ext.stats())
    d.update(scheduler_stats())
    return d


def supported_ops() -> list[str]:
    """Names of the operators in the op table (device_src/ops.def)."""
    return [row["name"] for row in op_table()]


__all__ = _injection.__all__ + [
    "GpuosScheduler",
    "CaptureError",
    "GuardError",
    "Program",
    "capture",
    "wrap",
    "intercepted_ops",
    "scheduler_context",
    "scheduler_stats",
    "CompileError",
    "CudaError",
    "GpuosError",
    "clear_index_faults",
    "device_sources",
    "flush",
    "init",
    "is_initialized",
    "jit_cache_dir",
    "jit_arch_for",
    "jit_base_cached",
    "jit_compile",
    "jit_warm",
    "link_info",
    "set_whole_build",
    "wait_whole_builds",
    "whole_build_info",
    "nvrtc_version",
    "op_table",
    "pending",
    "runtime_info",
    "set_fusion",
    "set_row_fusion",
    "set_worker_matmul",
    "worker_matmul_enabled",
    "set_worker_attention",
    "worker_attention_enabled",
    "submit_attention",
    "set_specialize_after",
    "shutdown",
    "stats",
    "submit",
    "submit_add",
    "submit_div",
    "submit_many",
    "submit_mul",
    "submit_reduce",
    "submit_matmul",
    "submit_sub",
    "supported_ops",
    "worker_trace",
    "yield_worker",
]

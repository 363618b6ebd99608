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
    device_sources,
    is_initialized,
    jit_cache_dir,
    jit_compile,
    nvrtc_version,
    op_table,
    pending,
    runtime_info,
    set_fusion,
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


def flush(sync: bool = False, stream=None) -> None:
    """gpuos_ext.flush: publish pending work on the current stream (stream-ordered); sync=True also waits. A
    ``gpuos.flush[explicit]`` range while a torch profiler records."""
    _log.traced("explicit", _ext.flush, sync, stream)
    _log.note_runtime_events(_ext)

from ._version import __version__  # noqa: E402  (the one definition; the extension was built with it)

from .scheduler import GpuosScheduler, intercepted_ops, scheduler_context, scheduler_stats  # noqa: E402
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
    "intercepted_ops",
    "scheduler_context",
    "scheduler_stats",
    "CompileError",
    "CudaError",
    "GpuosError",
    "device_sources",
    "flush",
    "init",
    "is_initialized",
    "jit_cache_dir",
    "jit_compile",
    "nvrtc_version",
    "op_table",
    "pending",
    "runtime_info",
    "set_fusion",
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

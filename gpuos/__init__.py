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

import logging
import os

# Kernels loaded eagerly, unless the user chose (set before CUDA initialises; torch itself would pick LAZY). With
# lazy loading the first launch of any kernel waits until no kernel is resident on the GPU, and a resident worker
# waiting for a batch queued behind that launch never leaves: measured on an H100, the soak wedged within 50 random
# chains in every lazy run and never with eager loading. A context that is lazy anyway (CUDA initialised before
# this import, or the user's choice) is handled by the runtime at some cost (runtime_info() says which).
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

import torch  # noqa: E402, F401  (loads libc10/libtorch before the extension)

import gpuos_ext as _ext

from gpuos_ext import (  # noqa: E402
    CompileError,
    CudaError,
    GpuosError,
    device_sources,
    flush,
    init,
    is_initialized,
    jit_cache_dir,
    jit_compile,
    nvrtc_version,
    op_table,
    runtime_info,
    shutdown,
    submit,
    submit_add,
    submit_div,
    submit_many,
    submit_mul,
    submit_reduce,
    submit_sub,
    worker_trace,
)

logger = logging.getLogger("gpuos")
if os.environ.get("GPUOS_LOG"):
    logging.basicConfig()
    logger.setLevel(os.environ["GPUOS_LOG"].upper())

__version__ = _ext.__version__

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
    "runtime_info",
    "shutdown",
    "stats",
    "submit",
    "submit_add",
    "submit_div",
    "submit_many",
    "submit_mul",
    "submit_reduce",
    "submit_sub",
    "supported_ops",
    "worker_trace",
]

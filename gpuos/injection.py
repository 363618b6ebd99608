"""Operator injection (issue #5): new elementwise ops at run time, dual-slot hot swap, generations.

Usage::

    import gpuos
    gpuos.init()
    op = gpuos.register_elementwise("axpb", "a * s0 + b")        # CUDA C++ expression over fp32 a, b, c, s0, s1
    gpuos.submit(op, [x, y], out, s0=2.0)                          # or gpuos.submit("axpb", ...)
    gpuos.register_op("sq_diff", "__device__ float sq_diff(float a, float b) { float d = a - b; return d * d; }")
    gpuos.install("axpb", "a * s0 - b", slot=1)                    # a second implementation ...
    gpuos.switch("axpb", 1)                                        # ... selected by one alias-table write
    gpuos.rollback("axpb")                                         # back to slot 0
    with gpuos.batch_install():                                    # several ops, one generation compile
        gpuos.register_elementwise("f1", "a + 1.0f", arity=1)
        gpuos.register_elementwise("f2", "a * a", arity=1)

Every registration or install compiles a new *generation* (the worker and every op in one NVRTC module,
DESIGN F2) on a background thread -- about 25 s for a cold cache on a GPU host, milliseconds from the disk
cache. The running generation keeps serving meanwhile; the new one takes over when the worker next exits idle,
or by an explicit drain when a sub-op needs it. A source NVRTC rejects raises ``gpuos.CompileError`` with the
log and changes nothing.
"""
from __future__ import annotations

import contextlib

import gpuos_ext as _ext

from gpuos_ext import (  # noqa: F401  (re-exported by gpuos)
    generation_info,
    install,
    register_elementwise,
    register_op,
    rollback,
    switch,
    user_ops,
    wait_generations,
)


@contextlib.contextmanager
def batch_install(wait: bool = True):
    """Group the registrations and installs made inside into one generation (one worker compile).

    Inside the block, register/install calls return once their source passed the quick NVRTC check (as with
    ``block=False``); the generation compile starts when the block exits. ``wait=True`` then waits for it and
    raises the ``CompileError`` of a failed one (the ops of the block then raise it on submit; the running
    generation stays).
    """
    _ext._hold_generations(True)
    released = False
    try:
        yield
        _ext._hold_generations(False)
        released = True
        if wait:
            _ext.wait_generations()
    finally:
        if not released:
            _ext._hold_generations(False)


__all__ = [
    "batch_install",
    "generation_info",
    "install",
    "register_elementwise",
    "register_op",
    "rollback",
    "switch",
    "user_ops",
    "wait_generations",
]

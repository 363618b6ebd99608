"""How the scheduler treats torch.distributed ops that reach its dispatch mode (issue #20).

``dist.all_reduce(t)`` arrives as ``c10d.allreduce_`` (in place, ``(tensors, work)``), ``dist.all_gather_into_tensor``
as ``c10d._allgather_base_``, the functional collectives (``torch.distributed._functional_collectives``) as
``_c10d_functional.all_reduce`` / ``all_gather_into_tensor`` / ``wait_tensor`` ... (torch 2.11-2.13, checked with
a dispatch mode over gloo). None of them is recorded: they run eagerly like every fallback, so

* the deferred work whose storage they read or write is published first on its stream (``sched_flush_for``), and
  the caller's current stream waits for it; ProcessGroupNCCL orders its own stream after the current stream, so
  the collective runs after that work on the GPU (no host sync);
* a collective that launches a kernel (everything but ``wait_tensor`` and ``_wrap_tensor_autograd``) first asks
  the worker of its tensors' devices to yield its SMs, as before a cuBLAS GEMM (DESIGN F7): NCCL kernels of one
  rank wait for their peers and must not queue behind a resident worker;
* its outputs feed later deferred ops like any eager result: those ops are published later, on a stream that
  already waits for the collective (a synchronous collective, or ``work.wait()`` / ``wait_tensor``). The
  functional collectives return an ``AsyncCollectiveTensor`` (a subclass with its own ``__torch_dispatch__``):
  the scheduler never records an op on such a tensor (reason ``subclass``), so the subclass waits before its data
  is read.
"""
from __future__ import annotations

COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})
# Ops of those namespaces that launch no kernel: stream waits and wrappers.
NO_KERNEL = frozenset({"wait_tensor", "_wrap_tensor_autograd"})

_KIND: dict = {}


def kind(func) -> str | None:
    """'collective' (a communication kernel), 'wait' (a stream wait / wrapper of a collective's result) or None."""
    k = _KIND.get(func, 0)
    if k == 0:
        ns = getattr(func, "namespace", None)
        name = getattr(getattr(func, "_schema", None), "name", "").split("::")[-1]
        if ns not in COLLECTIVE_NAMESPACES:
            k = None
        else:
            k = "wait" if name in NO_KERNEL else "collective"
        _KIND[func] = k
    return k


def wait_works(values) -> int:
    """Wait on every c10d Work among a collective's outputs, as ``dist.all_reduce`` does with the one it gets (for
    NCCL the current stream waits for the collective's stream; no host sync). The dispatcher hands the Work out
    boxed in a ``torch.ScriptObject``: it is unboxed first (a script-method ``wait()`` on the boxed object
    crashed the process with NCCL on torch 2.11). Returns how many Works were waited on."""
    import torch
    from torch._C._distributed_c10d import Work

    n = 0
    for v in values:
        if isinstance(v, torch.ScriptObject):
            try:
                v = Work.unbox(v)
            except RuntimeError:  # another boxed class (a process group): nothing to wait on
                continue
        if isinstance(v, Work):
            v.wait()
            n += 1
    return n

"""The scheduler's hand-written handlers of decode-step ops that the op table's aten column cannot describe
(gpuos/scheduler.py builds its table with them): casts and joins (`copy`), layer norm as table ops, and skinny
matmuls as worker tasks."""
from __future__ import annotations

import functools

import torch

import gpuos_ext as _ext

from ._handler_base import MODES as _MODES, NOT_CUDA as _NOT_CUDA, UNSUPPORTED as _UNSUPPORTED
from ._handler_base import Schema as _Schema, is_reason as _is_reason, number as _number

aten = torch.ops.aten
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def cast_handlers() -> dict:
    """aten::_to_copy (x.to(dtype), .float(), .half()) and copy_ as the table's `copy` op: a cast when the
    dtypes differ. Device moves, layouts, pinned memory and non-blocking copies stay eager. cat / stack: one copy
    per input into its slice of a fresh output."""
    sched_cast = _ext.sched_cast
    keep = {"layout": (None, torch.strided), "pin_memory": (None, False), "non_blocking": (False,),
            "memory_format": (None, torch.preserve_format)}

    def to_copy(thr, args, kwargs):
        x = args[0] if len(args) == 1 else None
        if not isinstance(x, torch.Tensor):
            return _UNSUPPORTED
        for k, v in kwargs.items():
            if k == "device":
                if v is not None and torch.device(v) != x.device:
                    return _UNSUPPORTED
            elif k != "dtype" and v not in keep.get(k, ()):
                return _UNSUPPORTED
        return sched_cast(x, kwargs.get("dtype") or x.dtype, None, thr)

    def copy_(thr, args, kwargs):
        if not 2 <= len(args) <= 3 or (len(args) == 3 and args[2]) or kwargs.get("non_blocking"):
            return _UNSUPPORTED
        dst, src = args[0], args[1]
        if not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
            return _UNSUPPORTED
        return sched_cast(src, dst.dtype, dst, thr)

    def join(thr, args, kwargs, stack):
        """cat / stack: a fresh output and one copy per input into its slice (different dtypes promote)."""
        ts = args[0] if args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not isinstance(ts, (list, tuple)) or not ts or not isinstance(dim, int) or len(args) > 2:
            return _UNSUPPORTED
        if not stack:  # torch.cat skips legacy empty 1-D tensors
            ts = [t for t in ts if not (isinstance(t, torch.Tensor) and t.dim() == 1 and t.numel() == 0)] or ts[:1]
        t0 = ts[0]
        if not all(isinstance(t, torch.Tensor) for t in ts):
            return _UNSUPPORTED
        if not all(t.is_cuda for t in ts):
            return _NOT_CUDA
        nd = t0.dim() + (1 if stack else 0)
        if nd == 0 or not -nd <= dim < nd or any(t.device != t0.device or t.dim() != t0.dim() for t in ts):
            return _UNSUPPORTED
        dim %= nd
        if stack:
            if any(t.shape != t0.shape for t in ts):
                return _UNSUPPORTED
            shape = list(t0.shape[:dim]) + [len(ts)] + list(t0.shape[dim:])
        else:
            if any(t.shape[:dim] != t0.shape[:dim] or t.shape[dim + 1:] != t0.shape[dim + 1:] for t in ts):
                return _UNSUPPORTED
            shape = list(t0.shape)
            shape[dim] = sum(t.shape[dim] for t in ts)
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in ts))
        out = torch.empty(shape, dtype=dtype, device=t0.device)
        off = 0
        for t in ts:  # a rejected piece (dtype, size, autograd): the whole op runs eagerly; recorded pieces
            part = out.select(dim, off) if stack else out.narrow(dim, off, t.shape[dim])   # wrote only `out`
            r = sched_cast(t, dtype, part, thr)
            if _is_reason(r):
                return r
            off += 1 if stack else t.shape[dim]
        return out

    return {aten._to_copy.default: to_copy, aten.copy_.default: copy_,
            aten.cat.default: lambda thr, args, kwargs: join(thr, args, kwargs, False),
            aten.stack.default: lambda thr, args, kwargs: join(thr, args, kwargs, True)}


class _Refused(Exception):
    """A step of a handler that records several ops was refused: `reason` says why (the op runs eagerly)."""

    def __init__(self, reason) -> None:
        super().__init__(reason)
        self.reason = reason


def layer_norm_handler() -> dict:
    """aten::native_layer_norm over the last dim as table ops (fp32 math, as eager's kernel): x32 = copy(x),
    mean = mean(x32), xc = x32 - mean, rstd = rsqrt(mean(xc * xc) + eps), out = copy(xc * rstd * w + b). Returns
    (out, mean, rstd) like the aten op. If a step is refused (size, dtype, autograd) the op runs eagerly; the steps
    already recorded wrote only their own fresh outputs."""
    ids = {row["name"]: row["id"] for row in _ext.op_table()}
    sched_ew, sched_reduce, sched_cast, fn = _ext.sched_ew, _ext.sched_reduce, _ext.sched_cast, _MODES["functional"]
    f32 = torch.float32

    def ln(thr, args, kwargs):
        if len(args) != 5 or kwargs:
            return _UNSUPPORTED
        x, shape, w, b, eps = args
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or list(shape) != [x.shape[-1]] or not _number(eps):
            return _UNSUPPORTED
        if any(t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1) for t in (w, b)):
            return _UNSUPPORTED

        def step(r):  # a recorded tensor, or the reason the whole op runs eagerly
            if _is_reason(r):
                raise _Refused(r)
            return r

        def ew(name, *ins):  # (add / sub: alpha 1)
            return step(sched_ew(ids[name], fn, ins, None, 1.0, 0.0, thr))

        try:
            x32 = x if x.dtype == f32 else step(sched_cast(x, f32, None, thr))
            mean = step(sched_reduce(ids["mean"], x32, True, thr))
            xc = ew("sub", x32, mean)
            rstd = ew("rsqrt", ew("add", step(sched_reduce(ids["mean"], ew("mul", xc, xc), True, thr)), float(eps)))
            y = ew("mul", xc, rstd)
            if w is not None:
                y = ew("mul", y, w)
            if b is not None:
                y = ew("add", y, b)
            if x.dtype != f32:
                y = step(sched_cast(y, x.dtype, None, thr))
        except _Refused as e:
            return e.reason
        return y, mean, rstd

    return {aten.native_layer_norm.default: ln}


def matmul_handlers() -> dict:
    """aten::mm / addmm / bmm / baddbmm as worker tasks (gpuos.set_worker_matmul): <= 64 activation rows; the
    rest, and every product while the switch is off, run with cuBLAS (fallback reasons 'matmul_rows',
    'matmul_off')."""
    sched_matmul = _ext.sched_matmul

    def mm(thr, args, kwargs):
        if len(args) != 2 or kwargs:
            return _UNSUPPORTED
        return sched_matmul(args[0], args[1], None, 1.0, 1.0)

    def scaled(ov):  # addmm / baddbmm(self, m1, m2, *, beta=1, alpha=1): out = beta * self + alpha * m1 @ m2
        schema = _Schema(ov)

        def handler(thr, args, kwargs):
            beta, alpha = schema.get(args, kwargs, "beta"), schema.get(args, kwargs, "alpha")
            if not (_number(beta) and _number(alpha)) or len(args) < 3:
                return _UNSUPPORTED
            return sched_matmul(args[1], args[2], args[0], float(alpha), float(beta))
        return handler

    # bmm / baddbmm: eager attention's q @ k^T and probs @ v at decode (M = the query length).
    return {aten.mm.default: mm, aten.addmm.default: scaled(aten.addmm.default), aten.bmm.default: mm,
            aten.baddbmm.default: scaled(aten.baddbmm.default)}

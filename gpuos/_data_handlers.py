"""The scheduler's handlers of data-movement aten ops (issue #16): they run in the worker as the op table's kind-3
ops (device_src/ops.def: gather, scatter, argmax, where, add_int, mul_int, arange, fill; device_src/dataops.h).

Each handler parses the aten call, allocates the output (a view op or ``torch.empty``: no data is read here) and
makes one ``gpuos_ext.sched_data`` call, which checks what the worker relies on (CUDA, dtypes, shapes, overlap,
the size threshold) and defers the op through the scheduler's one recording path; or it returns a reason and the
op runs eagerly. Index values are never read on the host: an index out of range is caught by the worker (the
element gets NaN / 0, a scatter skips it, and ``gpuos.stats()["index_faults"]`` becomes 1), where torch's CUDA
kernels stop the process with a device-side assert.
"""
from __future__ import annotations

import torch

import gpuos_ext as _ext

from ._handler_base import DTYPE as _DTYPE, NOT_CUDA as _NOT_CUDA, UNSUPPORTED as _UNSUPPORTED
from ._handler_base import is_reason as _is_reason, number as _number

aten = torch.ops.aten

_ID = {row["name"]: row["id"] for row in _ext.op_table()}
_INT = (torch.int64, torch.int32)
_U64 = (1 << 64) - 1


def bits_of(value, dtype: torch.dtype) -> int:
    """The bits of Python number `value` stored as `dtype` (raises OverflowError / ValueError where torch would): the
    C++ definition (csrc/sched/record.h bits_of), which the dispatcher front's own handlers use too."""
    return _sched_bits_of(value, dtype)


_sched_bits_of = _ext.sched_bits_of  # (bound here: tests replace _ext with stand-ins of the record calls)


def _scalar_value(x):
    """A Python number, or a CPU 0-d tensor's value (read on the host: no deferred work can be behind it); None."""
    if _number(x):
        return x
    if isinstance(x, torch.Tensor) and x.dim() == 0 and x.device.type == "cpu":
        return x.item()
    return None


def _data(op, out, ins, bits=None, dim=0, ival=0, keepdim=False, fresh=True, thr=1 << 15):
    bits = tuple(bits) if bits is not None else (0,) * len(ins)
    return _ext.sched_data(_ID[op], out, tuple(ins), bits, int(dim), int(ival), bool(keepdim), bool(fresh), thr)


def _dev(t) -> bool:
    """Is `t` on the device the worker serves (tests/test_cpu_data_ops.py replaces it to run the handlers on CPU
    tensors through gpuos_ext._testing.cpu_data)?"""
    return t.is_cuda


def _broadcast(*shapes):
    """torch's broadcast shape, or None when the shapes do not broadcast (eager then raises torch's own error)."""
    try:
        return torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return None


def _cuda(*ts) -> bool:
    return all(_dev(t) for t in ts)


# ----------------------------------------------------------------------------- gathers and scatters
def _embedding(thr, args, kwargs):
    # padding_idx, scale_grad_by_freq and sparse change only the backward: the forward is a row gather
    w, idx = (list(args) + [kwargs.get("weight"), kwargs.get("indices")])[:2]
    if not isinstance(w, torch.Tensor) or not isinstance(idx, torch.Tensor) or w.dim() != 2:
        return _UNSUPPORTED
    if not _cuda(w, idx):
        return _NOT_CUDA
    out = torch.empty(tuple(idx.shape) + (w.shape[1],), dtype=w.dtype, device=w.device)
    return _data("gather", out, (w, idx), dim=0, thr=thr)


def _index_select(thr, args, kwargs):
    x, dim, idx = (list(args) + [kwargs.get("dim"), kwargs.get("index")])[:3]
    if not isinstance(x, torch.Tensor) or not isinstance(idx, torch.Tensor) or not isinstance(dim, int):
        return _UNSUPPORTED
    if not _cuda(x, idx):
        return _NOT_CUDA
    if x.dim() == 0 or idx.dim() > 1 or not -x.dim() <= dim < x.dim():
        return _UNSUPPORTED
    dim %= x.dim()
    idx1 = idx.reshape(1) if idx.dim() == 0 else idx  # a view: index_select keeps the dim
    out = torch.empty(tuple(x.shape[:dim]) + (idx1.shape[0],) + tuple(x.shape[dim + 1:]), dtype=x.dtype,
                      device=x.device)
    return _data("gather", out, (x, idx1), dim=dim, thr=thr)


def _scatter_rows(thr, self, dim, idx, src, wrap):
    """self[..., idx[i], ...] = src[..., i, ...] along `dim` (self written in place); `wrap` (index_put_): src
    broadcasts to the target and negative indices count from the end; else (index_copy_) src has the target's shape
    exactly and the index is int64, as torch requires."""
    if not isinstance(self, torch.Tensor) or not isinstance(idx, torch.Tensor) or not isinstance(src, torch.Tensor):
        return _UNSUPPORTED
    if not _cuda(self, idx, src):
        return _NOT_CUDA
    if self.dim() == 0 or not -self.dim() <= dim < self.dim() or idx.dim() > 1:
        return _UNSUPPORTED
    dim %= self.dim()
    idx1 = idx.reshape(1) if idx.dim() == 0 else idx
    target = tuple(self.shape[:dim]) + (idx1.shape[0],) + tuple(self.shape[dim + 1:])
    if src.dim() == self.dim() - 1 and idx.dim() == 0:
        src = src.unsqueeze(dim)
    if not wrap and (tuple(src.shape) != target or idx.dtype != torch.int64):
        return _UNSUPPORTED  # eager raises torch's own error
    try:
        src = src.expand(target)
    except RuntimeError:
        return _UNSUPPORTED
    return _data("scatter", self, (src, idx1), dim=dim, ival=1 if wrap else 0, fresh=False, thr=thr)


def _index_copy_(thr, args, kwargs):
    if len(args) != 4 or kwargs or not isinstance(args[1], int):
        return _UNSUPPORTED
    self, dim, idx, src = args
    if isinstance(src, torch.Tensor) and isinstance(self, torch.Tensor) and src.dim() != self.dim():
        return _UNSUPPORTED  # torch raises (a 0-d index too: "their dimensionality must match")
    return _scatter_rows(thr, self, dim, idx, src, wrap=False)


def _copy_into(thr, x, memory_format=torch.contiguous_format):
    """A fresh copy of x (the functional forms write it, then scatter into it): copy for floats, where for ints."""
    out = torch.empty_like(x, memory_format=memory_format)
    if x.dtype in (torch.float32, torch.float16, torch.bfloat16):
        r = _ext.sched_cast(x, x.dtype, out, thr)
    else:
        r = _data("where", out, (None, x, None), bits=(1, 0, 0), thr=thr)
    return r if _is_reason(r) else out


def _functional(inplace, nargs=None):
    """The functional form of an in-place handler: a copy of self, then the in-place op on the copy."""
    def handler(thr, args, kwargs):
        if not args or not isinstance(args[0], torch.Tensor) or (nargs is not None and (len(args) != nargs or kwargs)):
            return _UNSUPPORTED
        if not _dev(args[0]):
            return _NOT_CUDA
        out = _copy_into(thr, args[0])
        if _is_reason(out):
            return out
        r = inplace(thr, (out,) + tuple(args[1:]), kwargs)
        return r if _is_reason(r) else out
    return handler


def _put_target(indices):
    """(dim, index) of an index_put_ with one integer index tensor and None elsewhere; None otherwise."""
    if not isinstance(indices, (list, tuple)):
        return None
    pos = [i for i, t in enumerate(indices) if t is not None]
    if len(pos) != 1:
        return None
    idx = indices[pos[0]]
    if not isinstance(idx, torch.Tensor) or idx.dtype not in _INT or idx.dim() > 1:
        return None
    return pos[0], idx


def _index_put_(thr, args, kwargs):
    self, indices, values = (list(args) + [None, None, None])[:3]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    tgt = _put_target(indices)
    if accumulate or tgt is None or not isinstance(values, torch.Tensor) or not isinstance(self, torch.Tensor):
        return _UNSUPPORTED
    dim, idx = tgt
    # values broadcast to self[:dim] + idx.shape + self[dim+1:] (a 0-d index drops the dim)
    if idx.dim() == 0:
        target = tuple(self.shape[:dim]) + tuple(self.shape[dim + 1:])
        try:
            values = values.expand(target).unsqueeze(dim)
        except RuntimeError:
            return _UNSUPPORTED
    return _scatter_rows(thr, self, dim, idx, values, wrap=True)


_index_copy = _functional(_index_copy_, nargs=4)  # aten::index_copy (functional)
_index_put = _functional(_index_put_)             # aten::index_put (functional)


# ----------------------------------------------------------------------------- argmax / max(dim)
def _argmax_into(thr, x, dim, keepdim):
    if not isinstance(x, torch.Tensor):
        return _UNSUPPORTED
    if not _dev(x):
        return _NOT_CUDA
    if dim is None:  # over every element: a flat view (contiguous only: no copy may run here)
        if keepdim or not x.is_contiguous() or x.numel() == 0:
            return _UNSUPPORTED
        xv, shape = x.view(-1), ()
    else:
        if x.dim() == 0 or not -x.dim() <= dim < x.dim():
            return _UNSUPPORTED
        dim %= x.dim()
        xv = x.movedim(dim, -1)
        shape = list(x.shape)
        if keepdim:
            shape[dim] = 1
        else:
            shape.pop(dim)
    out = torch.empty(shape, dtype=torch.int64, device=x.device)
    # the worker's out view: x's other dims in order (keepdim: the kept 1 squeezed away at lowering, so move it last)
    view = out.movedim(dim, -1) if (dim is not None and keepdim) else out
    r = _data("argmax", view, (xv,), keepdim=keepdim and dim is not None, thr=thr)
    return r if _is_reason(r) else out


def _argmax(thr, args, kwargs):
    x = args[0] if args else None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dim is not None and not isinstance(dim, int):
        return _UNSUPPORTED
    return _argmax_into(thr, x, dim, bool(keepdim))


def _max_dim(thr, args, kwargs):
    """max.dim -> (values, indices): amax (a table reduction) and argmax over the same dim."""
    x = args[0] if args else None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if not isinstance(x, torch.Tensor) or not isinstance(dim, int) or x.dim() == 0:
        return _UNSUPPORTED
    if not -x.dim() <= dim < x.dim():
        return _UNSUPPORTED
    dim %= x.dim()
    idx = _argmax_into(thr, x, dim, keepdim)
    if _is_reason(idx):
        return idx
    vals = _ext.sched_reduce(_ID["amax"], x.movedim(dim, -1), keepdim, thr)
    if _is_reason(vals):  # the argmax recorded only wrote its own fresh output
        return vals
    if keepdim:
        vals = vals.movedim(-1, dim)
    return vals, idx


# ----------------------------------------------------------------------------- where / masked_fill
def _operand(x, dtype, thr):
    """(tensor or None, bits): a CUDA tensor of `dtype` (a 0-d float one of another float dtype is cast first, as
    where's type promotion does), or a constant (number / CPU 0-d tensor); None if neither."""
    if isinstance(x, torch.Tensor) and _dev(x):
        if x.dtype == dtype:
            return x, 0
        floats = (torch.float32, torch.float16, torch.bfloat16)
        if x.dim() == 0 and x.dtype in floats and dtype in floats:
            c = _ext.sched_cast(x, dtype, None, thr)
            return None if _is_reason(c) else (c, 0)
        return None
    v = _scalar_value(x)
    if v is None:
        return None
    try:
        return None, bits_of(v, dtype)
    except (OverflowError, ValueError):
        return None


def _where(thr, args, kwargs):
    if len(args) != 3 or kwargs:
        return _UNSUPPORTED
    cond, a, b = args
    if not isinstance(cond, torch.Tensor) or cond.dtype != torch.bool:
        return _UNSUPPORTED
    if not _dev(cond):
        return _NOT_CUDA
    dtype = torch.result_type(a, b) if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else None
    if dtype is None:
        return _UNSUPPORTED
    shape = cond.shape
    for t in (a, b):
        if isinstance(t, torch.Tensor):
            shape = _broadcast(shape, t.shape)
            if shape is None:
                return _UNSUPPORTED
    oa, ob = _operand(a, dtype, thr), _operand(b, dtype, thr)
    if oa is None or ob is None:
        return _DTYPE
    out = torch.empty(shape, dtype=dtype, device=cond.device)
    return _data("where", out, (cond, oa[0], ob[0]), bits=(0, oa[1], ob[1]), thr=thr)


def _masked_fill(inplace):
    def handler(thr, args, kwargs):
        if len(args) != 3 or kwargs:
            return _UNSUPPORTED
        x, mask, value = args
        if not isinstance(x, torch.Tensor) or not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return _UNSUPPORTED
        if not _cuda(x, mask):
            return _NOT_CUDA
        try:
            if torch.broadcast_shapes(x.shape, mask.shape) != x.shape:
                return _UNSUPPORTED
        except RuntimeError:
            return _UNSUPPORTED
        if isinstance(value, torch.Tensor) and value.dim() != 0:
            return _UNSUPPORTED
        ov = _operand(value, x.dtype, thr)
        if ov is None:
            return _DTYPE
        out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
        r = _data("where", out, (mask, ov[0], x), bits=(0, ov[1], 0), fresh=not inplace, thr=thr)
        return r if _is_reason(r) else out
    return handler


def _clone(thr, args, kwargs):
    x = args[0] if args else None
    mf = kwargs.get("memory_format", args[1] if len(args) > 1 else None)
    if not isinstance(x, torch.Tensor) or mf not in (None, torch.preserve_format, torch.contiguous_format):
        return _UNSUPPORTED
    if not _dev(x):
        return _NOT_CUDA
    return _copy_into(thr, x, torch.contiguous_format if mf == torch.contiguous_format else torch.preserve_format)


# ----------------------------------------------------------------------------- factories
_FACTORY_KW = {"layout": (None, torch.strided), "pin_memory": (None, False)}


def _factory_device(kwargs):
    for k, ok in _FACTORY_KW.items():
        if kwargs.get(k) not in ok:
            return None
    dev = kwargs.get("device")
    if dev is None or torch.device(dev).type != "cuda":
        return None
    dev = torch.device(dev)
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def _arange(thr, args, kwargs):
    if not all(_number(a) and not isinstance(a, float) for a in args) or not 1 <= len(args) <= 3:
        return _UNSUPPORTED
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
    dev = _factory_device(kwargs)
    dtype = kwargs.get("dtype") or torch.int64
    if dev is None or dtype not in _INT or step == 0:
        return _UNSUPPORTED
    n = max(0, -(-(end - start) // step))
    try:
        b0, b1 = bits_of(start, dtype), bits_of(step, dtype)
        bits_of(start + (n - 1) * step if n else start, dtype)
    except (OverflowError, ValueError):
        return _UNSUPPORTED
    out = torch.empty((n,), dtype=dtype, device=dev)
    r = _data("arange", out, (None, None), bits=(b0, b1), thr=thr)
    return r if _is_reason(r) else out


def _fill_new(thr, shape, value, dtype, dev):
    try:
        b = bits_of(value, dtype)
    except (OverflowError, ValueError):
        return _UNSUPPORTED
    out = torch.empty(shape, dtype=dtype, device=dev)
    r = _data("fill", out, (None,), bits=(b,), thr=thr)
    return r if _is_reason(r) else out


def _full(value_of):
    """full / zeros / ones: `value_of(args, kwargs)` -> (value, dtype when none is given)."""
    def handler(thr, args, kwargs):
        size = args[0] if args else kwargs.get("size")
        value, dflt = value_of(args, kwargs)
        if not isinstance(size, (list, tuple)) or not _number(value):
            return _UNSUPPORTED
        dev = _factory_device(kwargs)
        if dev is None:
            return _UNSUPPORTED
        return _fill_new(thr, tuple(size), value, kwargs.get("dtype") or dflt, dev)
    return handler


def _full_value(args, kwargs):
    v = args[1] if len(args) > 1 else kwargs.get("fill_value")
    dflt = torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int) else torch.get_default_dtype()
    return v, dflt


def _scalar_tensor(thr, args, kwargs):
    if len(args) != 1 or not _number(args[0]):
        return _UNSUPPORTED
    dev = _factory_device(kwargs)
    if dev is None:
        return _UNSUPPORTED
    return _fill_new(thr, (), args[0], kwargs.get("dtype") or torch.get_default_dtype(), dev)


def handlers() -> dict:
    """{aten overload: handler(size_threshold, args, kwargs) -> output | reason}."""
    h = {
        aten.embedding.default: _embedding,
        aten.index_select.default: _index_select,
        aten.index_copy_.default: _index_copy_,
        aten.index_copy.default: _index_copy,
        aten.index_put_.default: _index_put_,
        aten.index_put.default: _index_put,
        aten.argmax.default: _argmax,
        aten.max.dim: _max_dim,
        aten.where.self: _where,
        aten.masked_fill.Scalar: _masked_fill(False),
        aten.masked_fill_.Scalar: _masked_fill(True),
        aten.masked_fill.Tensor: _masked_fill(False),
        aten.masked_fill_.Tensor: _masked_fill(True),
        aten.clone.default: _clone,
        aten.arange.default: _arange,
        aten.arange.start: _arange,
        aten.arange.start_step: _arange,
        aten.scalar_tensor.default: _scalar_tensor,
        aten.full.default: _full(_full_value),
        aten.zeros.default: _full(lambda a, k: (0, torch.get_default_dtype())),
        aten.ones.default: _full(lambda a, k: (1, torch.get_default_dtype())),
    }
    for name in ("where.ScalarOther", "where.ScalarSelf", "where.Scalar"):
        ov = getattr(aten.where, name.split(".")[1], None)
        if ov is not None:
            h[ov] = _where
    return h

"""The scheduler's handlers of integer arithmetic, casts with an integer side, and comparisons (bool masks): the
data-movement ops add_int / mul_int / cmp of device_src/ops.def (kind 4), recorded like the rest of
gpuos/_data_handlers.py (whose helpers they use, through the module: tests replace them there)."""
from __future__ import annotations

import torch

import gpuos_ext as _ext

from . import _data_handlers as D

aten = torch.ops.aten


# ----------------------------------------------------------------------------- integer arithmetic and casts
def _int_arith(op, sign, inplace):
    """add / sub / mul on int64 / int32 tensors in integer arithmetic (wrapping like torch), not through fp32."""
    def handler(thr, args, kwargs):
        a, b = (list(args) + [kwargs.get("other")])[:2]
        alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
        if any(k not in ("other", "alpha") for k in kwargs) or not D._number(alpha) or isinstance(alpha, float):
            return D._UNSUPPORTED
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            return D._UNSUPPORTED
        dtype = torch.result_type(a, b)
        if dtype not in D._INT:
            return D._DTYPE
        ts = [t for t in (a, b) if isinstance(t, torch.Tensor) and D._dev(t)]
        if not ts:
            return D._NOT_CUDA if any(isinstance(t, torch.Tensor) for t in (a, b)) else D._UNSUPPORTED
        ins, bits = [], []
        for x in (a, b):
            if isinstance(x, torch.Tensor) and D._dev(x):
                ins.append(x)
                bits.append(0)
                continue
            v = D._scalar_value(x)
            if v is None or isinstance(v, float):
                return D._UNSUPPORTED
            ins.append(None)
            bits.append(int(v) & D._U64)
        shape = D._broadcast(*(t.shape for t in ts))
        if shape is None:
            return D._UNSUPPORTED
        if inplace:
            out = a
            if not isinstance(a, torch.Tensor) or a.dtype != dtype or tuple(a.shape) != tuple(shape):
                return D._UNSUPPORTED
        else:
            out = torch.empty(shape, dtype=dtype, device=ts[0].device)
        r = D._data(op, out, ins, bits=bits, ival=sign * int(alpha), fresh=not inplace, thr=thr)
        return r if D._is_reason(r) else out
    return handler


def int_cast(thr, x, dtype, out=None):
    """A cast / copy with an integer side: int64 / int32 / bool -> int64 / int32, integer <-> float (float -> integer
    truncates; integer -> fp16 / bf16 rounds through fp32, as torch does) as add_int(x, 0), or a bool copy (where with
    a constant condition); a reason otherwise (float -> float is the table's copy; -> bool is not done)."""
    if not isinstance(x, torch.Tensor) or not D._dev(x):
        return D._UNSUPPORTED
    fresh = out is None
    if out is None:
        out = torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)
    floats, ints = (torch.float32, torch.float16, torch.bfloat16), D._INT + (torch.bool,)
    if (dtype in D._INT and x.dtype in ints + floats) or (dtype in floats and x.dtype in ints):
        r = D._data("add_int", out, (x, None), bits=(0, 0), ival=0, fresh=fresh, thr=thr)
    elif dtype == x.dtype == torch.bool:
        r = D._data("where", out, (None, x, None), bits=(1, 0, 0), fresh=fresh, thr=thr)
    else:
        return D._DTYPE
    return r if D._is_reason(r) else out


_CAST_KW = {"layout": (None, torch.strided), "pin_memory": (None, False), "non_blocking": (False,),
            "memory_format": (None, torch.preserve_format)}


def _to_copy_int(thr, args, kwargs):
    x = args[0] if len(args) == 1 else None
    if not isinstance(x, torch.Tensor):
        return D._UNSUPPORTED
    for k, v in kwargs.items():
        if k == "device":
            if v is not None and torch.device(v) != x.device:
                return D._UNSUPPORTED
        elif k != "dtype" and v not in _CAST_KW.get(k, ()):
            return D._UNSUPPORTED
    return int_cast(thr, x, kwargs.get("dtype") or x.dtype)


def _copy_int(thr, args, kwargs):
    if not 2 <= len(args) <= 3 or (len(args) == 3 and args[2]) or kwargs.get("non_blocking"):
        return D._UNSUPPORTED
    dst, src = args[0], args[1]
    if not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
        return D._UNSUPPORTED
    r = int_cast(thr, src, dst.dtype, out=dst)
    return r if D._is_reason(r) else dst


def int_handlers() -> dict:
    """Integer forms of overloads whose float handler refuses integer dtypes (reason 'dtype'): add / sub / mul in
    integer arithmetic, and integer casts / copies (_to_copy, copy_)."""
    h = {aten._to_copy.default: _to_copy_int, aten.copy_.default: _copy_int}
    for name, op, sign in (("add", "add_int", 1), ("sub", "add_int", -1), ("mul", "mul_int", 1)):
        for ov_name in ("Tensor", "Scalar"):
            h[getattr(getattr(aten, name), ov_name)] = _int_arith(op, sign, False)
            h[getattr(getattr(aten, name + "_"), ov_name)] = _int_arith(op, sign, True)
    return h


# ----------------------------------------------------------------------------- comparisons (masks)
_CMP = dict(_ext.cmp_rules())  # device_src/dataops.h CmpOp
_CMP_FLOAT = _CMP.pop("float")


def _compare(rule):
    """lt / le / gt / ge / eq / ne -> a bool mask: integer operands compared as int64, float operands of one dtype
    (or a float tensor and a number, rounded to its dtype first as torch does) in fp32."""
    def handler(thr, args, kwargs):
        if len(args) != 2 or kwargs:
            return D._UNSUPPORTED
        a, b = args
        ts = [t for t in (a, b) if isinstance(t, torch.Tensor) and D._dev(t)]
        if not ts:
            return D._NOT_CUDA if any(isinstance(t, torch.Tensor) for t in (a, b)) else D._UNSUPPORTED
        dtype = torch.result_type(a, b)
        fl = dtype.is_floating_point
        if fl and dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return D._DTYPE
        ins, bits = [], []
        for x in (a, b):
            if isinstance(x, torch.Tensor) and D._dev(x):
                if fl and x.dtype != dtype:
                    return D._DTYPE
                ins.append(x)
                bits.append(0)
                continue
            v = D._scalar_value(x)
            if v is None:
                return D._UNSUPPORTED
            ins.append(None)
            if fl:
                rounded = torch.tensor(v, dtype=dtype).float().item()  # torch compares in the tensor's dtype
                bits.append(D.bits_of(rounded, torch.float32))
            elif isinstance(v, float) and not v.is_integer():
                return D._DTYPE
            else:
                bits.append(int(v) & D._U64)
        shape = D._broadcast(*(t.shape for t in ts))
        if shape is None:
            return D._UNSUPPORTED
        out = torch.empty(shape, dtype=torch.bool, device=ts[0].device)
        r = D._data("cmp", out, ins, bits=bits, ival=rule | (_CMP_FLOAT if fl else 0), thr=thr)
        return r if D._is_reason(r) else out
    return handler


def compare_handlers() -> dict:
    h = {}
    for name, rule in _CMP.items():
        for ov in ("Tensor", "Scalar"):
            h[getattr(getattr(aten, name), ov)] = _compare(rule)
    return h

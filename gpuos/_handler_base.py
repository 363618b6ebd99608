"""What the scheduler's handler modules share (gpuos/scheduler.py, _attention.py, _data_handlers.py,
_int_handlers.py): the reason codes read from the extension, the "run eagerly" test, and the argument lookup of an
aten overload's schema. Imports nothing from the scheduler, so handler modules need no import cycle.

A handler maps (size_threshold, args, kwargs) to the output (recorded) or to a reason: an int code of
``gpuos_ext.sched_reasons()`` (csrc/sched/deferred.h SchedReason) or a str.
"""
from __future__ import annotations

import torch

import gpuos_ext as _ext

aten = torch.ops.aten
# Ops whose kernels need whole SMs (cuBLAS / cuDNN): the resident worker yields before they are issued (the
# scheduler's eager path and a program's eager steps).
HEAVY = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.matmul.default,
                   aten.linear.default, aten.convolution.default, aten._scaled_dot_product_efficient_attention.default,
                   aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_cudnn_attention.default})

REASONS = _ext.sched_reasons()
MODES = _ext.sched_modes()  # where sched_ew puts a result: functional / inplace / out


def reason_code(name: str) -> int:
    return next(code for code, n in REASONS.items() if n == name)


UNSUPPORTED = reason_code("unsupported_args")
NOT_CUDA = reason_code("not_cuda")
DTYPE = reason_code("dtype")
MISSING = object()  # an argument without a default


def is_reason(r) -> bool:
    """A handler's or sched_* call's result says "run eagerly" (an int reason code or a str) rather than a tensor."""
    return r.__class__ is int or r.__class__ is str


def number(x) -> bool:
    return isinstance(x, (int, float, bool)) and not isinstance(x, torch.Tensor)


class Schema:
    """Positions and defaults of an overload's arguments."""

    def __init__(self, ov) -> None:
        self.args = [(a.name, a.kwarg_only, a.default_value if a.has_default_value() else MISSING)
                     for a in ov._schema.arguments]
        self.index = {name: i for i, (name, _, _) in enumerate(self.args)}

    def get(self, args, kwargs, name):
        i = self.index[name]
        if name in kwargs:
            return kwargs[name]
        if i < len(args) and not self.args[i][1]:
            return args[i]
        return self.args[i][2]

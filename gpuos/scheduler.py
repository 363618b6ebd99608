"""Transparent scheduler: run ordinary PyTorch code with its small elementwise ops and last-dim reductions
batched onto the GPUOS worker.

    with gpuos.scheduler_context():
        y = torch.nn.functional.gelu(x @ w + b)   # matmul falls back to eager; + and gelu are batched
        print(y.sum().item())                     # a host read: pending work is flushed first

When to use it: latency-bound inference code made of many small ops (decode loops, micro-batched models)
where launch overhead dominates. Not for training (ops that autograd must record fall back to eager) nor for
large tensors (ops above ``size_threshold`` elements fall back to eager, where one kernel is already efficient).
"""
from __future__ import annotations

import collections
import threading
import types as _types
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import gpuos_ext as _ext

aten = torch.ops.aten

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Ops that read no tensor data (views, metadata, allocation): they run eagerly without flushing the batch.
_NO_DATA = {aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int, aten.permute.default,
            aten.expand.default, aten.slice.Tensor, aten.select.int, aten.unsqueeze.default, aten.squeeze.dim,
            aten.squeeze.default, aten.detach.default, aten.alias.default, aten.as_strided.default,
            aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.unbind.int,
            aten.split.Tensor, aten.chunk.default, aten.reshape.default, aten.view_as.default}
# Ops whose kernels need whole SMs (cuBLAS / cuDNN): the resident worker yields before they are issued.
_HEAVY = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.matmul.default,
          aten.linear.default, aten.convolution.default, aten._scaled_dot_product_efficient_attention.default,
          aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_cudnn_attention.default}


class _Stats:
    """Scheduler counters, merged into gpuos.stats()."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fallbacks: collections.Counter = collections.Counter()

    def as_dict(self) -> dict:
        c = _ext.sched_stats()  # intercepted ops, flushes and fusion are counted in C++ (the record path)
        with self.lock:
            fallbacks = dict(self.fallbacks)
        n = c["sched_flushes"]
        return {
            "ops_intercepted": c["ops_intercepted"],
            "front_ops": c["front_ops"],
            "fallbacks": fallbacks,
            "flushes_by_cause": c["flushes_by_cause"],
            "mean_batch_size": (c["flushed_ops"] / n) if n else 0.0,
            "fused_groups": c["fused_groups"],
            "fused_ops": c["fused_ops"],
            "independent_eager": c["independent_eager"],
            "specializations_requested": c["specializations_requested"],
            "recycled_outputs": c["recycled_outputs"],  # outputs given a fused-away intermediate's storage
            "flush_host_us": c["flush_host_us"],  # host time of publication by phase (analyse/emit/keep/publish)
        }


STATS = _Stats()


_EMPTY: dict = {}
# sched_ew / sched_reduce return an int when an op must run eagerly (csrc/bindings.cpp SchedReason).
_REASONS = {1: "not_cuda", 2: "layout", 3: "dtype", 4: "size", 5: "autograd", 6: "unsupported_args", 7: "device"}
_MODES = {"functional": 0, "inplace": 1, "out": 2}
_TABLE = {row["name"]: row for row in _ext.op_table()}


class GpuosScheduler(TorchDispatchMode):
    """TorchDispatchMode that records supported small ops into GPUOS batches (see module docstring).

    Parameters
    ----------
    capacity, threads_per_block
        Passed to ``gpuos_ext.init`` the first time a runtime is needed.
    size_threshold
        Ops whose output has more elements than this run eagerly.
    auto_flush_ms
        Pending work older than this is flushed by a background timer (0 disables the timer).
    front
        Also intercept plain functional elementwise calls (``a + b``, ``torch.sigmoid(x)``, ...) at the
        ``__torch_function__`` level, before PyTorch boxes them for the dispatch mode (~1.3 us per op less on an
        H100 host; every other op, and every call another mode or a tensor subclass could see differently, still
        goes through the dispatch mode). False: the dispatch mode alone.
    """

    def __init__(self, capacity: int = 8192, threads_per_block: int = 256, size_threshold: int = 1 << 15,
                 auto_flush_ms: float = 2.0, front: bool = True) -> None:
        super().__init__()
        self.capacity = capacity
        self.threads_per_block = threads_per_block
        self.size_threshold = size_threshold
        self.auto_flush_ms = auto_flush_ms
        self.front = front
        self._fronts: list = []  # one per __enter__ that pushed one (the same instance may be entered nested)
        self._lock = threading.RLock()
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()
        self._depth = 0
        # The hot path: torch calls this C++ function (bound to the mode) for every op, no Python frame. It records
        # the overloads in the fast table itself and calls _dispatch_py / _eager below for everything else.
        self.__torch_dispatch__ = _types.MethodType(_ext.sched_dispatch, self)

    # ----------------------------------------------------------------- context management
    def __enter__(self):
        with self._lock:
            if self._depth == 0 and torch.cuda.is_available():
                _ext.init(capacity=self.capacity, threads_per_block=self.threads_per_block)
            if self._depth == 0:
                _refresh_user_handlers()
            self._depth += 1
            if self._depth == 1:
                if self.auto_flush_ms > 0 and torch.cuda.is_available():
                    self._stop.clear()
                    self._timer = threading.Thread(target=self._timer_loop, name="gpuos-flush-timer", daemon=True)
                    self._timer.start()
        r = super().__enter__()
        front = _Front() if self.front and torch.cuda.is_available() else None
        if front is not None:
            front.__enter__()  # above the dispatch mode: popped first
        self._fronts.append(front)
        return r

    def __exit__(self, exc_type, exc, tb):
        try:
            self.flush("exit")
        finally:
            with self._lock:
                self._depth -= 1
                last = self._depth == 0
            if last and self._timer is not None:
                self._stop.set()
                self._timer.join()
                self._timer = None
            front = self._fronts.pop() if self._fronts else None
            if front is not None:
                front.__exit__(exc_type, exc, tb)
            super().__exit__(exc_type, exc, tb)

    # ----------------------------------------------------------------- flushing
    def flush(self, cause: str = "explicit") -> None:
        """Publish deferred work (lowered, chains fused) on the stream it was recorded under: stream-ordered, no
        host sync; if the caller's current stream is another one, it is made to wait for that stream."""
        self._wait_for(_ext.sched_flush(cause))

    @staticmethod
    def _wait_for(streams) -> None:
        if streams:
            cur = torch.cuda.current_stream()
            for s in streams:
                if s != cur.cuda_stream:
                    cur.wait_stream(torch.cuda.ExternalStream(s))

    def _timer_loop(self) -> None:
        period = self.auto_flush_ms / 1000.0
        while not self._stop.wait(period / 2):
            _ext.sched_flush_due(period)

    # ----------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """The Python path (the instance's __torch_dispatch__ is _ext.sched_dispatch, which calls this for the
        overloads it has no fast spec for): the handler records the op, or it runs eagerly."""
        kwargs = kwargs or _EMPTY
        handler = _HANDLERS.get(func)
        if handler is not None:
            try:
                r = handler(self.size_threshold, args, kwargs)
            except (TypeError, ValueError) as e:  # outside what GPUOS takes: eager
                r = "rejected:" + type(e).__name__
            if r.__class__ is not int and r.__class__ is not str:
                return r  # recorded: the output tensor
            return self._eager(func, args, kwargs, r)
        return self._eager(func, args, kwargs, "unsupported_op")

    _dispatch_py = __torch_dispatch__

    def _eager(self, func, args, kwargs, reason):
        """Run `func` eagerly (reason: an int from sched_ew / sched_reduce, or a str), after the deferred work it
        depends on."""
        if func in _NO_DATA:  # metadata / allocation only: reads no data, needs no flush
            return func(*args, **kwargs)
        if reason.__class__ is int:
            reason = _REASONS[reason]
        with STATS.lock:
            STATS.fallbacks[reason] += 1
        # An eager op (incl. host reads: .item(), .cpu(), print) that touches memory of deferred ops runs after
        # them: the batch is published first, in stream order. Eager ops on unrelated tensors run ahead and the
        # batch keeps growing. Heavy kernels get the SMs back from the worker.
        self._wait_for(_ext.sched_flush_for(args, kwargs, "dependency"))
        if func in _HEAVY:
            _ext.yield_worker()
        return func(*args, **kwargs)


class _Front(TorchFunctionMode):
    """The scheduler's __torch_function__ front (see GpuosScheduler's ``front``): its instance attribute
    __torch_function__ is _ext.sched_function bound to it, which records the calls in its table when a
    GpuosScheduler is the innermost dispatch mode and passes every other call on unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.__torch_function__ = _types.MethodType(_ext.sched_function, self)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # the class's definition; instances use C++
        return func(*args, **(kwargs or {}))


# --------------------------------------------------------------------- handlers
# A handler maps (size_threshold, args, kwargs) to the output tensor (recorded), or to an int / str reason to
# run eagerly. The work -- checks, broadcasting, type promotion, allocation, recording -- is one C++ call.
def _number(x) -> bool:
    return isinstance(x, (int, float, bool)) and not isinstance(x, torch.Tensor)


def _ew(name: str, nin: int, scalars: Callable[[tuple, dict], dict] | None = None, mode: str = "functional"):
    """Handler for an elementwise op: functional (allocate out), inplace (out = self), or out= form."""
    row = _TABLE[name]
    op, m, snames = row["id"], _MODES[mode], row["scalars"]
    d0, d1 = (list(row["defaults"]) + [0.0, 0.0])[:2]
    sched_ew = _ext.sched_ew

    if scalars is None:
        if mode == "out":
            def handler(thr, args, kwargs):
                return sched_ew(op, m, args[:nin], kwargs.get("out"), d0, d1, thr)
        else:
            def handler(thr, args, kwargs):
                return sched_ew(op, m, args[:nin], None, d0, d1, thr)
        return handler

    def handler(thr, args, kwargs):
        sc = scalars(args, kwargs)
        if sc is None:
            return 6
        v = [d0, d1]
        for key, val in sc.items():
            i = snames.index(key)
            v[i] = (float("-inf") if i == 0 else float("inf")) if val is None else val
        return sched_ew(op, m, args[:nin], kwargs.get("out") if mode == "out" else None, v[0], v[1], thr)

    return handler


def _reduce(name: str, kind: str):
    op = _TABLE[name]["id"]
    sched_reduce = _ext.sched_reduce

    def handler(thr, args, kwargs):
        x = args[0]
        if not isinstance(x, torch.Tensor):
            return 6
        if kind == "softmax":  # _softmax(self, dim, half_to_float)
            dim, half_to_float = args[1], args[2]
            if half_to_float or dim not in (-1, x.dim() - 1):
                return 6
            return sched_reduce(op, x, False, thr)
        # sum.dim_IntList(self, dim, keepdim=False, *, dtype=None) / mean.dim / amax / amin
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if kwargs.get("dtype") is not None or x.dim() == 0:
            return 6
        dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
        if len(dims) != 1 or dims[0] not in (-1, x.dim() - 1):
            return 6
        return sched_reduce(op, x, bool(keepdim), thr)

    return handler


def _alpha(args, kwargs):
    a = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    return {"alpha": float(a)} if _number(a) else None


def _div_mode(args, kwargs):
    return {} if kwargs.get("rounding_mode") is None else None


# sched_dispatch's fast table (C++): {overload: (op_id, mode, nin, d0, d1, scalar rule, number_ok)} for the elementwise
# overloads whose scalars it can read itself; the Python handler of each stays the definition of its behaviour.
_FAST: dict = {}
_SCALAR_RULES = {None: 0, _alpha: 1, _div_mode: 2}


def _build_handlers() -> dict:
    h: dict = {}

    def family(name, nin, overloads, scalars=None):
        row = _TABLE[name]
        d0, d1 = (list(row["defaults"]) + [0.0, 0.0])[:2]
        for ov, mode in overloads:
            h[ov] = _ew(name, nin, scalars, mode)
            if scalars in _SCALAR_RULES:
                _FAST[ov] = (row["id"], _MODES[mode], nin, float(d0), float(d1), _SCALAR_RULES[scalars], False)

    family("add", 2, [(aten.add.Tensor, "functional"), (aten.add.Scalar, "functional"),
                      (aten.add_.Tensor, "inplace"), (aten.add_.Scalar, "inplace"), (aten.add.out, "out")], _alpha)
    family("sub", 2, [(aten.sub.Tensor, "functional"), (aten.sub.Scalar, "functional"),
                      (aten.sub_.Tensor, "inplace"), (aten.sub_.Scalar, "inplace"), (aten.sub.out, "out")], _alpha)
    family("mul", 2, [(aten.mul.Tensor, "functional"), (aten.mul.Scalar, "functional"),
                      (aten.mul_.Tensor, "inplace"), (aten.mul_.Scalar, "inplace"), (aten.mul.out, "out")])
    family("div", 2, [(aten.div.Tensor, "functional"), (aten.div.Scalar, "functional"),
                      (aten.div_.Tensor, "inplace"), (aten.div_.Scalar, "inplace"), (aten.div.out, "out")], _div_mode)
    family("maximum", 2, [(aten.maximum.default, "functional"), (aten.maximum.out, "out")])
    family("minimum", 2, [(aten.minimum.default, "functional"), (aten.minimum.out, "out")])
    family("pow", 2, [(aten.pow.Tensor_Tensor, "functional"), (aten.pow.Tensor_Scalar, "functional"),
                      (aten.pow_.Tensor, "inplace"), (aten.pow_.Scalar, "inplace")])
    for name in ("neg", "reciprocal", "abs", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf",
                 "silu", "hardsigmoid", "hardswish"):
        ovs = [(getattr(aten, name).default, "functional"), (getattr(aten, name + "_").default, "inplace")]
        if hasattr(getattr(aten, name), "out"):
            ovs.append((getattr(aten, name).out, "out"))
        family(name, 1, ovs)
    family("relu", 1, [(aten.relu.default, "functional"), (aten.relu_.default, "inplace")])

    def gelu_handler(mode):
        plain, tanh = _ew("gelu", 1, None, mode), _ew("gelu_tanh", 1, None, mode)

        def handler(thr, args, kwargs):
            approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
            return (tanh if approx == "tanh" else plain)(thr, args[:1], kwargs)
        return handler

    h[aten.gelu.default] = gelu_handler("functional")
    h[aten.gelu_.default] = gelu_handler("inplace")

    def pos(i, key, default):
        return lambda args, kwargs: kwargs.get(key, args[i] if len(args) > i else default)

    def scal(**spec):
        def f(args, kwargs):
            out = {}
            for key, (i, default) in spec.items():
                v = kwargs.get(key, args[i] if len(args) > i else default)
                if v is None and key in ("min", "max"):
                    out[key] = None
                    continue
                if not _number(v):
                    return None
                out[key] = float(v)
            return out
        return f

    family("leaky_relu", 1, [(aten.leaky_relu.default, "functional"), (aten.leaky_relu_.default, "inplace")],
           scal(negative_slope=(1, 0.01)))
    family("hardtanh", 1, [(aten.hardtanh.default, "functional"), (aten.hardtanh_.default, "inplace")],
           scal(min_val=(1, -1.0), max_val=(2, 1.0)))

    def elu_scalars(args, kwargs):
        alpha, scale, input_scale = (list(args[1:4]) + [1.0, 1.0, 1.0])[:3]
        return {"alpha": float(alpha)} if scale == 1 and input_scale == 1 else None

    family("elu", 1, [(aten.elu.default, "functional")], elu_scalars)
    family("softplus", 1, [(aten.softplus.default, "functional")], scal(beta=(1, 1.0), threshold=(2, 20.0)))
    family("clamp", 1, [(aten.clamp.default, "functional"), (aten.clamp_.default, "inplace")],
           scal(min=(1, None), max=(2, None)))
    family("clamp_min", 1, [(aten.clamp_min.default, "functional")], scal(min=(1, 0.0)))
    family("clamp_max", 1, [(aten.clamp_max.default, "functional")], scal(max=(1, 0.0)))

    clamp3 = _ew("clamp_tensor", 3)

    def clamp_tensor(thr, args, kwargs):
        x = args[0]
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
        if not isinstance(lo, torch.Tensor) or not isinstance(hi, torch.Tensor):
            return 6
        return clamp3(thr, (x, lo, hi), _EMPTY)

    h[aten.clamp.Tensor] = clamp_tensor

    h[aten.sum.dim_IntList] = _reduce("sum", "reduce")
    h[aten.mean.dim] = _reduce("mean", "reduce")
    h[aten.amax.default] = _reduce("amax", "reduce")
    h[aten.amin.default] = _reduce("amin", "reduce")
    h[aten._softmax.default] = _reduce("softmax", "softmax")
    h[aten._log_softmax.default] = _reduce("log_softmax", "softmax")
    return h


_BUILTIN_HANDLERS = _build_handlers()
_HANDLERS = dict(_BUILTIN_HANDLERS)
_USER_KEYS: set = set()


def _resolve_aten(name: str):
    """'aten::foo' / 'aten::foo.overload' -> the OpOverload (None if torch has no such op)."""
    if not name.startswith("aten::"):
        return None
    base, _, overload = name[len("aten::"):].partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _user_handler(op_id: int, arity: int):
    """Handler for a registered op mapped to an aten op (issue #5): recorded directly by gpuos.submit."""
    def handler(thr, args, kwargs):
        inputs = list(args[:arity])
        if len(inputs) != arity or kwargs:
            return 6
        tens = [x for x in inputs if isinstance(x, torch.Tensor)]
        if not tens or not all(_number(x) or isinstance(x, torch.Tensor) for x in inputs):
            return 6
        for t in tens:
            if not t.is_cuda:
                return 1
            if t.dtype not in _FLOAT_DTYPES:
                return 3
            if t.numel() > thr:
                return 4
            if t.requires_grad and torch.is_grad_enabled():
                return 5
        dtype = tens[0].dtype
        for x in inputs[1:]:
            dtype = torch.result_type(torch.empty((), dtype=dtype), x) if not isinstance(x, torch.Tensor) else \
                torch.promote_types(dtype, x.dtype)
        out = torch.empty(torch.broadcast_shapes(*(t.shape for t in tens)), dtype=dtype, device=tens[0].device)
        _ext.submit(op_id, inputs, out)
        return out
    return handler


def _refresh_user_handlers() -> None:
    """Map registered ops with an `aten=` name onto the dispatch table (called when a context is entered)."""
    for key in _USER_KEYS:
        if key in _BUILTIN_HANDLERS:
            _HANDLERS[key] = _BUILTIN_HANDLERS[key]
        else:
            _HANDLERS.pop(key, None)
    _USER_KEYS.clear()
    for row in _ext.user_ops():
        if row.get("builtin") or not row.get("aten") or row.get("state") == "failed":
            continue
        ov = _resolve_aten(row["aten"])
        if ov is None:
            continue  # an aten name torch does not have: nothing to intercept
        _HANDLERS[ov] = _user_handler(row["id"], row["arity"])
        _USER_KEYS.add(ov)
    _ext.sched_set_fast({ov: spec for ov, spec in _FAST.items() if ov not in _USER_KEYS})
    _ext.sched_set_front(_front_table(), GpuosScheduler)


def _front_table() -> dict:
    """sched_function's table: the torch function and the Tensor method of each functional fast overload's op
    (torch.add / Tensor.add for aten.add.Tensor and aten.add.Scalar), unless a registered op took over any
    overload of that op."""
    taken = {ov.overloadpacket for ov in _USER_KEYS if hasattr(ov, "overloadpacket")}
    number_ok = {ov.overloadpacket for ov in _FAST if "Scalar" in ov._overloadname}
    table = {}
    for ov, (op, mode, nin, d0, d1, rule, _) in _FAST.items():
        if mode != _MODES["functional"] or ov.overloadpacket in taken:
            continue
        name = ov.overloadpacket.__name__
        for f in (getattr(torch._C.TensorBase, name, None), getattr(torch, name, None)):
            if type(f).__name__ in ("method_descriptor", "builtin_function_or_method"):
                table[f] = (op, mode, nin, d0, d1, rule, ov.overloadpacket in number_ok)
    return table


_ext.sched_set_fast(_FAST)
_ext.sched_set_front(_front_table(), GpuosScheduler)


def scheduler_context(capacity: int = 8192, threads_per_block: int = 256, size_threshold: int = 1 << 15,
                      auto_flush_ms: float = 2.0, front: bool = True) -> GpuosScheduler:
    """Context manager: ``with gpuos.scheduler_context(): ...`` batches supported small ops (see module doc)."""
    return GpuosScheduler(capacity=capacity, threads_per_block=threads_per_block, size_threshold=size_threshold,
                          auto_flush_ms=auto_flush_ms, front=front)


def scheduler_stats() -> dict:
    return STATS.as_dict()


def intercepted_ops() -> list[str]:
    """The aten overloads the scheduler can batch."""
    return sorted(str(k) for k in _HANDLERS)


__all__ = ["GpuosScheduler", "intercepted_ops", "scheduler_context", "scheduler_stats"]

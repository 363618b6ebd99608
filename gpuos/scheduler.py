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

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import gpuos_ext as _ext

from . import _attention, _collectives, _data_handlers, _decode_handlers, _int_handlers, _log, _streams
from . import _handler_base, programs as _programs
from ._handler_base import DTYPE as _DTYPE_CODE, MISSING as _MISSING, MODES as _MODES
from ._handler_base import REASONS as _REASONS, UNSUPPORTED as _UNSUPPORTED, Schema as _Schema
from ._handler_base import is_reason as _is_reason, number as _number

aten = torch.ops.aten

# Ops that read no tensor data (views, metadata, allocation): they run eagerly without flushing the batch.
_NO_DATA = {aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int, aten.permute.default,
            aten.expand.default, aten.slice.Tensor, aten.select.int, aten.unsqueeze.default, aten.squeeze.dim,
            aten.squeeze.default, aten.detach.default, aten.alias.default, aten.as_strided.default,
            aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.unbind.int,
            aten.split.Tensor, aten.chunk.default, aten.reshape.default, aten.view_as.default}
_HEAVY = _handler_base.HEAVY
_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default  # .item(): a host read, a copy and no kernel
# What the dispatcher front records itself, from C++ (csrc/sched/cfront_native.cpp, cfront_data.cpp), unless a
# registered op took the overload: the worker matmuls, casts, clones, joins, the mask builders' data ops (comparisons,
# fills among them), embedding, argmax, layer norm and KV cache writes (index_copy_, in place: the front bumps the
# version counter as ADInplaceOrView would), whose handlers here (gpuos/_decode_handlers.py, _data_handlers.py,
# _int_handlers.py) only read their arguments and call the record path; anything it refuses still goes to them.
_CFRONT_NATIVE = (aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default, aten._to_copy.default,
                  aten.clone.default, aten.cat.default, aten.scalar_tensor.default, aten.where.self,
                  aten.arange.default, aten.arange.start, aten.arange.start_step,
                  aten._scaled_dot_product_efficient_attention.default, aten.index_copy_.default,
                  aten.embedding.default, aten.argmax.default, aten.native_layer_norm.default, aten.zeros.default,
                  aten.ones.default, aten.full.default) + tuple(
                      getattr(getattr(aten, c), ov)
                      for c in ("lt", "le", "gt", "ge", "eq", "ne") for ov in ("Tensor", "Scalar"))
# Torch callables that only make views of their first argument (never a copy, no data read): the front runs them
# below the dispatch modes when that argument is a plain CUDA tensor, no other argument holds a tensor and a
# GpuosScheduler is the innermost mode (csrc/sched/dispatch.cpp view_of_plain_cuda). Tensor.split / unflatten are
# Python methods over TensorBase's (the front sees those, not TensorBase's), so both kinds are in the set.
_FRONT_VIEWS = list({f: None for name in ("view", "transpose", "t", "unsqueeze", "squeeze", "permute", "expand",
                                          "unbind", "split", "chunk", "select", "unflatten", "swapaxes")
                     for f in (getattr(torch._C.TensorBase, name, None), getattr(torch.Tensor, name, None),
                               getattr(torch, name, None)) if f is not None})


class _Stats:
    """Scheduler counters, merged into gpuos.stats()."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fallbacks: collections.Counter = collections.Counter()         # by reason
        self.fallback_ops: collections.Counter = collections.Counter()      # by aten overload ("aten.mm.default")

    def as_dict(self) -> dict:
        c = _ext.sched_stats()  # intercepted ops, flushes and fusion are counted in C++ (the record path)
        with self.lock:
            fallbacks = dict(self.fallbacks)
            fallback_ops = {str(k): v for k, v in self.fallback_ops.most_common()}
        n = c["sched_flushes"]
        return {
            "ops_intercepted": c["ops_intercepted"],
            "front_ops": c["front_ops"],
            "fallbacks": fallbacks,
            "fallback_ops": fallback_ops,  # which aten ops ran eagerly, most frequent first
            "flushes_by_cause": c["flushes_by_cause"],
            "batches_by_cause": c["batches_by_cause"],    # batches published by those flushes
            "launches_by_cause": c["launches_by_cause"],  # worker launches they caused
            "mean_batch_size": (c["flushed_ops"] / n) if n else 0.0,
            "fused_groups": c["fused_groups"],
            "fused_ops": c["fused_ops"],
            "row_groups": c["row_groups"],  # fused groups with a last-dim reduction inside (norms)
            "independent_eager": c["independent_eager"],
            "specializations_requested": c["specializations_requested"],
            "recycled_outputs": c["recycled_outputs"],  # outputs given a fused-away intermediate's storage
            "epilogues": c["epilogues"],  # residual adds folded into their matmul (csrc/sched/rewrite.h)
            "act_epilogues": c["act_epilogues"],  # chains run as their matmul's epilogue (sched/epilogue.cpp)
            "dual_epilogues": c["dual_epilogues"],  # ... of two products as one item (silu(gate) * up)
            "prologues": c["prologues"],  # norms run inside the matmuls reading them (sched/prologue.cpp)
            "copies_folded": c["copies_folded"],  # copies whose producer writes their destination (torch.cat)
            "dead_ops": c["dead_ops"],    # ops dropped: nobody could read their output any more
            "gqa_reads": c["gqa_reads"],  # attention k / v read from repeat_kv's source, not its copy
            "flush_host_us": c["flush_host_us"],  # host time of publication by phase (analyse/emit/keep/publish)
            "inflight_skips": c["inflight_skips"],  # dependency checks not waiting for the timer's publication
            "live_idle_us": c["live_idle_us"],  # the live window now (0: no scheduler context's timer runs)
            "live_yields": c["live_yields"],  # eager kernels that asked the worker the window kept to leave
        }


STATS = _Stats()


_EMPTY: dict = {}


class GpuosScheduler(TorchDispatchMode):
    """TorchDispatchMode that records supported small ops into GPUOS batches (see module docstring).

    Parameters
    ----------
    capacity, threads_per_block
        Passed to ``gpuos_ext.init`` when the context creates the runtime; a running runtime keeps its own.
    size_threshold
        Ops whose output has more elements than this run eagerly -- except an elementwise op or copy whose operand
        deferred work touches (eager, it would flush that work first): up to 2^22 elements it is recorded
        (csrc/sched/record.h kPendingSizeCap; HF repeat_kv's clone of a static cache).
    auto_flush_ms
        Pending work older than this is flushed by a background timer (0 disables the timer).
    live_idle_us
        While the timer runs, a worker the scheduler's flushes launch stays resident this long without work (the
        live window), so one worker serves flush after flush instead of a launch per flush (e.g. 2 x
        ``auto_flush_ms`` + 1 ms: decode steps of Llama-small 0.38 against 1.12 worker launches per step on an
        H200); the context's exit asks it to leave, and an eager op's kernel inside the context asks it first (it
        would get one SM beside it). A ``torch.cuda.synchronize()`` inside the context waits for the resident
        worker to leave: up to this long after the last flush. **Experimental, off by default** (None:
        ``GPUOS_LIVE_IDLE_US`` if set, else the runtime's 200 us idle time): the 6-thread stress test found wrong
        results with it and the off-GIL timer on; the cause found since is fixed, and both stay off until a long
        stress A/B is clean (docs/design/limitations.md).
    front
        Also intercept plain functional elementwise calls (``a + b``, ``torch.sigmoid(x)``, ...) at the
        ``__torch_function__`` level, before PyTorch boxes them for the dispatch mode (~1.3 us per op less on an
        H100 host; every other op, and every call another mode or a tensor subclass could see differently, still
        goes through the dispatch mode). None (the default): only where the dispatcher front (``cfront``) is off --
        beside it, the ``__torch_function__`` mode costs more than it saves (Llama-small decode on an H200:
        6,141 us per step without it, 6,988 with it; tools/sched_model_probe.py). False: never.
    cfront
        Also intercept every aten op in C++ at the dispatcher, before PyTorch boxes it for the dispatch mode
        (csrc/sched/cfront.h): elementwise ops (functional and in place) are recorded there, as are
        (csrc/sched/cfront_native.cpp, cfront_data.cpp) matmuls, casts, last-dim reductions, layer norm, clone, cat,
        scalar_tensor, zeros / ones / full, where, comparisons, embedding, argmax, integer arange and arithmetic (in
        place too), index_copy_ and the efficient SDPA op -- what their handlers here would record, an in-place op's
        version counter bumped as eager bumps it; no-data ops run at once, and the other functional ops with plain
        arguments go straight to this mode's handlers (csrc/sched/cfront_call.cpp; ``GPUOS_CFRONT_DIRECT=0``: not)
        -- ~4.5 us per op less than through the mode machinery on a CPU host (tools/dispatch_overhead.py);
        everything else (other in-place ops, out=, tensors that need grad, another mode on top, an open forward-AD
        level) goes on to the dispatch mode unchanged. Off where another library holds its dispatch key or with
        ``GPUOS_CFRONT=0`` (``gpuos_ext.cfront_info()`` says why).
    """

    def __init__(self, capacity: int = 8192, threads_per_block: int = 256, size_threshold: int = 1 << 15,
                 auto_flush_ms: float = 2.0, front: bool | None = None, cfront: bool = True,
                 live_idle_us: float | None = None) -> None:
        super().__init__()
        if live_idle_us is not None and not live_idle_us >= 0:
            raise ValueError(f"scheduler_context(live_idle_us={live_idle_us!r}): a worker's idle window in "
                             "microseconds is >= 0 (0 or None: the runtime's idle time)")
        self.capacity = capacity
        self.threads_per_block = threads_per_block
        self.size_threshold = size_threshold
        self.auto_flush_ms = auto_flush_ms
        self.front = front
        self.cfront = cfront
        self._fronts: list = []  # one per __enter__ that pushed one (the same instance may be entered nested)
        self._cfronts: list = []  # per __enter__: whether it turned the dispatcher front on (exit turns it off)
        self._lock = threading.RLock()
        self.live_idle_us = live_idle_us
        self._timer: threading.Thread | None = None
        self._live_window = 0.0  # what sched_live_window_open applied while the timer runs (0: none)
        self._timer_error: BaseException | None = None  # raised by the context's exit (the timer has no caller)
        self._stop = threading.Event()
        self._depth = 0
        # The hot path: torch calls this C++ function (bound to the mode) for every op, no Python frame. It records
        # the overloads in the fast table itself and calls _dispatch_py / _eager below for everything else.
        self.__torch_dispatch__ = _types.MethodType(_ext.sched_dispatch, self)

    # ----------------------------------------------------------------- context management
    def __enter__(self):
        with self._lock:
            if self._depth == 0 and torch.cuda.is_available():
                # The settings apply when this creates the runtime; a running one is taken as it is (0: no check).
                running = _ext.is_initialized()
                _log.start_runtime(_ext, capacity=0 if running else self.capacity,
                                   threads_per_block=0 if running else self.threads_per_block)
            if self._depth == 0:
                _refresh_user_handlers()
            self._depth += 1
            if self._depth == 1:
                if self.auto_flush_ms > 0 and torch.cuda.is_available():
                    self._stop.clear()
                    self._timer = threading.Thread(target=self._timer_loop, name="gpuos-flush-timer", daemon=True)
                    self._timer.start()
                    live = 0.0 if self.live_idle_us is None else self.live_idle_us  # (0: GPUOS_LIVE_IDLE_US or none)
                    self._live_window = _ext.sched_live_window_open(float(live))
        r = super().__enter__()
        cfront = bool(self.cfront) and _ext.sched_cfront_enter(self, self.size_threshold)
        self._cfronts.append(cfront)
        want = self.front if self.front is not None else not cfront
        front = _Front() if want and torch.cuda.is_available() else None
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
                window, self._live_window = self._live_window, 0.0
                _ext.sched_live_window_close(window)  # the last one asks the resident worker to leave
            front = self._fronts.pop() if self._fronts else None
            if front is not None:
                front.__exit__(exc_type, exc, tb)
            if self._cfronts and self._cfronts.pop():
                _ext.sched_cfront_exit()
            super().__exit__(exc_type, exc, tb)
        _log.note_runtime_events(_ext)
        err, self._timer_error = self._timer_error, None
        if err is not None and exc_type is None:
            raise err

    # ----------------------------------------------------------------- flushing
    def flush(self, cause: str = "explicit") -> None:
        """Publish deferred work (lowered, chains fused) on the stream it was recorded under: stream-ordered, no
        host sync; if the caller's current stream is another one, it is made to wait for that stream."""
        self._wait_for(_log.traced(cause, _ext.sched_flush, cause, True))  # this thread's devices only

    @staticmethod
    def _wait_for(streams) -> None:
        """The caller's current stream of each device waits for the (device, stream) pairs work went out on: an
        event on that device, never a wait across devices, no host sync."""
        if streams:
            _streams.wait_for(streams)

    def _timer_loop(self) -> None:
        period = self.auto_flush_ms / 1000.0
        try:
            while not self._stop.wait(period / 2):
                _log.traced("timer", _ext.sched_flush_due, period)
        except BaseException as e:  # noqa: BLE001 -- kept for the context's exit; the exit's flush retries the work
            self._timer_error = e

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
            if r.__class__ is not int and r.__class__ is not str:  # (inline: the per-op path; _is_reason)
                return r  # recorded: the output tensor
            return self._eager(func, args, kwargs, r)
        return self._eager(func, args, kwargs, "collective" if _collectives.kind(func) else "unsupported_op")

    _dispatch_py = __torch_dispatch__

    def _eager(self, func, args, kwargs, reason):
        """Run `func` eagerly (reason: an int from sched_ew / sched_reduce, or a str), after the deferred work it
        depends on."""
        if func in _NO_DATA:  # metadata / allocation only: reads no data, needs no flush
            return func(*args, **kwargs)
        if reason == _DTYPE_CODE and func in _DTYPE_RETRY:  # integer operands: the integer form (int64 add, casts)
            try:
                r = _DTYPE_RETRY[func](self.size_threshold, args, kwargs)
            except (TypeError, ValueError, RuntimeError) as e:
                r = "rejected:" + type(e).__name__
            if not _is_reason(r):
                return r
            reason = r
        if reason.__class__ is int:
            reason = _REASONS[reason]
        with STATS.lock:
            STATS.fallbacks[reason] += 1
            STATS.fallback_ops[func] += 1
        _log.note_fallback(func, reason)
        # An eager op (incl. host reads: .item(), .cpu(), print) that touches memory of deferred ops runs after
        # them: the batch is published first, in stream order. Eager ops on unrelated tensors run ahead and the
        # batch keeps growing. Heavy kernels and collectives get the SMs of their devices back from the worker.
        # (A host read's copy needs no SMs: a worker the live window keeps stays; yield_worker 0 / 1 / 2: never /
        # always / only while a live window keeps it resident.)
        heavy = func in _HEAVY or _collectives.kind(func) == "collective"
        yield_worker = 1 if heavy else 0 if func is _LOCAL_SCALAR else 2
        self._wait_for(_log.traced("dependency", _ext.sched_flush_for, args, kwargs, "dependency", yield_worker))
        cap = _programs.active()
        if cap is not None:  # capturing a program: the op becomes one of its eager steps
            return cap.eager(func, args, kwargs)
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
# Generated from the op table (device_src/ops.def, through gpuos_ext.op_table()): each row's aten column names the
# overloads it serves, optionally with a condition ("aten::gelu[approximate=tanh]", "aten::sum.dim_IntList[dim=-1]",
# "aten::rsub.Scalar[swap]": the two inputs exchanged). A handler maps (size_threshold, args, kwargs) to the output
# tensor (recorded) or to an int / str reason to run eagerly; checks, broadcasting, type promotion, allocation and
# recording are one C++ call. Each overload's schema says where its inputs, scalars and out= tensor are; any other
# argument must have its default value.
def _parse_aten(entry: str):
    """'aten::gelu[approximate=tanh]' -> ('aten::gelu', {'approximate': 'tanh'}); '[swap]' -> {'swap': True}."""
    name, _, cond = entry.partition("[")
    conds = {}
    for part in filter(None, cond.rstrip("]").split(",")):
        key, eq, val = part.partition("=")
        conds[key] = True if not eq else (int(val) if val.lstrip("-").isdigit() else val)
    return name, conds


def _mode_of(ov) -> int:
    packet, overload = ov._schema.name.split("::")[1], ov._overloadname
    if overload == "out" or overload.endswith("_out"):
        return _MODES["out"]
    return _MODES["inplace"] if packet.endswith("_") else _MODES["functional"]


def _conditions_hold(schema, args, kwargs, conds, sibling_keys) -> bool:
    for key in sibling_keys:  # conditions of the overload's other rows: this row wants their defaults
        want = conds.get(key, schema.args[schema.index[key]][2]) if key in schema.index else conds.get(key)
        if key in schema.index and schema.get(args, kwargs, key) != want:
            return False
    return True


def _ew_handler(row, ov, conds, sibling_keys):
    """Handler of elementwise table row `row` for overload `ov`."""
    schema, op, nin, mode = _Schema(ov), row["id"], row["arity"], _mode_of(ov)
    d = (list(row["defaults"]) + [0.0, 0.0])[:2]
    snames = [n for n in row["scalars"] if n in schema.index]
    inputs = [name for name, _, _ in schema.args[:nin]]
    swap = conds.get("swap", False)
    extra = [(name, dflt) for name, _, dflt in schema.args[nin:]
             if name not in snames and name != "out" and name not in sibling_keys]
    sched_ew = _ext.sched_ew

    def handler(thr, args, kwargs):
        if not _conditions_hold(schema, args, kwargs, conds, sibling_keys):
            return None
        for name, dflt in extra:
            if dflt is _MISSING or schema.get(args, kwargs, name) != dflt:
                return _UNSUPPORTED
        ins = tuple(schema.get(args, kwargs, name) for name in inputs)
        if any(x is None or x is _MISSING for x in ins):
            return _UNSUPPORTED
        if swap:
            ins = ins[::-1]
        v = list(d)
        for k, name in enumerate(snames):
            val = schema.get(args, kwargs, name)
            if val is None and name in ("min", "max"):
                val = float("-inf") if k == 0 else float("inf")
            elif not _number(val):
                return _UNSUPPORTED
            v[row["scalars"].index(name)] = float(val)
        return sched_ew(op, mode, ins, kwargs.get("out") if mode == _MODES["out"] else None, v[0], v[1], thr)

    # sched_dispatch's C++ fast table takes overloads whose only scalar is none or a leading `alpha`.
    fast = None
    optional_inputs = any(dflt is not _MISSING for _, _, dflt in schema.args[:nin])  # clamp.Tensor's min/max
    if not swap and not conds and not extra and not optional_inputs:
        if not snames:
            fast = (op, mode, nin, float(d[0]), float(d[1]), 0, False)
        elif snames == ["alpha"] and schema.index["alpha"] == nin:
            fast = (op, mode, nin, float(d[0]), float(d[1]), 1, False)
    return handler, fast


def _reduce_handler(row, ov, conds):
    """Handler of reduction row `row` (last dim only) for overload `ov`."""
    schema, op = _Schema(ov), row["id"]
    sched_reduce = _ext.sched_reduce
    others = [(name, dflt) for name, _, dflt in schema.args[1:] if name not in ("dim", "keepdim")]

    def handler(thr, args, kwargs):
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return _UNSUPPORTED
        to_float = False
        for name, dflt in others:  # dtype=None; half_to_float (no default) False, or True for a 16-bit input
            v = schema.get(args, kwargs, name)
            if name == "half_to_float" and v is True and x.dtype in (torch.float16, torch.bfloat16):
                to_float = True  # F.softmax(x, dtype=torch.float32) of fp16 on CUDA (HF's eager attention)
            elif v != (False if dflt is _MISSING else dflt):
                return _UNSUPPORTED
        if to_float:
            x = _ext.sched_cast(x, torch.float32, None, thr)
            if _is_reason(x):
                return x
        dim = schema.get(args, kwargs, "dim")
        dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
        if len(dims) != 1 or dims[0] not in (-1, x.dim() - 1):
            return _UNSUPPORTED
        keepdim = bool(schema.get(args, kwargs, "keepdim")) if "keepdim" in schema.index else False
        return sched_reduce(op, x, keepdim, thr)

    return handler


# sched_dispatch's fast table (C++): {overload: (op_id, mode, nin, d0, d1, scalar rule, number_ok)}; the Python
# handler of each stays the definition of its behaviour.
_FAST: dict = {}
_REDUCE_IDS: dict = {}  # {overload: op id} of the last-dim reductions (_reduce_handler's)


def _build_handlers() -> dict:
    rows_of: dict = collections.defaultdict(list)  # overload -> [(row, conditions)]
    for row in _ext.op_table():
        for entry in row["aten"]:
            name, conds = _parse_aten(entry)
            ov = _resolve_aten(name)
            if ov is not None:
                rows_of[ov].append((row, conds))
    h: dict = {}
    for ov, entries in rows_of.items():
        if entries[0][0]["kind"] == "reduce":
            h[ov] = _reduce_handler(entries[0][0], ov, entries[0][1])
            _REDUCE_IDS[ov] = entries[0][0]["id"]  # (the dispatcher front records these itself: _push_tables)
            continue
        sibling_keys = sorted({k for _, c in entries for k in c if k != "swap"})
        built = [_ew_handler(row, ov, conds, sibling_keys) for row, conds in entries]
        if len(built) == 1 and built[0][1] is not None and not sibling_keys:
            _FAST[ov] = built[0][1]
        h[ov] = _first_match([b[0] for b in built])
    return h


def _first_match(handlers):
    """One overload served by several rows (gelu / gelu_tanh): the first whose conditions hold."""
    if len(handlers) == 1:
        only = handlers[0]

        def handler(thr, args, kwargs):
            r = only(thr, args, kwargs)
            return _UNSUPPORTED if r is None else r
        return handler

    def pick(thr, args, kwargs):
        for f in handlers:
            r = f(thr, args, kwargs)
            if r is not None:
                return r
        return _UNSUPPORTED
    return pick


def _resolve_aten(name: str):
    """'aten::foo' / 'aten::foo.overload' -> the OpOverload (None if torch has no such op)."""
    if not name.startswith("aten::"):
        return None
    base, _, overload = name[len("aten::"):].partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


_BUILTIN_HANDLERS = _build_handlers()
_BUILTIN_HANDLERS.update(_decode_handlers.matmul_handlers())
_BUILTIN_HANDLERS.update(_attention.handlers())
_BUILTIN_HANDLERS.update(_decode_handlers.cast_handlers())
_BUILTIN_HANDLERS.update(_decode_handlers.layer_norm_handler())
_BUILTIN_HANDLERS.update(_data_handlers.handlers())  # embedding, index_copy_, argmax, where, arange, ... (kind 4)
_BUILTIN_HANDLERS.update(_int_handlers.compare_handlers())  # lt / le / ... -> bool masks
_DTYPE_RETRY = _int_handlers.int_handlers()  # integer forms, tried after the float handler's 'dtype' refusal
_HANDLERS = dict(_BUILTIN_HANDLERS)
_USER_KEYS: set = set()


def _user_handler(op_id: int, arity: int):
    """Handler of a registered op mapped to an aten op: recorded through the same deferral as the table's ops."""
    sched_ew = _ext.sched_ew

    def handler(thr, args, kwargs):
        if len(args) != arity or kwargs:
            return _UNSUPPORTED
        return sched_ew(op_id, _MODES["functional"], tuple(args), None, 0.0, 0.0, thr)
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
    _push_tables()


def _push_tables() -> None:
    """The C++ dispatch's tables (sched/dispatch.cpp): the fast overloads and the front's callables no user handler
    took, and the no-data overloads no handler took."""
    _ext.sched_set_fast({ov: spec for ov, spec in _FAST.items() if ov not in _USER_KEYS})
    _ext.sched_set_front(_front_table(), GpuosScheduler)
    _ext.sched_set_nodata([ov for ov in _NO_DATA if ov not in _HANDLERS], _FRONT_VIEWS)
    _ext.sched_set_cfront_native([ov for ov in _CFRONT_NATIVE if ov not in _USER_KEYS],
                                 {ov: op for ov, op in _REDUCE_IDS.items() if ov not in _USER_KEYS})


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


_push_tables()


def scheduler_context(capacity: int = 8192, threads_per_block: int = 256, size_threshold: int = 1 << 15,
                      auto_flush_ms: float = 2.0, front: bool | None = None, cfront: bool = True,
                      live_idle_us: float | None = None) -> GpuosScheduler:
    """Context manager: ``with gpuos.scheduler_context(): ...`` batches supported small ops (see module doc)."""
    return GpuosScheduler(capacity=capacity, threads_per_block=threads_per_block, size_threshold=size_threshold,
                          auto_flush_ms=auto_flush_ms, front=front, cfront=cfront, live_idle_us=live_idle_us)


def scheduler_stats() -> dict:
    return STATS.as_dict()


def intercepted_ops() -> list[str]:
    """The aten overloads the scheduler can batch."""
    return sorted(str(k) for k in _HANDLERS)


__all__ = ["GpuosScheduler", "intercepted_ops", "scheduler_context", "scheduler_stats"]

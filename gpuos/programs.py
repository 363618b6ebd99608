"""Programs: record a step once, replay it from the persistent worker without Python per op (issue #17).

    prog = gpuos.capture(step, x, pos)      # runs step once under the scheduler, keeps what it recorded
    y = prog(x2, pos2)                      # replays: inputs bound by pointer, no Python per op
    fast = gpuos.wrap(step)                 # captures per input signature on first use, replays after

What a capture keeps (``gpuos_ext.Tape``, csrc/core/tape.h): every sub-op the runtime staged while ``fn`` ran --
descriptor, tensor references, iteration space, dependency footprints -- after the scheduler's lowering and fusion.
A replay publishes the segment's staged image (descriptors in level order and tensor references, resident on the
GPU since its first replay) with the data pointers that moved rewritten: one flush per segment, the worker walks the levels on
the device. A call with positional tensors only and one segment is served in C++ (``gpuos_ext.ProgramCall``:
guards, output buffers, replay), with no Python per tensor. Memory:

* **inputs** (tensors among the arguments) are bound by pointer: a tape pointer inside an input's byte span at
  capture moves to the same place in the new input (no copy). Guards: same pytree structure, shapes, strides,
  dtypes and devices, the same 16-byte alignment (vector and tensor-core paths were chosen for it), the same
  overlap pattern between inputs, equal non-tensor arguments.
* **parameters, buffers and other state** that existed before the capture are read and written in place (a KV
  cache updated with ``index_copy_`` is updated by every replay).
* **intermediates** live in storages the program keeps alive (its arena, ``info()["arena_bytes"]``), reused by
  every replay (replays on one stream are ordered; do not overlap replays of one program on two streams).
* **outputs** get new buffers on every call, never overwritten by a later call: an output the scheduler or an
  eager op allocated during the capture is moved to a new buffer; any other output (a view of state, a buffer
  ``fn`` allocated itself) is copied at the end of the step into a buffer the program allocates.

Ops the worker cannot run (the scheduler's eager fallbacks) split the program into **segments**: a replay
publishes the segment before such an op, runs the op (a Python call, its tensors moved like the tape's) and
goes on. ``info()`` lists them. Host reads during the capture (``.item()``, ``.tolist()``, ``.cpu()``, printing a
tensor, ``nonzero``) raise ``CaptureError`` naming the op: their values would be frozen into the program.

Like CUDA graphs, a program replays what ``fn`` did on the GPU, not its Python: control flow that depended on
values (shapes are guarded) is frozen; state ``fn`` creates lazily on its first call is created again by every
replay -- call ``fn`` once before capturing (Hugging Face caches allocate on their first update).
"""
from __future__ import annotations

import collections
import threading
import time

import torch
from torch.utils import _pytree as pytree

import gpuos_ext as _ext

from . import _collectives
from ._handler_base import HEAVY as _HEAVY

aten = torch.ops.aten


class CaptureError(_ext.GpuosError):
    """An op that cannot be part of a program was met while capturing (a host read, another capture, ...)."""


class GuardError(_ext.GpuosError):
    """A program was called with inputs unlike those it was captured with (shape, stride, dtype, device, ...)."""


# Host reads: their value would be frozen into the program.
_HOST_READS = {aten._local_scalar_dense.default, aten.item.default, aten.equal.default, aten.is_nonzero.default,
               aten.nonzero.default, aten.allclose.default}
_state = threading.local()
# Ops with more output elements than this run eagerly while capturing (the scheduler's size rule; capture() and
# wrap() without a size_threshold use it). Higher than the live scheduler's 2**15: an eager op splits a program
# into segments, a host round trip each (eleventh session, H100: HF Llama-small's static decode step in 5 segments
# for its repeat_kv clones, 823 us; in one, with the clones spread over 128 warps, 772 us).
DEFAULT_SIZE_THRESHOLD = 1 << 22


def active():
    """The capture running on this thread, or None (scheduler._eager asks)."""
    return getattr(_state, "capture", None)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[lo, hi) bytes the view can touch."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    ext = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return lo, lo + (ext + 1) * t.element_size()


def _extent(t: torch.Tensor) -> int:
    lo, hi = _span(t)
    return hi - lo


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def _rebind(t: torch.Tensor, base: torch.Tensor, delta: int) -> torch.Tensor:
    """A view like `t` (captured) at t.data_ptr() + delta, in base's storage."""
    st = base.untyped_storage()
    off = t.data_ptr() + delta - st.data_ptr()
    if off % t.element_size():
        raise GuardError(f"gpuos program: a tensor moved by {delta} bytes is not aligned to its {t.dtype} elements")
    return torch.empty(0, dtype=t.dtype, device=base.device).set_(st, off // t.element_size(), t.shape, t.stride())


class _Ranges:
    """Byte ranges that move at replay: (lo, hi, kind, key). Lookup of a captured tensor's range id by address."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, str, object]] = []

    def add(self, lo: int, hi: int, kind: str, key) -> int:
        self.rows.append((lo, hi, kind, key))
        return len(self.rows) - 1

    def find(self, t: torch.Tensor) -> int:
        if not t.is_cuda:
            return -1
        p = t.data_ptr()
        for i in range(len(self.rows) - 1, -1, -1):  # latest first (a fallback result may reuse a freed range)
            lo, hi, _, _ = self.rows[i]
            if lo <= p < hi or (p == lo == hi):
                return i
        return -1


class _Capture:
    """State of one capture (this thread): segments, eager steps, the ranges that move."""

    def __init__(self, dev: int, inputs: list) -> None:
        self.dev = dev
        # ("seg", begin, end) | ("eager", func, treespec, arg_spec, out_rows, collective, heavy)
        self.steps: list = []
        self.last = 0                # tape entries before the last eager step
        self.ranges = _Ranges()
        self.fallbacks: list[str] = []
        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor) and t.is_cuda:
                lo, hi = _span(t)
                self.ranges.add(lo, hi, "input", i)

    def _spec(self, x):
        if isinstance(x, torch.Tensor):
            return ("t", x, self.ranges.find(x))
        return ("v", x)

    def eager(self, func, args, kwargs):
        """Run an eager fallback during the capture (its dependencies are published) and record it as a step."""
        name = str(func)
        if func in _HOST_READS:
            raise CaptureError(f"gpuos.capture: {name} reads a GPU value on the host while capturing; the program "
                               "would freeze that value. Fix: keep the value on the GPU (torch.where instead of "
                               "if, tensor indices instead of ints), or compute it outside the captured function.")
        mark = _ext._capture_mark(self.dev)
        if mark > self.last:
            self.steps.append(("seg", self.last, mark))
            self.last = mark
        flat, spec = pytree.tree_flatten((args, kwargs))
        arg_spec = [self._spec(x) for x in flat]
        r = func(*args, **kwargs)
        outs, _ = pytree.tree_flatten(r)
        cuda_in = any(isinstance(x, torch.Tensor) and x.is_cuda for x in flat)
        if cuda_in and any(isinstance(o, torch.Tensor) and not o.is_cuda for o in outs):
            raise CaptureError(f"gpuos.capture: {name} copies GPU data to the host while capturing (.cpu(), "
                               ".tolist(), printing a tensor); the program would freeze it. Fix: keep it on the GPU "
                               "or read it outside the captured function.")
        arg_storages = {_storage_range(x)[0] for x in flat if isinstance(x, torch.Tensor) and x.is_cuda}
        out_rows = []
        for k, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and o.is_cuda:
                lo, hi = _storage_range(o)
                if lo not in arg_storages:  # a new storage (not in place, not a view of an argument)
                    out_rows.append((k, self.ranges.add(lo, hi, "eager", (len(self.steps), k)), o))
        self.steps.append(("eager", func, spec, arg_spec, out_rows, _collectives.kind(func) == "collective",
                           func in _HEAVY))
        self.fallbacks.append(name)
        return r


def _raw_meta(t: torch.Tensor):
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def _guard_meta(t: torch.Tensor):
    """What a replay's input must share with the capture's: shape, strides (of dims longer than 1: the others
    never move an address), dtype, device, 16-byte alignment."""
    st = tuple(s if n != 1 else 0 for n, s in zip(t.shape, t.stride()))
    return (tuple(t.shape), st, t.dtype, t.device, t.data_ptr() % 16)


class Program:
    """A captured step (see the module docstring): ``prog(*args, **kwargs)`` replays it; ``info()`` describes it."""

    def __init__(self, fn, args, kwargs, size_threshold: int | None = None) -> None:
        from .scheduler import scheduler_context

        if not torch.cuda.is_available():
            raise CaptureError("gpuos.capture needs a CUDA GPU (programs run on the GPUOS worker).")
        self.fn = fn
        flat, self._spec = pytree.tree_flatten((args, kwargs))
        devs = {x.device.index for x in flat if isinstance(x, torch.Tensor) and x.is_cuda}
        if len(devs) > 1:
            raise CaptureError(f"gpuos.capture: inputs on several devices ({sorted(devs)}); a program runs on one "
                               "device. Fix: capture one program per device.")
        self.device = devs.pop() if devs else torch.cuda.current_device()
        self._dev = torch.device("cuda", self.device)
        self._guards = [_guard_meta(x) if isinstance(x, torch.Tensor) else ("v", type(x), x) for x in flat]
        self._raw = [_raw_meta(x) if isinstance(x, torch.Tensor) else None for x in flat]  # the fast compare
        # byte extent of each CUDA input (equal shapes and strides: equal extents)
        self._ext = [_extent(x) if isinstance(x, torch.Tensor) and x.is_cuda else None for x in flat]
        self._overlaps = self._overlap_pattern(flat)
        if active() is not None:
            raise CaptureError("gpuos.capture: captures do not nest. Fix: capture the outer function only.")
        t0 = time.perf_counter()
        cap = _Capture(self.device, flat)
        with torch.cuda.device(self.device):
            thr = DEFAULT_SIZE_THRESHOLD if size_threshold is None else size_threshold
            ctx = scheduler_context(size_threshold=thr, auto_flush_ms=0)
            ctx.__enter__()  # starts the runtime if needed (capture_begin needs it)
            try:
                _ext._capture_begin(self.device)
                _state.capture = cap
                try:
                    result = fn(*args, **kwargs)
                    ctx.flush("capture")  # lowered: the scheduler's output buffers are known (fresh)
                    result = self._own_outputs(result, cap)
                finally:
                    _state.capture = None
                    ctx.__exit__(None, None, None)  # publishes what is deferred (taped)
            finally:
                tape = _ext._capture_end(self.device)
        end = tape.entries
        if end > cap.last:
            cap.steps.append(("seg", cap.last, end))
        self.tape = tape
        self.steps = cap.steps
        self.fallbacks = cap.fallbacks
        self.capture_s = time.perf_counter() - t0
        self.first_result = result
        self._plan_outputs(result, cap, tape)
        self.calls = 0

    # ------------------------------------------------------------------ capture helpers
    @staticmethod
    def _pairs(spans):
        """Pairs (i, j) of inputs whose byte spans [lo, hi) overlap; spans: [(lo, hi, i)] (a sorted sweep)."""
        spans = sorted(spans)
        pairs = []
        for a in range(len(spans)):
            lo, hi, i = spans[a]
            for b in range(a + 1, len(spans)):
                lo2, hi2, j = spans[b]
                if lo2 >= hi:
                    break
                if lo < hi and lo2 < hi2:  # an empty span overlaps nothing
                    pairs.append((min(i, j), max(i, j)))
        return frozenset(pairs)

    @classmethod
    def _overlap_pattern(cls, flat):
        return cls._pairs([(*_span(x), i) for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.is_cuda])

    def _own_outputs(self, result, cap):
        """Outputs in storages the capture did not allocate are copied (inside the capture, so the copy is part of
        the program) into buffers it did; returns the structure with those copies."""
        flat, spec = pytree.tree_flatten(result)
        self._copied = set()
        fresh = {lo for lo, _ in _ext._capture_fresh(self.device)}
        eager = {row[0] for row in cap.ranges.rows if row[2] == "eager"}
        inputs = [row for row in cap.ranges.rows if row[2] == "input"]
        out = []
        for k, o in enumerate(flat):
            if isinstance(o, torch.Tensor) and o.is_cuda:
                base = _storage_range(o)[0]
                in_input = any(lo <= o.data_ptr() < hi for lo, hi, _, _ in inputs)
                if base not in fresh and base not in eager and not in_input:
                    dst = torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
                    dst.copy_(o)  # inside the capture's mode: recorded (or an eager step)
                    self._copied.add(k)
                    o = dst
            out.append(o)
        return pytree.tree_unflatten(out, spec)

    def _plan_outputs(self, result, cap, tape):
        """Each output: a non-tensor (returned as is), a view of an input or eager result (moved with it), or a
        view of a storage the capture allocated (a new buffer per call: a "fresh" range). Eager steps whose
        tensors lie in a fresh range are bound to it too."""
        flat, self._out_spec = pytree.tree_flatten(result)
        self._out_plan = []
        rows = cap.ranges
        fresh_rows = {}
        for o in flat:
            if not (isinstance(o, torch.Tensor) and o.is_cuda):
                self._out_plan.append(("v", o))
                continue
            r = rows.find(o)
            if r < 0:
                lo, hi = _storage_range(o)
                r = fresh_rows.get(lo)
                if r is None:
                    r = fresh_rows[lo] = rows.add(lo, hi, "fresh", lo)
            self._out_plan.append(("t", o, r))
        for i, st in enumerate(self.steps):
            if st[0] == "eager" and fresh_rows:
                st[3][:] = [("t", a[1], rows.find(a[1])) if a[0] == "t" and a[2] < 0 else a for a in st[3]]
        self._rows = rows.rows
        # Per call: a new buffer per fresh range. An output that is exactly its storage (offset 0, dense) is
        # allocated as itself (no view to build); others get a byte buffer and a view.
        self._fresh = []
        for r in fresh_rows.values():
            lo, hi = rows.rows[r][0], rows.rows[r][1]
            direct = None
            for k, p in enumerate(self._out_plan):
                o = p[1] if p[0] == "t" and p[2] == r else None
                if o is not None and o.storage_offset() == 0 and _span(o) == (lo, hi) and \
                        o.numel() * o.element_size() == hi - lo:  # dense: every byte of the storage once
                    direct = (tuple(o.shape), o.stride(), o.dtype)
                    self._out_plan[k] = ("b", o, r)
                    break
            self._fresh.append((r, lo, hi, direct))
        self._inputs = [(r, key, lo, hi) for r, (lo, hi, kind, key) in enumerate(rows.rows) if kind == "input"]
        self._fast = self._fast_call(flat)

    def _fast_call(self, outs):
        """The call in C++ (``gpuos_ext.ProgramCall``) when nothing needs Python per call: positional CUDA tensors
        on the program's device only, one segment, no aliasing between the inputs, a result that is one tensor
        or a tuple. None otherwise (``_run`` serves every call)."""
        n = len(self._raw)
        if len(self.steps) != 1 or self.steps[0][0] != "seg" or self._overlaps or n == 0:
            return None
        if self._spec != pytree.tree_flatten((tuple(range(n)), {}))[1]:
            return None  # keyword or nested arguments
        span = {key: (lo, hi) for _, key, lo, hi in self._inputs}
        ins = []
        for i, r in enumerate(self._raw):
            if r is None or r[3] != self._dev or i not in span:
                return None
            ins.append((list(r[0]), list(r[1]), r[2], r[4], *span[i]))
        single = self._out_spec == pytree.tree_flatten(outs[0] if outs else None)[1] and len(outs) == 1
        if not single and self._out_spec != pytree.tree_flatten(tuple(range(len(outs))))[1]:
            return None
        fresh_idx = {r: k for k, (r, _, _, _) in enumerate(self._fresh)}
        fresh = [(lo, hi, direct) for _, lo, hi, direct in self._fresh]
        plan = []
        for p in self._out_plan:
            if p[0] == "v":
                plan.append((0, 0, p[1], 0, [], [], torch.float32))
                continue
            o, r = p[1], p[2]
            kind, key = self._rows[r][2], self._rows[r][3]
            if p[0] == "b":
                plan.append((2, fresh_idx[r], None, 0, [], [], o.dtype))
            elif kind == "input":
                plan.append((1, key, None, o.data_ptr(), list(o.shape), list(o.stride()), o.dtype))
            elif kind == "fresh":
                plan.append((3, fresh_idx[r], None, o.data_ptr(), list(o.shape), list(o.stride()), o.dtype))
            else:
                return None
        return _ext.ProgramCall(self.tape, self.steps[0][1], self.steps[0][2], ins, fresh, plan, single)

    # ------------------------------------------------------------------ replay
    def _check(self, flat, spec):
        """The guards (GuardError on a mismatch). The fast path compares each tensor's raw metadata with the
        capture's; only a difference is looked at in detail (strides of size-1 dims may differ)."""
        if spec != self._spec or len(flat) != len(self._guards):
            raise GuardError("gpuos program: called with a different argument structure than it was captured with. "
                             "Fix: call it like the capture, or use gpuos.wrap (one program per signature).")
        spans = []
        for i, x in enumerate(flat):
            r = self._raw[i]
            if r is not None and isinstance(x, torch.Tensor):
                p = x.data_ptr()
                if x.shape != r[0] or x.stride() != r[1] or x.dtype != r[2] or x.device != r[3] or (p & 15) != r[4]:
                    self._check_tensor(i, x)
                if self._ext[i] is not None:
                    spans.append((p, p + self._ext[i], i))
                continue
            g = self._guards[i]
            if isinstance(x, torch.Tensor) or g[0] != "v" or type(x) is not g[1] or x != g[2]:
                raise GuardError(f"gpuos program: argument {i} is {x!r}, captured as "
                                 f"{g[2] if g[0] == 'v' else 'a tensor'!r}: non-tensor arguments are part of the "
                                 "program. Fix: capture again, or use gpuos.wrap.")
        if len(spans) > 1 and self._pairs(spans) != self._overlaps:
            raise GuardError("gpuos program: inputs overlap in memory differently than at capture. Fix: pass "
                             "distinct tensors (or the same aliasing as at capture).")

    def _check_tensor(self, i, x):
        g = self._guards[i]
        m = _guard_meta(x)
        if m != g:
            raise GuardError(f"gpuos program: argument {i} is {tuple(x.shape)} {x.dtype} strides "
                             f"{x.stride()} on {x.device} (address mod 16 = {m[4]}), captured as {g[0]} "
                             f"{g[2]} strides {g[1]} on {g[3]} (mod 16 = {g[4]}). Fix: capture again "
                             "for these inputs, or use gpuos.wrap.")

    def _call_fast(self, args, kwargs):
        """The call through gpuos_ext.ProgramCall, or None when the program has none or a guard differs (then
        ``_run`` explains it, or accepts size-1 dims' strides)."""
        if self._fast is None or kwargs:
            return None
        r = self._fast(*args)
        if r is not None:
            self.calls += 1
        return r

    def __call__(self, *args, **kwargs):
        r = self._call_fast(args, kwargs)
        if r is not None:
            return r
        flat, spec = pytree.tree_flatten((args, kwargs))
        return self._run(flat, spec)

    def _run(self, flat, spec):
        self._check(flat, spec)
        rows = self._rows
        moved = {}  # row id -> (delta, a tensor in the new storage)
        reloc = []
        for r, key, lo, hi in self._inputs:
            x = flat[key]
            d = x.data_ptr() - lo
            moved[r] = (d, x)
            reloc.append((lo, hi, d))
        dev = self._dev
        for r, lo, hi, direct in self._fresh:
            b = torch.empty_strided(direct[0], direct[1], dtype=direct[2], device=dev) if direct is not None else \
                torch.empty(hi - lo, dtype=torch.uint8, device=dev)
            moved[r] = (b.data_ptr() - lo, b)
            reloc.append((lo, hi, b.data_ptr() - lo))
        if self._overlaps:  # inputs that overlapped at capture: their equal moves merge into one range
            reloc = self._merge(reloc)
        steps = self.steps
        if len(steps) == 1 and steps[0][0] == "seg" and torch.cuda.current_device() == self.device:
            self.tape.replay(steps[0][1], steps[0][2], reloc)  # the common case: one segment, no eager step
        else:
            with torch.cuda.device(self.device):
                for st in steps:
                    if st[0] == "seg":
                        self.tape.replay(st[1], st[2], reloc)
                        continue
                    _, func, aspec, arg_spec, out_rows, collective, heavy = st
                    vals = [self._arg(a, moved) for a in arg_spec]
                    a, kw = pytree.tree_unflatten(vals, aspec)
                    if collective or heavy:  # as the scheduler did at capture: the worker gives its SMs back
                        _ext.yield_worker(self.device)  # (NCCL kernels of one rank wait for their peers, DESIGN F7)
                    res = func(*a, **kw)
                    outs, _ = pytree.tree_flatten(res)
                    if collective:  # the caller waited at capture (dist.all_reduce: work.wait()): the stream
                        _collectives.wait_works(outs)  # waits for the collective before the next segment reads
                    for k, row, o in out_rows:
                        n = outs[k]
                        d = n.data_ptr() - o.data_ptr()
                        moved[row] = (d, n)
                        reloc = self._merge(reloc + [(rows[row][0], rows[row][1], d)],
                                            replace=(rows[row][0], rows[row][1]))
        self.calls += 1
        out = []
        for p in self._out_plan:
            if p[0] == "v":
                out.append(p[1])
            elif p[0] == "b":
                out.append(moved[p[2]][1])
            else:
                d, base = moved[p[2]]
                out.append(_rebind(p[1], base, d))
        return pytree.tree_unflatten(out, self._out_spec)

    @staticmethod
    def _arg(a, moved):
        if a[0] == "v":
            return a[1]
        t, row = a[1], a[2]
        if row < 0 or row not in moved:
            return t
        d, base = moved[row]
        return t if d == 0 and base.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() else \
            _rebind(t, base, d)

    @staticmethod
    def _merge(reloc, replace=None):
        """Non-overlapping (lo, hi, delta) rows: equal deltas merge; a range that replaces an older one (a new
        eager result in a range an older one had) wins; otherwise an overlap is an error."""
        if replace is not None:
            lo, hi = replace
            keep = [r for r in reloc[:-1] if r[1] <= lo or r[0] >= hi]
            reloc = keep + [reloc[-1]]
        reloc = sorted(r for r in reloc if r[1] > r[0])
        out = []
        for lo, hi, d in reloc:
            if out and lo < out[-1][1]:
                plo, phi, pd = out[-1]
                if pd != d:
                    raise GuardError("gpuos program: two inputs that overlapped at capture moved by different "
                                     "amounts. Fix: pass them with the same aliasing as at capture.")
                out[-1] = (plo, max(phi, hi), pd)
            else:
                out.append((lo, hi, d))
        return out

    # ------------------------------------------------------------------ description
    def info(self) -> dict:
        segs = [s for s in self.steps if s[0] == "seg"]
        return {
            "device": self.device,
            "entries": self.tape.entries,
            "tiles": sum(self.tape.tiles(s[1], s[2]) for s in segs),
            "segments": len(segs),
            "levels": [self.tape.levels(s[1], s[2]) for s in segs],
            "fallbacks": list(self.fallbacks),
            "arena_bytes": self.tape.held_bytes,
            "image_bytes": self.tape.image_bytes,  # resident replay images (made by the first call of a segment)
            "homes": self.tape.homes,  # per segment image, per level piece: (descriptors, first home block, blocks)
            "outputs_copied": len(self._copied),
            "capture_s": self.capture_s,
            "calls": self.calls,
            "fast_call": self._fast is not None,  # calls go through gpuos_ext.ProgramCall (no Python per tensor)
        }

    def __repr__(self) -> str:
        i = self.info()
        return (f"<gpuos.Program of {getattr(self.fn, '__name__', self.fn)!s}: {i['entries']} sub-ops, "
                f"{i['segments']} segment(s), {sum(i['levels'])} levels, {len(i['fallbacks'])} eager op(s)>")


def capture(fn, *args, **kwargs) -> Program:
    """Run ``fn(*args, **kwargs)`` once under the scheduler and keep what it recorded as a :class:`Program`
    (its results of this run: ``prog.first_result``). See the module docstring for what is bound how."""
    return Program(fn, args, kwargs)


def _signature(flat, spec):
    key = [spec]
    for x in flat:
        if isinstance(x, torch.Tensor):
            key.append(_raw_meta(x))  # raw strides: a size-1 dim's stride may split a signature, never merge two
        else:
            try:
                hash(x)
                key.append(("v", type(x), x))
            except TypeError:
                key.append(("id", id(x)))
    return tuple(key)


class Wrapped:
    """``gpuos.wrap(fn)``: a program per input signature (shapes, strides, dtypes, devices, alignment, non-tensor
    values), captured on the first call with it (that call returns the capture's results), replayed after; at
    most ``cache_size`` programs, least recently used dropped."""

    def __init__(self, fn, cache_size: int = 8, size_threshold: int | None = None) -> None:
        self.fn = fn
        self.cache_size = max(1, int(cache_size))
        self.size_threshold = size_threshold
        self.programs: collections.OrderedDict = collections.OrderedDict()
        self.captures = 0
        self._last = None  # the program of the last call (tried first, in C++)
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        # The C++ call's guards are the signature's tensor fields: a hit is the last call's program.
        r = self._last._call_fast(args, kwargs) if self._last is not None else None
        if r is not None:
            return r
        flat, spec = pytree.tree_flatten((args, kwargs))
        key = _signature(flat, spec)
        prog = self.programs.get(key)
        if prog is not None:
            self.programs.move_to_end(key)
            self._last = prog
            # Its C++ call first, as for the last call's program: a loop over several signatures (W6's 16 sizes)
            # missed the last program on every call and took the Python replay path (~60 us of host per call).
            r = prog._call_fast(args, kwargs)
            return r if r is not None else prog._run(flat, spec)
        prog = Program(self.fn, args, kwargs, self.size_threshold)
        self.captures += 1
        self.programs[key] = prog
        self._last = prog
        while len(self.programs) > self.cache_size:
            self.programs.popitem(last=False)
        return prog.first_result

    def info(self) -> dict:
        return {"captures": self.captures, "cached": len(self.programs),
                "programs": [p.info() for p in self.programs.values()]}

    def cache_clear(self) -> None:
        self.programs.clear()
        self._last = None


def wrap(fn=None, *, cache_size: int = 8, size_threshold: int | None = None):
    """``gpuos.wrap(fn)`` or ``@gpuos.wrap(cache_size=4)``: see :class:`Wrapped`."""
    if fn is None:
        return lambda f: Wrapped(f, cache_size, size_threshold)
    return Wrapped(fn, cache_size, size_threshold)

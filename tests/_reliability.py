"""Reliability engine (not a test module): the soak, the stress and the flush-drift measurement, shared by
tests/test_gpu_stress.py and tools/reliability_run.py.

* ``soak(n_ops, seed)``: random op chains (10-50 ops each) over the op table's aten overloads -- functional,
  Tensor-Scalar, in-place and ``out=`` forms, broadcasts, transposed / stepped / sliced / expanded inputs, 0-d and
  numel-0 tensors, fp32 / fp16 / bf16 and int32, last-dim reductions, plus foreign ops (where, casts, cumsum,
  matmul, views, host reads) that make the scheduler flush for dependencies. Each chain is generated and run
  eagerly first (an op eager rejects is dropped), then replayed under ``gpuos.scheduler_context(auto_flush_ms=0)``
  on the same inputs; every live tensor at the end is compared. Values are kept well conditioned by construction
  (interval bounds per tensor; domain guards -- themselves ops -- before log / sqrt / div / pow / exp; magnitudes
  <= 64), so ulp-level differences cannot grow into false mismatches. A chain outside the quick tolerance is
  replayed in float64: it counts as a mismatch only if gpuos is more than 4x further from the float64 answer than
  eager is (else it is "drift", reported separately), or if NaN/inf patterns, shapes or dtypes differ, or if the
  replay raised where eager did not.
* ``stress(seconds, threads, seed)``: threads mixing scheduler contexts, explicit submits and flushes, rejected
  calls, exceptions inside contexts, synchronize / empty_cache, GEMMs and other foreign kernels, hot chains
  (tier-2 code), an injected op with switch / rollback; every blocking call has a bound and a monitor thread
  records a hang as soon as one is exceeded; at the end the runtime must still work, shut down and init again.
* ``flush_drift(n_flushes)``: host RSS and ``torch.cuda.memory_allocated()`` across many flushes after a warm-up.

Each also runs in a child process: ``python tests/_reliability.py {soak,stress,drift} ...`` prints progress and one
``GPUOS_RESULT {json}`` line (``run_child`` runs it and parses that line), so a wedge becomes a failed child, never
a hung caller. Importable without a GPU.
"""
from __future__ import annotations

import contextlib
import faulthandler
import gc
import itertools
import json
import math
import operator
import os
import random
import sys
import threading
import time
import traceback

import torch
import torch.nn.functional as F

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
RESULT_TAG = "GPUOS_RESULT "

aten = torch.ops.aten
T = torch.Tensor
F32, F16, BF16, I32 = torch.float32, torch.float16, torch.bfloat16, torch.int32
FLOATS = (F32, F16, BF16)

LIMIT = 64.0        # every float value stays within +-LIMIT (fp16 products stay finite, exp inputs small)
MAX_SLOTS = 10      # live tensors of a chain (older results are dropped: dead intermediates, fusion)
POOL_N = 1 << 20    # elements of each input pool (uniform in [-2, 2]; int32 in [-8, 8])
#: quick check, per dtype (rtol, atol): loose enough for rounding that propagates through a chain; a chain outside
#: it is judged against float64 (see _judge)
QUICK_TOL = {F32: (1e-4, 1e-4), F16: (1e-2, 1e-2), BF16: (4e-2, 4e-2), torch.float64: (1e-9, 1e-9)}
_EPS = {F32: 2.0 ** -23, F16: 2.0 ** -10, BF16: 2.0 ** -7, torch.float64: 2.0 ** -52}
DRIFT_FACTOR = 4.0  # gpuos may be at most this many times further from float64 than eager (plus a few ulps)


def timeout_s() -> float:
    """The runtime's bound of every GPU wait (GPUOS_TIMEOUT_S, default 60)."""
    try:
        return float(os.environ.get("GPUOS_TIMEOUT_S", "60"))
    except ValueError:
        return 60.0


def _now() -> float:
    return time.monotonic()


def _meta(t) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(t)
    dt = str(t.dtype).replace("torch.", "")
    return f"{dt}{list(t.shape)} st{list(t.stride())}" + ("" if t.is_contiguous() else " nc")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ================================================================================================ intervals
def _s2(a, b):
    return (a, b) if a <= b else (b, a)


def _mono(f):
    return lambda iv: _s2(f(iv[0]), f(iv[1]))


def _mag(iv) -> float:
    return max(abs(iv[0]), abs(iv[1]))


def _add_iv(a, b):
    return (a[0] + b[0], a[1] + b[1])


def _scale_iv(a, c):
    return _s2(a[0] * c, a[1] * c)


def _mul_iv(a, b):
    p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return (min(p), max(p))


def _div_iv(a, b):  # b excludes zero (a guard made it so)
    return _mul_iv(a, _s2(1.0 / b[0], 1.0 / b[1]))


def _abs_iv(iv):
    lo, hi = iv
    if lo >= 0:
        return iv
    if hi <= 0:
        return (-hi, -lo)
    return (0.0, max(-lo, hi))


def _sq_iv(iv):
    a = _abs_iv(iv)
    return (a[0] * a[0], a[1] * a[1])


def _pow_iv(b, e):  # b > 0: monotone in each argument, extremes at the corners
    p = [x ** y for x in b for y in e]
    return (min(p), max(p))


def _exp(v):
    return math.exp(min(v, 700.0))


def _sig(v):
    return 1.0 / (1.0 + _exp(-v))


def _softplus(beta, thr):
    return lambda v: v if beta * v > thr else math.log1p(_exp(beta * v)) / beta


def _elu(alpha):
    return lambda v: v if v > 0 else alpha * (_exp(v) - 1.0)


def _clip(lo, hi):
    return lambda v: min(max(v, lo), hi)


# requirements on an input's interval: ("pos", m): >= m; ("nz", m): |x| >= m; ("bound", c): |x| <= c;
# ("posb", m, c): m <= x <= c
POS = ("pos", 0.25)
NZ = ("nz", 0.25)
B4 = ("bound", 4.0)
B2 = ("bound", 2.0)
POSB = ("posb", 0.25, 8.0)


def _meets(iv, req) -> bool:
    k = req[0]
    if k == "pos":
        return iv[0] >= req[1]
    if k == "nz":
        return iv[0] >= req[1] or iv[1] <= -req[1]
    if k == "bound":
        return _mag(iv) <= req[1]
    return iv[0] >= req[1] and iv[1] <= req[2]


# ================================================================================================ the op catalog
# Each factory takes the chain's random.Random and returns (label, functional callables, in-place callable or None,
# out= callable or None, interval function, requirements per input). Callables take tensors only: scalars are
# bound in closures. The labels name the aten overload family the call reaches.
def _std_unary(name, f=None, req=None, ivf=None):
    tf, tm, ti = getattr(torch, name), getattr(T, name), getattr(T, name + "_")
    ivf = ivf or _mono(f)
    return lambda r: (name, [tf, tm], ti, lambda x, o: tf(x, out=o), ivf, (req,))


def _unary_factories():
    fs = []

    def add(w, fac):
        fs.append((w, fac))

    add(2, lambda r: ("neg", [torch.neg, operator.neg, T.neg], T.neg_, lambda x, o: torch.neg(x, out=o),
                      lambda iv: (-iv[1], -iv[0]), (None,)))
    add(2, _std_unary("reciprocal", lambda v: 1.0 / v, NZ))
    add(2, lambda r: ("abs", [torch.abs, T.abs, operator.abs], T.abs_, lambda x, o: torch.abs(x, out=o), _abs_iv,
                      (None,)))
    add(3, lambda r: ("relu", [torch.relu, F.relu, T.relu],
                      r.choice([T.relu_, lambda x: F.relu(x, inplace=True), torch.relu_]), None,
                      lambda iv: (max(iv[0], 0.0), max(iv[1], 0.0)), (None,)))
    add(2, _std_unary("sigmoid", _sig))
    add(2, _std_unary("tanh", math.tanh))
    add(2, _std_unary("exp", _exp, B4))
    add(2, _std_unary("log", math.log, POS))
    add(2, _std_unary("sqrt", math.sqrt, POS))
    add(2, _std_unary("rsqrt", lambda v: 1.0 / math.sqrt(v), POS))
    add(1, _std_unary("erf", math.erf))
    # sin / cos of large arguments turn one input ulp into a large output error: |x| <= 4
    add(1, _std_unary("sin", req=B4, ivf=lambda iv: (-1.0, 1.0)))
    add(1, _std_unary("cos", req=B4, ivf=lambda iv: (-1.0, 1.0)))
    add(2, lambda r: ("silu", [F.silu], lambda x: F.silu(x, inplace=True), lambda x, o: aten.silu.out(x, out=o),
                      lambda iv: (-0.28, max(iv[1], 0.0)), (None,)))
    add(2, lambda r: ("gelu", [F.gelu, lambda x: F.gelu(x, approximate="none")], aten.gelu_,
                      lambda x, o: aten.gelu.out(x, out=o), lambda iv: (-0.17, max(iv[1], 0.0)), (None,)))
    add(1, lambda r: ("gelu_tanh", [lambda x: F.gelu(x, approximate="tanh")],
                      lambda x: aten.gelu_(x, approximate="tanh"),
                      lambda x, o: aten.gelu.out(x, approximate="tanh", out=o),
                      lambda iv: (-0.17, max(iv[1], 0.0)), (None,)))
    add(1, lambda r: ("hardsigmoid", [F.hardsigmoid], lambda x: F.hardsigmoid(x, inplace=True),
                      lambda x, o: aten.hardsigmoid.out(x, out=o), lambda iv: (0.0, 1.0), (None,)))
    add(1, lambda r: ("hardswish", [F.hardswish], lambda x: F.hardswish(x, inplace=True),
                      lambda x, o: aten.hardswish.out(x, out=o), lambda iv: (-0.375, max(iv[1], 0.0)), (None,)))

    def leaky(r):
        s = r.choice([0.01, 0.2])
        return (f"leaky_relu({s})", [lambda x: F.leaky_relu(x, s)], lambda x: F.leaky_relu(x, s, inplace=True),
                lambda x, o: aten.leaky_relu.out(x, s, out=o),
                lambda iv: (min(iv[0], s * iv[0]), max(iv[1], s * iv[1])), (None,))
    add(1, leaky)

    def hardtanh(r):
        lo, hi = r.choice([(-1.0, 1.0), (-0.5, 2.0), (0.0, 6.0)])
        fns = [lambda x: F.hardtanh(x, lo, hi)] + ([F.relu6] if (lo, hi) == (0.0, 6.0) else [])
        return (f"hardtanh({lo},{hi})", fns, lambda x: F.hardtanh(x, lo, hi, inplace=True),
                lambda x, o: aten.hardtanh.out(x, lo, hi, out=o), _mono(_clip(lo, hi)), (None,))
    add(1, hardtanh)

    def elu(r):
        a = r.choice([1.0, 0.5])
        return (f"elu({a})", [lambda x: F.elu(x, a)], lambda x: F.elu(x, a, inplace=True),
                lambda x, o: aten.elu.out(x, a, out=o), _mono(_elu(a)), (None,))
    add(1, elu)

    def softplus(r):
        # thresholds where the two branches agree to ~1e-7 (a branch flip of a near-threshold value is no jump)
        beta, thr = r.choice([(1.0, 20.0), (2.0, 20.0), (0.5, 15.0)])
        return (f"softplus({beta},{thr})", [lambda x: F.softplus(x, beta, thr)], None,
                lambda x, o: aten.softplus.out(x, beta, thr, out=o), _mono(_softplus(beta, thr)), (None,))
    add(1, softplus)

    def clamp(r):
        lo, hi = r.choice([(-1.0, 1.0), (-0.5, 0.75), (None, 0.5), (-0.25, None)])
        lo_, hi_ = -math.inf if lo is None else lo, math.inf if hi is None else hi
        fns = [lambda x: torch.clamp(x, lo, hi), lambda x: x.clamp(min=lo, max=hi)]
        return (f"clamp({lo},{hi})", fns, lambda x: x.clamp_(lo, hi), lambda x, o: torch.clamp(x, lo, hi, out=o),
                _mono(_clip(lo_, hi_)), (None,))
    add(2, clamp)

    def clamp_min(r):
        v = r.choice([-0.5, 0.25])
        return (f"clamp_min({v})", [lambda x: torch.clamp_min(x, v)], lambda x: x.clamp_min_(v),
                lambda x, o: torch.clamp_min(x, v, out=o), _mono(_clip(v, math.inf)), (None,))
    add(1, clamp_min)

    def clamp_max(r):
        v = r.choice([0.5, -0.25])
        return (f"clamp_max({v})", [lambda x: torch.clamp_max(x, v)], lambda x: x.clamp_max_(v),
                lambda x, o: torch.clamp_max(x, v, out=o), _mono(_clip(-math.inf, v)), (None,))
    add(1, clamp_max)
    return fs


_CONSTS = [0.5, 1.5, 2.0, -0.75, 3.0, 0.25, -1.0]


def _scalar_factory(r):
    """Tensor-Scalar forms (x op c, c op x): add/sub/mul/div .Scalar, rsub, pow.Tensor_Scalar / pow.Scalar."""
    kind = r.choice(["add", "radd", "sub", "rsub", "mul", "rmul", "div", "rdiv", "pow", "rpow", "add_alpha"])
    c = r.choice(_CONSTS)
    if kind in ("add", "radd"):
        fns = [lambda x: x + c, lambda x: torch.add(x, c), lambda x: x.add(c)] if kind == "add" else [lambda x: c + x]
        return (f"add.Scalar({c})", fns, lambda x: x.add_(c), lambda x, o: torch.add(x, c, out=o),
                lambda iv: (iv[0] + c, iv[1] + c), (None,))
    if kind == "add_alpha":
        a = r.choice([0.5, 2.0])
        return (f"add.Scalar({c},alpha={a})", [lambda x: torch.add(x, c, alpha=a)], lambda x: x.add_(c, alpha=a),
                None, lambda iv: (iv[0] + a * c, iv[1] + a * c), (None,))
    if kind == "sub":
        return (f"sub.Scalar({c})", [lambda x: x - c, lambda x: torch.sub(x, c)], lambda x: x.sub_(c), None,
                lambda iv: (iv[0] - c, iv[1] - c), (None,))
    if kind == "rsub":
        return (f"rsub.Scalar({c})", [lambda x: c - x, lambda x: torch.rsub(x, c)], None, None,
                lambda iv: (c - iv[1], c - iv[0]), (None,))
    if kind in ("mul", "rmul"):
        fns = [lambda x: x * c, lambda x: torch.mul(x, c)] if kind == "mul" else [lambda x: c * x]
        return (f"mul.Scalar({c})", fns, lambda x: x.mul_(c), lambda x, o: torch.mul(x, c, out=o),
                lambda iv: _scale_iv(iv, c), (None,))
    if kind == "div":
        return (f"div.Scalar({c})", [lambda x: x / c, lambda x: torch.div(x, c)], lambda x: x.div_(c), None,
                lambda iv: _scale_iv(iv, 1.0 / c), (None,))
    if kind == "rdiv":
        return (f"rdiv({c})", [lambda x: c / x], None, None, lambda iv: _scale_iv(_s2(1.0 / iv[0], 1.0 / iv[1]), c),
                (NZ,))
    if kind == "pow":
        e = r.choice([2.0, 3.0, 0.5, -1.0, 1.5, -0.5])
        if e == 2.0:
            ivf, req = _sq_iv, B4
        elif e == 3.0:
            ivf, req = (lambda iv: (iv[0] ** 3, iv[1] ** 3)), B4
        else:
            ivf, req = _mono(lambda v: v ** e), POSB
        return (f"pow.Tensor_Scalar({e})", [lambda x: x ** e, lambda x: torch.pow(x, e)], lambda x: x.pow_(e), None,
                ivf, (req,))
    b = r.choice([2.0, 0.5, 1.5])
    return (f"pow.Scalar({b})", [lambda x: b ** x, lambda x: torch.pow(b, x)], None, None,
            _mono(lambda v: b ** v), (B4,))


def _binary_factory(r):
    kind = r.choice(["add", "add", "sub", "mul", "mul", "div", "maximum", "minimum", "pow"])
    if kind in ("add", "sub"):
        sub = kind == "sub"
        tf, tm, ti = (torch.sub, T.sub, T.sub_) if sub else (torch.add, T.add, T.add_)
        alpha = r.choice([None, None, 0.5, 2.0, -1.5])
        eff = (-1.0 if sub else 1.0) * (1.0 if alpha is None else alpha)
        ivf = lambda a, b: _add_iv(a, _scale_iv(b, eff))  # noqa: E731
        if alpha is None:
            return (f"{kind}.Tensor", [operator.sub if sub else operator.add, tf, tm], ti,
                    lambda x, y, o: tf(x, y, out=o), ivf, (None, None))
        return (f"{kind}.Tensor(alpha={alpha})", [lambda x, y: tf(x, y, alpha=alpha), lambda x, y: tm(x, y, alpha=alpha)],
                lambda x, y: ti(x, y, alpha=alpha), lambda x, y, o: tf(x, y, alpha=alpha, out=o), ivf, (None, None))
    if kind == "mul":
        return ("mul.Tensor", [operator.mul, torch.mul, T.mul], T.mul_, lambda x, y, o: torch.mul(x, y, out=o),
                _mul_iv, (None, None))
    if kind == "div":
        return ("div.Tensor", [operator.truediv, torch.div, T.div], T.div_, lambda x, y, o: torch.div(x, y, out=o),
                _div_iv, (None, NZ))
    if kind in ("maximum", "minimum"):
        tf = torch.maximum if kind == "maximum" else torch.minimum
        pick = max if kind == "maximum" else min
        return (kind, [tf, getattr(T, kind)], None, lambda x, y, o: tf(x, y, out=o),
                lambda a, b: (pick(a[0], b[0]), pick(a[1], b[1])), (None, None))
    return ("pow.Tensor_Tensor", [operator.pow, torch.pow], T.pow_, lambda x, y, o: torch.pow(x, y, out=o),
            _pow_iv, (POSB, B2))


def _clamp_tensor_iv(x, lo, hi):
    return (min(max(x[0], lo[0]), hi[0]), min(max(x[1], lo[1]), hi[1]))


def _reduce_factory(r, n):
    kind = r.choice(["sum", "sum", "mean", "amax", "amin", "softmax", "softmax", "log_softmax"])
    if kind == "sum":
        fns = [lambda x: x.sum(-1), lambda x: torch.sum(x, -1), lambda x: x.sum(dim=-1, keepdim=True),
               lambda x: torch.sum(x, x.dim() - 1)]
        return ("sum.dim_IntList", fns, lambda x, o: torch.sum(x, -1, out=o),
                lambda iv: (min(0.0, n * iv[0]), max(0.0, n * iv[1])))
    if kind == "mean":
        fns = [lambda x: x.mean(-1), lambda x: torch.mean(x, -1, keepdim=True), lambda x: x.mean(dim=x.dim() - 1)]
        return ("mean.dim", fns, None, lambda iv: iv)
    if kind in ("amax", "amin"):
        tf = getattr(torch, kind)
        fns = [lambda x: tf(x, -1), lambda x: tf(x, -1, keepdim=True), lambda x: getattr(x, kind)(dim=-1)]
        return (kind, fns, None, lambda iv: iv)
    if kind == "softmax":
        fns = [lambda x: torch.softmax(x, -1), lambda x: F.softmax(x, dim=-1), lambda x: x.softmax(-1),
               lambda x: torch.softmax(x, x.dim() - 1)]
        return ("softmax.int", fns, None, lambda iv: (0.0, 1.0))
    fns = [lambda x: torch.log_softmax(x, -1), lambda x: F.log_softmax(x, dim=-1), lambda x: x.log_softmax(-1)]
    return ("log_softmax.int", fns, None, lambda iv: (-(iv[1] - iv[0]) - math.log(max(n, 1)) - 1.0, 0.0))


_UNARY = None


def _unary_table():
    global _UNARY
    if _UNARY is None:
        fs = _unary_factories()
        _UNARY = ([f for _, f in fs], list(itertools.accumulate(w for w, _ in fs)))
    return _UNARY


# ================================================================================================ pools and leaves
class Pools:
    """Random input data on one device, never written: leaves are views of slices of these (cloned where a chain
    writes them). Floats uniform in [-2, 2] (fp16/bf16: the fp32 values rounded), int32 in [-8, 8]."""

    def __init__(self, device, seed=0, n=POOL_N):
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        f = torch.rand(n, generator=g, device=device) * 4.0 - 2.0
        self.device = device
        self.n = n
        self.t = {F32: f, F16: f.half(), BF16: f.bfloat16(),
                  I32: torch.randint(-8, 9, (n,), generator=g, device=device, dtype=I32)}
        self.iv = {F32: (-2.0, 2.0), F16: (-2.0, 2.0), BF16: (-2.0, 2.0), I32: (-8.0, 8.0)}

    def ensure(self, n):
        """Grow (the data followed by itself reversed) until a leaf of n elements fits: a broadcast or matmul can
        ask for a leaf larger than the pool (a 1,000,000-op soak did). Chains are generated and replayed on the
        same Pools object, and a rebuilt chain grows its fresh pools the same way."""
        while self.n < n:
            self.t = {dt: torch.cat([t, t.flip(0)]) for dt, t in self.t.items()}
            self.n *= 2


# leaf layouts: how a leaf of shape S is a view of a base tensor
def _layout_base(shape, layout):
    """(base shape, view function) of a leaf of `shape` with `layout`."""
    s = tuple(shape)
    if layout == "t":
        return s[:-2] + (s[-1], s[-2]), (lambda b: b.transpose(-1, -2))
    if layout == "step":
        return s[:-1] + (2 * s[-1],), (lambda b: b[..., ::2])
    if layout == "slice":
        return (s[0] + 1,) + s[1:], (lambda b: b[1:])
    if layout == "permute":
        nd = len(s)
        return tuple(reversed(s)), (lambda b: b.permute(*reversed(range(nd))))
    if isinstance(layout, tuple) and layout[0] == "expand":
        base = tuple(1 if i in layout[1] else d for i, d in enumerate(s))
        return base, (lambda b: b.expand(*s))
    return s, None


def _make_leaf(pools, spec, mode, written):
    dt, off, base, view = spec
    b = pools.t[dt][off:off + _numel(base)]
    if mode == "f64":
        b = b.double() if dt.is_floating_point else b.clone()
    elif mode == "eager" or written:
        b = b.clone()
    b = b.view(base)
    return view(b) if view is not None else b


# ================================================================================================ programs
LEAF, CALL, ALLOC, CAST = 0, 1, 2, 3


class Chain:
    """A generated program: instructions over MAX_SLOTS slots, replayable in three modes (eager on clones of the
    leaves, gpuos under a scheduler context, float64)."""

    __slots__ = ("prog", "labels", "leaves", "written", "n_ops", "dtype", "seed", "slots")

    def __init__(self, prog, labels, leaves, written, n_ops, dtype, seed, slots):
        self.prog, self.labels, self.leaves, self.written = prog, labels, leaves, written
        self.n_ops, self.dtype, self.seed, self.slots = n_ops, dtype, seed, slots


def make_leaves(chain, pools, mode):
    """The chain's input tensors for a replay in `mode` (made before a scheduler context is entered, so the replay
    under it runs the chain's ops only)."""
    return [_make_leaf(pools, spec, mode, w) for spec, w in zip(chain.leaves, chain.written)]


def _exec(ins, env, leaves, dev, f64):
    """One instruction on the slots."""
    op = ins[0]
    if op == CALL:
        r = ins[2](*[env[i] for i in ins[3]])
        if ins[1] >= 0:
            if f64 and isinstance(r, torch.Tensor) and r.dtype.is_floating_point and r.dtype != torch.float64:
                r = r.double()  # a float made from ints (int / int, sigmoid(int)): float32 by default
            env[ins[1]] = r
    elif op == LEAF:
        env[ins[1]] = leaves[ins[2]]
    elif op == ALLOC:
        shape, dt, transposed = ins[2], ins[3], ins[4]
        if f64 and dt.is_floating_point:
            dt = torch.float64
        if transposed:
            env[ins[1]] = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=dt, device=dev).transpose(-1, -2)
        else:
            env[ins[1]] = torch.empty(shape, dtype=dt, device=dev)
    else:  # CAST (a copy in every mode: in float64 a float->float cast would otherwise alias its source)
        dt = ins[3]
        if f64 and dt.is_floating_point:
            dt = torch.float64
        env[ins[1]] = env[ins[2]].to(dt, copy=True)


def run_chain(chain, pools, mode, leaves=None, capture=None):
    """Execute `chain` ('eager': every leaf cloned; 'gpuos': only leaves the chain writes are cloned -- the caller
    enters the scheduler context; 'f64': floats as float64). leaves: from make_leaves (made here if None).
    capture: a list that gets (index, output cloned) per instruction. Returns the slots."""
    env = [None] * chain.slots
    if leaves is None:
        leaves = make_leaves(chain, pools, mode)
    dev, f64 = pools.device, mode == "f64"
    for k, ins in enumerate(chain.prog):
        if ins[0] == CALL and not f64:  # the hot path, inline
            r = ins[2](*[env[i] for i in ins[3]])
            if ins[1] >= 0:
                env[ins[1]] = r
        else:
            _exec(ins, env, leaves, dev, f64)
        if capture is not None:
            v = env[ins[1]] if ins[1] >= 0 else None
            capture.append((k, v.clone() if isinstance(v, torch.Tensor) else v))
    return env


class ChainGen:
    """Builds a Chain while running it eagerly (an op eager rejects is not recorded), tracking per slot an interval
    that bounds its values, a storage key (views and in-place writes share it) and whether its values are exact
    (identical in every replay: leaves, and ints/bools derived from exact values only -- the only inputs of
    discontinuous ops such as comparisons and float->int casts)."""

    def __init__(self, pools):
        self.pools = pools
        self.dev = pools.device
        self.rejected = 0  # ops eager raised for (dropped)

    # ---------------------------------------------------------------- slots
    def _reset(self, rng):
        self.r = rng
        self.env = [None] * MAX_SLOTS
        self.iv = [None] * MAX_SLOTS
        self.key = [0] * MAX_SLOTS
        self.exact = [False] * MAX_SLOTS
        self.cls = [0] * MAX_SLOTS      # 0 empty, 1 float, 2 int, 3 bool (cached: the generator's hot path)
        self.shape = [None] * MAX_SLOTS
        self.key_leaf = {}
        self.next_key = 1
        self.prog, self.labels, self.leaves, self.written = [], [], [], []
        self.nops = 0

    def _numeric(self):
        """Live slots holding float or int values."""
        return [i for i, k in enumerate(self.cls) if k == 1 or k == 2]

    def _pick(self):
        c = self._numeric()
        return self.r.choice(c) if c else -1

    def _slot_for(self, exclude=()):
        free = [i for i in range(MAX_SLOTS) if self.env[i] is None]
        if free:
            return free[0]
        c = [i for i in range(MAX_SLOTS) if i not in exclude]
        return self.r.choice(c)

    def _newkey(self):
        self.next_key += 1
        return self.next_key

    def _set(self, dst, t, iv, key, exact):
        self.env[dst], self.iv[dst], self.key[dst], self.exact[dst] = t, iv, key, exact
        dt = t.dtype
        self.cls[dst] = 1 if dt.is_floating_point else 3 if dt == torch.bool else 2
        self.shape[dst] = tuple(t.shape)

    # ---------------------------------------------------------------- recording
    def _emit(self, fn, srcs, dst, label, iv, exact=False, inplace=False, view=False):
        """Run fn on the slots eagerly; on success record it and set dst's metadata. Returns dst, or -1 (rejected)."""
        try:
            t = fn(*[self.env[i] for i in srcs])
        except Exception:  # noqa: BLE001 -- eager rejects this combination: not part of the chain
            self.rejected += 1
            return -1
        self.prog.append((CALL, dst, fn, tuple(srcs)))
        self.labels.append(label)
        self.nops += 1
        if dst < 0:
            return dst
        if inplace:
            self._written(dst, iv)
        elif view:
            s = srcs[0]
            self._set(dst, t, self.iv[s], self.key[s], self.exact[s])
        else:
            if not isinstance(t, torch.Tensor):
                raise AssertionError(f"{label} returned {type(t).__name__}")
            self._set(dst, t, iv, self._newkey(), exact)
        return dst

    def _written(self, dst, iv):
        """dst's storage was written: dst takes iv, every other view of that storage the union."""
        k = self.key[dst]
        for i in range(MAX_SLOTS):
            if self.env[i] is not None and self.key[i] == k:
                self.exact[i] = False
                if i != dst:
                    self.iv[i] = (min(self.iv[i][0], iv[0]), max(self.iv[i][1], iv[1]))
        self.iv[dst] = iv
        if k in self.key_leaf:
            self.written[self.key_leaf[k]] = True

    def _leaf(self, shape, dtype, layout=None, exclude=()):
        r = self.r
        shape = tuple(shape)
        if layout is None:
            layout = "c"
            x = r.random()
            nd = len(shape)
            if nd >= 2 and x < 0.12:
                layout = "t"
            elif nd >= 1 and x < 0.22:
                layout = "step"
            elif nd >= 1 and x < 0.30:
                layout = "slice"
            elif nd >= 3 and x < 0.36:
                layout = "permute"
            elif x < 0.42:
                dims = [i for i, d in enumerate(shape) if d > 1 and r.random() < 0.5]
                if dims:
                    layout = ("expand", tuple(dims))
        base, view = _layout_base(shape, layout)
        n = _numel(base)
        self.pools.ensure(n)
        off = r.randrange(0, self.pools.n - n + 1)
        idx = len(self.leaves)
        self.leaves.append((dtype, off, base, view))
        self.written.append(False)
        dst = self._slot_for(exclude)
        t = _make_leaf(self.pools, self.leaves[idx], "eager", False)
        self.prog.append((LEAF, dst, idx))
        self.labels.append(f"leaf{idx}({layout if isinstance(layout, str) else 'expand'})")
        key = self._newkey()
        self.key_leaf[key] = idx
        self._set(dst, t, self.pools.iv[dtype], key, True)
        return dst

    # ---------------------------------------------------------------- guards (themselves ops of the chain)
    def _squash(self, s, c):
        """Make |slot s| <= c (overwrites the slot with the squashed value)."""
        iv = self.iv[s]
        m = _mag(iv)
        if m <= c:
            return True
        t = self.env[s]
        r = self.r
        if not t.dtype.is_floating_point:
            ci = max(1, int(c))
            return self._emit(lambda x: torch.clamp(x, -ci, ci), (s,), s, f"clamp({-ci},{ci})",
                              (max(iv[0], -ci), min(iv[1], ci))) >= 0
        k = r.random()
        if k < 0.35:
            e = math.ceil(math.log2(m / c))
            f = 2.0 ** -e  # exact scaling in every float dtype
            return self._emit(lambda x: x * f, (s,), s, f"mul.Scalar({f})", _scale_iv(iv, f)) >= 0
        if k < 0.55:
            if self._emit(torch.tanh, (s,), s, "tanh", _mono(math.tanh)(iv)) < 0:
                return False
            return self._squash(s, c)
        if k < 0.8:
            return self._emit(lambda x: torch.clamp(x, -c, c), (s,), s, f"clamp({-c},{c})",
                              (max(iv[0], -c), min(iv[1], c))) >= 0
        return self._emit(lambda x: F.hardtanh(x, -c, c), (s,), s, f"hardtanh({-c},{c})",
                          (max(iv[0], -c), min(iv[1], c))) >= 0

    def _posify(self, s, m, cap=None):
        """Make slot s >= m (and <= cap)."""
        if cap is not None and not self._squash(s, max(cap - 1.0, 0.5)):
            return False
        iv = self.iv[s]
        if iv[0] >= m:
            return True
        t = self.env[s]
        r = self.r
        if not t.dtype.is_floating_point:
            if self._emit(torch.abs, (s,), s, "abs", _abs_iv(iv)) < 0:
                return False
            mi = int(math.ceil(m))
            a = self.iv[s]
            return self._emit(lambda x: x + mi, (s,), s, f"add.Scalar({mi})", (a[0] + mi, a[1] + mi)) >= 0
        k = r.random()
        if k < 0.4:
            if self._emit(r.choice([torch.abs, T.abs]), (s,), s, "abs", _abs_iv(iv)) < 0:
                return False
        elif k < 0.6:
            if self._emit(torch.sigmoid, (s,), s, "sigmoid", _mono(_sig)(iv)) < 0:
                return False
        elif k < 0.8:
            if self._emit(F.relu, (s,), s, "relu", (max(iv[0], 0.0), max(iv[1], 0.0))) < 0:
                return False
        else:
            if self._emit(lambda x: F.softplus(x), (s,), s, "softplus(1.0,20.0)",
                          _mono(_softplus(1.0, 20.0))(iv)) < 0:
                return False
        a = self.iv[s]
        add = m + max(0.0, -a[0])
        add = float(math.ceil(add * 4.0) / 4.0)  # a multiple of 1/4: exact in every dtype
        return self._emit(lambda x: x + add, (s,), s, f"add.Scalar({add})", (a[0] + add, a[1] + add)) >= 0

    def _require(self, s, req):
        if req is None or _meets(self.iv[s], req):
            return True
        k = req[0]
        if k == "bound":
            ok = self._squash(s, req[1])
        elif k == "pos":
            ok = self._posify(s, req[1])
        elif k == "posb":
            ok = self._posify(s, req[1], cap=req[2])
        else:  # nz
            ok = self._posify(s, req[1])
            if ok and self.r.random() < 0.4:
                a = self.iv[s]
                ok = self._emit(torch.neg, (s,), s, "neg", (-a[1], -a[0])) >= 0
        return ok and _meets(self.iv[s], req)

    # ---------------------------------------------------------------- partners
    def _partner_shape(self, shape, inplace):
        r = self.r
        s = tuple(shape)
        x = r.random()
        if x < 0.45 or not s:
            return s if x > 0.08 or not s else ()
        if x < 0.55:
            return ()
        if x < 0.9:
            k = r.randint(0, len(s) - 1)
            return tuple(1 if r.random() < 0.3 else d for d in s[k:])
        if not inplace and _numel(s) * 3 <= 12288:
            return (r.choice([2, 3]),) + s
        return s

    def _partner(self, x, inplace=False, exclude=()):
        """A slot broadcast-compatible with x (an existing one, or a new leaf; never evicting x or `exclude`)."""
        r = self.r
        xs = self.shape[x]
        if r.random() < 0.3:
            c = [i for i in self._numeric() if i != x and _bcast_ok(xs, self.shape[i], inplace)]
            if c:
                return r.choice(c)
        dt = self.env[x].dtype
        if dt not in self.pools.t:  # bool, int64 (an int sum)
            dt = F32 if dt == torch.bool or dt.is_floating_point else I32
        if r.random() < 0.12:
            dt = r.choice(FLOATS + (I32,))
        return self._leaf(self._partner_shape(xs, inplace), dt, exclude=(x,) + tuple(exclude))

    # ---------------------------------------------------------------- steps
    def _form(self, has_ip, has_out):
        x = self.r.random()
        if has_ip and x < 0.22:
            return "i"
        if has_out and x > 0.86:
            return "o"
        return "f"

    def _apply(self, label, fns, ip, out, ivf, srcs, lock_dst=False):
        """Record one op over srcs in a random form (functional into a new slot or over its first input, in-place on
        its first input, out= into a new tensor or over its first input)."""
        r = self.r
        ivs = [self.iv[s] for s in srcs]
        iv = ivf(*ivs)
        if _mag(iv) > LIMIT:
            for s in srcs:
                if not self._squash(s, 1.0):
                    return -1
            iv = ivf(*[self.iv[s] for s in srcs])
            if _mag(iv) > LIMIT:
                return -1
        form = self._form(ip is not None, out is not None)
        x = srcs[0]
        if form == "i":
            return self._emit(ip, srcs, x, label + "_", iv, inplace=True)
        if form == "o":
            return self._out(out, fns[0], srcs, label + ".out", iv)
        dst = x if (r.random() < 0.5 and not lock_dst) else self._slot_for(exclude=srcs)
        return self._emit(r.choice(fns), srcs, dst, label, iv)

    def _out(self, out, probe, srcs, label, iv):
        r = self.r
        vals = [self.env[i] for i in srcs]
        try:
            p = probe(*vals)
        except Exception:  # noqa: BLE001
            self.rejected += 1
            return -1
        if p.dtype.is_floating_point and not any(self.env[i].dtype.is_floating_point for i in srcs):
            return -1  # int inputs, float out=: the float64 replay's float64 out= is refused by some kernels
        x = srcs[0]
        xt = self.env[x]
        if r.random() < 0.25 and tuple(xt.shape) == tuple(p.shape) and xt.dtype == p.dtype and _writable(xt):
            return self._emit(out, tuple(srcs) + (x,), x, label + "[out=input]", iv, inplace=True)
        dt = p.dtype
        if dt.is_floating_point and r.random() < 0.15:
            dt = r.choice(FLOATS)
        # (not for gelu: CPU torch 2.13's aten.gelu.out writes zeros into a transposed out -- eager is the reference)
        transposed = p.dim() >= 2 and r.random() < 0.2 and not label.startswith("gelu")
        shape = tuple(p.shape)
        if transposed:
            o = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=dt, device=self.dev).transpose(-1, -2)
        else:
            o = torch.empty(shape, dtype=dt, device=self.dev)
        try:
            out(*vals, o)
        except Exception:  # noqa: BLE001 -- the ALLOC is not recorded either (never an uninitialised slot)
            self.rejected += 1
            return -1
        dst = self._slot_for(exclude=srcs)
        self.prog.append((ALLOC, dst, shape, dt, transposed))
        self.labels.append(f"empty({list(shape)},{str(dt).replace('torch.', '')}{',t' if transposed else ''})")
        self._set(dst, o, (0.0, 0.0), self._newkey(), False)
        self.prog.append((CALL, dst, out, tuple(srcs) + (dst,)))
        self.labels.append(label)
        self.nops += 1
        self._written(dst, iv)
        return dst

    def _step_unary(self):
        x = self._pick()
        if x < 0:
            return
        fns, cw = _unary_table()
        label, f, ip, out, ivf, reqs = self.r.choices(fns, cum_weights=cw)[0](self.r)
        if not self._require(x, reqs[0]):
            return
        self._apply(label, f, ip, out, ivf, (x,))

    def _step_scalar(self):
        x = self._pick()
        if x < 0:
            return
        label, f, ip, out, ivf, reqs = _scalar_factory(self.r)
        if not self._require(x, reqs[0]):
            return
        self._apply(label, f, ip, out, ivf, (x,))

    def _step_binary(self):
        x = self._pick()
        if x < 0:
            return
        label, f, ip, out, ivf, reqs = _binary_factory(self.r)
        inplace_ok = ip is not None and _writable(self.env[x])
        y = self._partner(x, inplace=inplace_ok)
        if y == x:
            return
        if self.r.random() < 0.15:  # operands swapped: the partner broadcasts up, or it is 0-d
            x, y = y, x
        if not self._require(x, reqs[0]) or not self._require(y, reqs[1]) or not _meets(self.iv[x], reqs[0] or
                                                                                          ("bound", math.inf)):
            return
        self._apply(label, f, ip if _writable(self.env[x]) else None, out, ivf, (x, y))

    def _step_clamp_tensor(self):
        x = self._pick()
        if x < 0:
            return
        lo = self._partner(x, inplace=True)
        hi = self._partner(x, inplace=True, exclude=(lo,))
        if len({x, lo, hi}) < 3:
            return
        fns = [lambda a, b, c: torch.clamp(a, b, c), lambda a, b, c: a.clamp(b, c),
               lambda a, b, c: torch.clamp(a, min=b, max=c)]
        ip = (lambda a, b, c: a.clamp_(b, c)) if _writable(self.env[x]) else None
        self._apply("clamp.Tensor", fns, ip, lambda a, b, c, o: torch.clamp(a, b, c, out=o), _clamp_tensor_iv,
                    (x, lo, hi))

    def _step_reduce(self):
        x = self._pick()
        if x < 0:
            return
        t = self.env[x]
        n = t.shape[-1] if t.dim() else 1
        label, fns, out, ivf = _reduce_factory(self.r, n)
        if label.startswith("sum") and n * _mag(self.iv[x]) > LIMIT:
            m = _mag(self.iv[x])
            if t.dtype.is_floating_point:
                e = math.ceil(math.log2(max(n * m / LIMIT, 1.0)))
                f = 2.0 ** -e
                if self._emit(lambda v: v * f, (x,), x, f"mul.Scalar({f})", _scale_iv(self.iv[x], f)) < 0:
                    return
            elif not self._squash(x, max(1.0, LIMIT / max(n, 1))):
                return
        iv = ivf(self.iv[x])
        if _mag(iv) > LIMIT:
            if not self._squash(x, 1.0):
                return
            iv = ivf(self.iv[x])
        r = self.r
        if out is not None and r.random() < 0.1:
            self._out(out, fns[0], (x,), label + ".out", iv)
            return
        dst = x if r.random() < 0.5 else self._slot_for(exclude=(x,))
        self._emit(r.choice(fns), (x,), dst, label, iv)

    def _exact_mask(self, x):
        """A bool slot computed from exact values, broadcastable with x."""
        xs = self.shape[x]
        c = [i for i in self._numeric() if self.exact[i] and _bcast_ok(xs, self.shape[i], False)]
        e = self.r.choice(c) if c else self._leaf(self._partner_shape(xs, True), self.r.choice(FLOATS + (I32,)),
                                                  exclude=(x,))
        thr = self.r.choice([0.0, 0.5, -1.0])
        m = self._slot_for(exclude=(x, e))
        return self._emit(lambda v: v > thr, (e,), m, f"gt.Scalar({thr})", (0.0, 1.0), exact=True)

    def _step_foreign(self):
        r = self.r
        k = r.random()
        x = self._pick()
        if x < 0:
            return
        t = self.env[x]
        if k < 0.3:  # where(mask, x, y)
            m = self._exact_mask(x)
            if m < 0:
                return
            y = self._partner(x, exclude=(m,))
            if len({m, x, y}) < 3:
                return
            a, b = self.iv[x], self.iv[y]
            dst = self._slot_for(exclude=(m, x, y))
            self._emit(torch.where, (m, x, y), dst, "where.self", (min(a[0], b[0]), max(a[1], b[1])))
        elif k < 0.55:  # casts
            dst = self._slot_for(exclude=(x,)) if r.random() < 0.5 else x
            if t.dtype.is_floating_point:
                if self.exact[x] and r.random() < 0.3:
                    dt, exact = I32, True
                else:
                    dt, exact = r.choice([d for d in FLOATS if d != t.dtype]), False
            else:
                dt, exact = r.choice(FLOATS), self.exact[x]
            iv = self.iv[x]
            if dt == I32:
                iv = (math.floor(iv[0]), math.ceil(iv[1]))
            self.prog.append((CAST, dst, x, dt))
            self.labels.append(f"to({str(dt).replace('torch.', '')})")
            self.nops += 1
            self._set(dst, t.to(dt), iv, self._newkey(), exact)
        elif k < 0.65:  # copies (contiguous() aliases or copies depending on the layout: leaves only)
            fn = T.contiguous if self.key[x] in self.key_leaf and r.random() < 0.5 else T.clone
            self._emit(fn, (x,), self._slot_for(exclude=(x,)), fn.__name__, self.iv[x], exact=self.exact[x])
        elif k < 0.75:  # cumsum (eager, reads deferred work)
            n = t.shape[-1] if t.dim() else 1
            if not t.dtype.is_floating_point or not self._squash(x, max(LIMIT / max(n, 1), 2.0 ** -6)):
                return
            iv = self.iv[x]
            self._emit(lambda v: torch.cumsum(v, -1), (x,), self._slot_for(exclude=(x,)), "cumsum",
                       (min(iv[0], n * iv[0]), max(iv[1], n * iv[1])))
        elif k < 0.88:  # matmul (a heavy op: the worker yields)
            if t.dim() != 2 or not t.dtype.is_floating_point or t.shape[1] == 0:
                return
            c = t.shape[1]
            w = self._leaf((c, r.choice([1, 16, 64])), t.dtype, layout=r.choice(["c", "t"]), exclude=(x,))
            if not self._squash(x, max(LIMIT / (2.0 * c), 2.0 ** -8)):
                return
            m = _mag(self.iv[x]) * 2.0 * c
            self._emit(operator.matmul, (x, w), self._slot_for(exclude=(x, w)), "mm", (-m, m))
        elif k < 0.94:  # a host read (flushes the deferred work it depends on, syncs)
            if t.numel() == 0:
                return
            self._emit(lambda v: v.reshape(-1)[0].item(), (x,), -1, "item", None)
        else:  # an explicit gpuos flush in the middle of a context
            self._emit(_gpuos_flush, (), -1, "gpuos.flush()", None)

    def _step_view(self):
        r = self.r
        x = self._pick()
        if x < 0:
            return
        t = self.env[x]
        c = [("unsqueeze(0)", lambda v: v.unsqueeze(0))]
        if self.key[x] in self.key_leaf:  # reshape aliases or copies depending on the layout: only where every
            c.append(("reshape(-1)", lambda v: v.reshape(-1)))  # replay has the same one (leaves and their views)
        if t.dim() >= 2:
            c += [("transpose(-1,-2)", lambda v: v.transpose(-1, -2)), ("t()", lambda v: v.transpose(-1, -2))]
        if t.dim() >= 1 and t.shape[-1] >= 2:
            c.append(("[...,::2]", lambda v: v[..., ::2]))
        if t.dim() >= 1 and t.shape[0] >= 2:
            c.append(("[1:]", lambda v: v[1:]))
        ones = [i for i, d in enumerate(t.shape) if d == 1]
        if ones:
            shape = tuple(3 if i == ones[0] else d for i, d in enumerate(t.shape))
            c.append((f"expand{list(shape)}", lambda v: v.expand(*shape)))
        label, fn = r.choice(c)
        self._emit(fn, (x,), self._slot_for(exclude=(x,)), label, None, view=True)

    def _step_leaf(self):
        x = self._pick()
        if x < 0:
            self._leaf(_rand_shape(self.r), self.main)
            return
        self._partner(x)

    def build(self, rng, n_ops, dtype=None, shape=None, seed=None):
        """Generate a chain of about n_ops ops; returns (Chain, eager slots)."""
        self._reset(rng)
        r = rng
        if dtype is None:
            x = r.random()
            dtype = F32 if x < 0.45 else F16 if x < 0.67 else BF16 if x < 0.9 else I32
        self.main = dtype
        shape = _rand_shape(r) if shape is None else shape
        self._leaf(shape, dtype)
        if r.random() < 0.5:
            self._partner(0)
        steps = (self._step_unary, self._step_scalar, self._step_binary, self._step_clamp_tensor,
                 self._step_reduce, self._step_foreign, self._step_view, self._step_leaf)
        cw = _STEP_CUM
        tries = 0
        while self.nops < n_ops and tries < 4 * n_ops + 20:
            tries += 1
            r.choices(steps, cum_weights=cw)[0]()
        chain = Chain(self.prog, self.labels, self.leaves, self.written, self.nops, dtype, seed, MAX_SLOTS)
        return chain, self.env


#: weights of unary, Tensor-Scalar, binary, clamp.Tensor, reduction, foreign, view and new-leaf steps
_STEP_CUM = list(itertools.accumulate((30, 14, 22, 2, 9, 8, 6, 3)))


def _gpuos_flush():
    import gpuos_ext
    if gpuos_ext.is_initialized():
        gpuos_ext.flush()


def _writable(t) -> bool:
    """False for tensors whose elements overlap (expanded): in-place ops on them raise in eager."""
    return all(st != 0 or d <= 1 for st, d in zip(t.stride(), t.shape))


def _bcast_ok(target, other, inplace) -> bool:
    """other broadcasts with target (inplace: to exactly target's shape)."""
    if len(other) > len(target):
        return False if inplace else _bcast_ok(other, target, False)
    for a, b in zip(reversed(target), reversed(other)):
        if a != b and b != 1 and (inplace or a != 1):
            return False
    return True


_SHAPES = [(4096,), (1000,), (257,), (64,), (7,), (1,), (64, 64), (32, 128), (16, 256), (8, 100), (33, 65),
           (3, 1000), (128, 32), (1, 512), (512, 1), (2, 3, 64), (4, 8, 16), (3, 1, 50), (2, 2, 3, 4, 5),
           (2, 16, 2, 16), (5, 7, 9)]
_RARE = [(), (0,), (4, 0), (0, 16), (256, 160)]  # 0-d, numel 0, and one above the scheduler's size threshold


def _rand_shape(r):
    return r.choice(_RARE) if r.random() < 0.03 else r.choice(_SHAPES)


# ================================================================================================ comparison
def quick_count(env_g, env_e, slots=None):
    """(0-d tensor: elements outside QUICK_TOL, summed over every live slot -- no host sync; list of metadata
    differences (shape / dtype / missing), found on the host)."""
    groups, meta_bad = {}, []
    for i in range(len(env_e)) if slots is None else slots:
        e, g = env_e[i], env_g[i]
        if e is None and g is None:
            continue
        if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
            meta_bad.append((i, f"slot {i}: gpuos {_meta(g)} vs eager {_meta(e)}"))
            continue
        if g.shape != e.shape or g.dtype != e.dtype:
            meta_bad.append((i, f"slot {i}: gpuos {_meta(g)} vs eager {_meta(e)}"))
            continue
        gl = groups.setdefault(e.dtype, ([], []))
        gl[0].append(g.reshape(-1))
        gl[1].append(e.reshape(-1))
    counts = []
    for dt, (gs, es) in groups.items():
        G, E = torch.cat(gs), torch.cat(es)
        if dt.is_floating_point:
            rt, at = QUICK_TOL[dt]
            if dt != F32 and dt != torch.float64:
                G, E = G.float(), E.float()
            counts.append((~torch.isclose(G, E, rtol=rt, atol=at, equal_nan=True)).sum())
        else:
            counts.append((G != E).sum())
    total = torch.stack(counts).sum() if counts else None
    return total, meta_bad


def _slot_bad(g, e):
    """Boolean mask of g's elements outside QUICK_TOL of e (same shape and dtype)."""
    if e.dtype.is_floating_point:
        rt, at = QUICK_TOL[e.dtype]
        return ~torch.isclose(g.double(), e.double(), rtol=rt, atol=at, equal_nan=True)
    return g != e


def _chain_eps(chain):
    """Unit roundoff of the lowest float precision the chain's values pass through (leaves, casts, out= tensors):
    a value rounded there may round the other way in the other run (one ulp), and the float64 replay has no
    such rounding at all."""
    dts = [spec[0] for spec in chain.leaves]
    dts += [ins[3] for ins in chain.prog if ins[0] in (ALLOC, CAST)]
    return max([_EPS[d] for d in dts if d in _EPS] + [_EPS[F32]])


def _judge(g, e, r, eps):
    """A slot outside the quick tolerance: 'drift' when gpuos is no more than DRIFT_FACTOR times further from the
    float64 replay r than eager is, plus 8 units of roundoff `eps` of the chain's lowest precision (relative to the
    slot's largest value), else 'mismatch'. Returns (verdict, facts)."""
    facts = {}
    if not e.dtype.is_floating_point:
        return "mismatch", {"why": "integer/bool values differ (exact comparison)"}
    gd, ed, rd = g.double(), e.double(), r.double()
    fin_g, fin_e = torch.isfinite(gd), torch.isfinite(ed)
    both_nan = torch.isnan(gd) & torch.isnan(ed)
    same_inf = torch.isinf(gd) & torch.isinf(ed) & (gd == ed)
    pattern = (fin_g != fin_e) | (~fin_g & ~fin_e & ~both_nan & ~same_inf)
    if bool(pattern.any()):
        facts["why"] = f"NaN/inf pattern differs at {int(pattern.sum())} elements"
        return "mismatch", facts
    both = fin_g & fin_e
    zero = torch.zeros((), dtype=torch.float64, device=gd.device)
    err_g = float(torch.where(both, (gd - rd).abs(), zero).max()) if gd.numel() else 0.0
    err_e = float(torch.where(both, (ed - rd).abs(), zero).max()) if gd.numel() else 0.0
    scale = float(torch.where(torch.isfinite(rd), rd.abs(), zero).max()) if rd.numel() else 0.0
    slack = 8.0 * eps * max(1.0, scale)
    facts.update(err_gpuos_vs_f64=err_g, err_eager_vs_f64=err_e, f64_scale=scale, slack=slack)
    if err_g <= DRIFT_FACTOR * err_e + slack:
        facts["why"] = "gpuos no further from float64 than eager: rounding drift through the chain"
        return "drift", facts
    facts["why"] = (f"gpuos is {err_g:.3g} from float64, eager {err_e:.3g} (allowed {DRIFT_FACTOR} x eager + "
                    f"{slack:.3g})")
    return "mismatch", facts


def _first_bad(g, e, r=None):
    bad = _slot_bad(g, e)
    n_bad = int(bad.sum())
    out = {"n_bad": n_bad, "numel": g.numel()}
    if n_bad:
        idx = tuple(int(v) for v in bad.nonzero()[0].tolist()) if g.dim() else ()
        out["first_bad_index"] = list(idx)
        out["gpuos"] = float(g[idx]) if g.numel() else None
        out["eager"] = float(e[idx]) if e.numel() else None
        if r is not None and isinstance(r, torch.Tensor) and r.shape == g.shape:
            out["f64"] = float(r[idx])
        if e.dtype.is_floating_point:
            d = (g.double() - e.double()).abs()
            d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
            out["max_abs_diff"] = float(d.max())
    return out


def listing(chain, pools, limit=80):
    """The program with every instruction's input and output shapes, dtypes and strides (an eager replay)."""
    env = [None] * chain.slots
    leaves = make_leaves(chain, pools, "eager")
    lines = []
    for k, ins in enumerate(chain.prog):
        if ins[0] == CALL:
            ins_meta = ", ".join(f"s{i}:{_meta(env[i])}" for i in ins[3])
        elif ins[0] == CAST:
            ins_meta = f"s{ins[2]}:{_meta(env[ins[2]])}"
        else:
            ins_meta = ""
        try:
            _exec(ins, env, leaves, pools.device, False)
        except Exception as e:  # noqa: BLE001
            lines.append(f"{k:3d} {chain.labels[k]}({ins_meta}) raised {type(e).__name__}: {str(e)[:200]}")
            continue
        dst = ins[1]
        res = _meta(env[dst]) if dst >= 0 else "-"
        lines.append(f"{k:3d} s{dst} = {chain.labels[k]}({ins_meta}) -> {res}")
    if len(lines) > limit:
        lines = lines[:limit // 2] + [f"... {len(lines) - limit} more ..."] + lines[-limit // 2:]
    return lines


def diagnose(chain, env_g, env_e, pools, sched_kwargs, details=True):
    """A chain that failed the quick check: judge every slot against a float64 replay; for a mismatch, the full
    story (program listing, first divergent op of an unfused replay, whether it reproduces). Returns
    (verdict 'ok'|'drift'|'mismatch', info dict)."""
    info = {"seed": chain.seed, "dtype": str(chain.dtype).replace("torch.", ""), "n_ops": chain.n_ops}
    slots = []
    verdict = "ok"
    env_r = None
    try:
        env_r = run_chain(chain, pools, "f64")
    except Exception as e:  # noqa: BLE001
        info["f64_replay_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    for i in range(chain.slots):
        g, e = env_g[i], env_e[i]
        if g is None and e is None:
            continue
        if not isinstance(g, torch.Tensor) or not isinstance(e, torch.Tensor) or g.shape != e.shape \
                or g.dtype != e.dtype:
            slots.append({"slot": i, "verdict": "mismatch", "why": "metadata differs", "gpuos": _meta(g),
                          "eager": _meta(e)})
            verdict = "mismatch"
            continue
        bad = _slot_bad(g, e)
        if not bool(bad.any()):
            continue
        r = env_r[i] if env_r is not None else None
        if r is None:
            v, facts = "mismatch", {"why": "no float64 replay"}
        else:
            v, facts = _judge(g, e, r, _chain_eps(chain))
        s = {"slot": i, "verdict": v, "tensor": _meta(g), "eager_layout": _meta(e)}
        s.update(facts)
        s.update(_first_bad(g, e, r))
        s["last_writer"] = _last_writer(chain, i)
        slots.append(s)
        if v == "mismatch":
            verdict = "mismatch"
        elif verdict == "ok":
            verdict = "drift"
    info["slots"] = slots
    if verdict == "mismatch" and details:
        _story(chain, env_e, pools, sched_kwargs, info)
    elif verdict == "drift":
        info["program"] = listing(chain, pools, limit=30)
    return verdict, info


def _last_writer(chain, slot):
    for k in range(len(chain.prog) - 1, -1, -1):
        ins = chain.prog[k]
        if ins[1] == slot:
            return f"{k}: {chain.labels[k]}"
    return None


def _story(chain, env_e, pools, sched_kwargs, info):
    import gpuos
    try:
        info["program"] = listing(chain, pools)
    except Exception as e:  # noqa: BLE001
        info["program"] = [f"listing failed: {type(e).__name__}: {e}"]
    try:  # does the same replay give the same wrong answer?
        lv = make_leaves(chain, pools, "gpuos")
        with gpuos.scheduler_context(**sched_kwargs):
            env_g2 = run_chain(chain, pools, "gpuos", lv)
        cnt, meta_bad = quick_count(env_g2, env_e)
        info["reproduced"] = bool(meta_bad) or (cnt is not None and int(cnt) > 0)
    except Exception as e:  # noqa: BLE001
        info["reproduced"] = f"replay raised {type(e).__name__}: {str(e)[:300]}"
    try:  # unfused replay (each result cloned: a dependency flush per op): the first op whose output differs
        cap_e, cap_g = [], []
        run_chain(chain, pools, "eager", capture=cap_e)
        lv = make_leaves(chain, pools, "gpuos")
        with gpuos.scheduler_context(**sched_kwargs):
            run_chain(chain, pools, "gpuos", lv, capture=cap_g)
        first = None
        for (k, a), (_, b) in zip(cap_e, cap_g):
            if not isinstance(a, torch.Tensor) or chain.prog[k][0] in (ALLOC, LEAF):  # uninitialised / inputs
                continue
            if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
                first = {"op": k, "label": chain.labels[k], "why": f"gpuos {_meta(b)} vs eager {_meta(a)}"}
                break
            if bool(_slot_bad(b, a).any()):
                first = {"op": k, "label": chain.labels[k], "out": _meta(b)}
                first.update(_first_bad(b, a))
                break
        info["first_divergent_op_unfused"] = first if first is not None else \
            "none: the op-by-op replay matches eager (the difference needs the fused / batched run)"
    except Exception as e:  # noqa: BLE001
        info["first_divergent_op_unfused"] = f"capture replay raised {type(e).__name__}: {str(e)[:300]}"


# ================================================================================================ soak
def _sched_counters():
    import gpuos
    import gpuos_ext
    s = gpuos_ext.sched_stats()
    fb = gpuos.scheduler_stats()["fallbacks"]
    rt = gpuos_ext.stats() if gpuos_ext.is_initialized() else {}
    return {"ops_intercepted": s["ops_intercepted"], "front_ops": s["front_ops"], "fused_ops": s["fused_ops"],
            "fused_groups": s["fused_groups"], "sched_flushes": s["sched_flushes"],
            "specializations_requested": s["specializations_requested"],
            "fallbacks": dict(fb), "flushes_by_cause": dict(s["flushes_by_cause"]),
            "subops": rt.get("subops", 0), "batches": rt.get("batches", 0), "jit_compiles": rt.get("jit_compiles", 0),
            "handovers": rt.get("handovers", 0), "early_publishes": rt.get("early_publishes", 0)}


def _delta(a, b):
    out = {}
    for k, v in b.items():
        if isinstance(v, dict):
            out[k] = {kk: vv - a.get(k, {}).get(kk, 0) for kk, vv in v.items() if vv - a.get(k, {}).get(kk, 0)}
        else:
            out[k] = v - a.get(k, 0)
    return out


def soak(n_ops=1_000_000, seed=0, device="cuda", chain_len=(10, 50), check_every=32, max_seconds=None,
         inject_fault=0, details=5, progress_s=15.0, sched_kwargs=None, log=print):
    """Random chains under the scheduler vs eager until n_ops ops ran (see the module docstring).

    inject_fault: every that-many-th chain gets one wrong element added to a gpuos result after the replay (a
    self-test: the soak must report those chains as mismatches). max_seconds: stop early (result 'truncated').
    Returns counts, the intercepted fraction, the first `details` mismatches and drifts with full detail."""
    import gpuos
    sched_kwargs = dict(sched_kwargs or {"auto_flush_ms": 0})
    pools = Pools(device, seed)
    gen = ChainGen(pools)
    if device != "cpu":
        log(f"soak: CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING')}")
    # warm up (runtime init and the first NVRTC load happen here, outside the timed loop)
    with torch.no_grad():
        warm, _ = gen.build(random.Random(seed), 10, dtype=F32, shape=(64,))
        lv = make_leaves(warm, pools, "gpuos")
        with gpuos.scheduler_context(**sched_kwargs):
            run_chain(warm, pools, "gpuos", lv)
    if device != "cpu":
        torch.cuda.synchronize()
    c0 = _sched_counters()
    res = {"requested_ops": n_ops, "ops": 0, "chains": 0, "mismatches": 0, "mismatch_chains": 0, "drift_chains": 0,
           "raised": 0, "injected": 0, "mismatch_details": [], "drift_details": [], "dtypes": {}, "forms": {},
           "seed": seed, "device": device}
    forms = res["forms"]
    pending = []
    t0 = _now()
    last = t0
    idx = 0

    def settle():
        if not pending:
            return
        counts = torch.stack([p[4] for p in pending]).tolist()
        for p, c in zip(pending, counts):
            ch, env_g, env_e, meta_bad = p[0], p[1], p[2], p[3]
            if not c and not meta_bad:
                continue
            verdict, info = diagnose(ch, env_g, env_e, pools, sched_kwargs,
                                     details=len(res["mismatch_details"]) < details)
            info["chain"] = p[5]
            if p[6]:
                info["injected_fault"] = p[6]
            if verdict == "mismatch":
                res["mismatch_chains"] += 1
                res["mismatches"] += sum(1 for s in info["slots"] if s["verdict"] == "mismatch")
                if len(res["mismatch_details"]) < details:
                    res["mismatch_details"].append(info)
                    log(f"soak: MISMATCH in chain {p[5]} (seed {ch.seed}):\n" + json.dumps(info, indent=1, default=str))
            elif verdict == "drift":
                res["drift_chains"] += 1
                if len(res["drift_details"]) < 3:
                    res["drift_details"].append(info)
        pending.clear()

    with torch.no_grad():
        while res["ops"] < n_ops:
            idx += 1
            cseed = seed * 1_000_003 + idx
            rng = random.Random(cseed)
            chain, env_e = gen.build(rng, rng.randint(*chain_len), seed=cseed)
            raised = None
            lv = make_leaves(chain, pools, "gpuos")
            try:
                with gpuos.scheduler_context(**sched_kwargs):
                    env_g = run_chain(chain, pools, "gpuos", lv)
            except gpuos.GpuosError as e:  # the runtime is in trouble (a timeout, a driver error): stop here
                res["runtime_error"] = {"chain": idx, "seed": cseed, "error": f"{type(e).__name__}: {str(e)[:2000]}",
                                        "traceback": traceback.format_exc()[-3000:]}
                try:  # host-side counters: safe to read with the GPU stuck
                    res["runtime_error"]["stats"] = {k: v for k, v in gpuos.stats().items()
                                                     if isinstance(v, (int, float)) and v}
                except Exception as e2:  # noqa: BLE001
                    res["runtime_error"]["stats"] = repr(e2)
                log(f"soak: runtime error in chain {idx}: {type(e).__name__}: {e}\nstats: "
                    f"{res['runtime_error']['stats']}")
                break
            except Exception as e:  # noqa: BLE001 -- eager ran this chain: gpuos raising is a difference
                raised = f"{type(e).__name__}: {str(e)[:500]}"
                env_g = [None] * chain.slots
            res["ops"] += chain.n_ops
            res["chains"] += 1
            dn = str(chain.dtype).replace("torch.", "")
            res["dtypes"][dn] = res["dtypes"].get(dn, 0) + chain.n_ops
            for ins, lab in zip(chain.prog, chain.labels):
                if ins[0] == CALL or ins[0] == CAST:
                    f = _form_of(lab)
                    forms[f] = forms.get(f, 0) + 1
            if raised is not None:
                res["raised"] += 1
                res["mismatch_chains"] += 1
                res["mismatches"] += 1
                if len(res["mismatch_details"]) < details:
                    info = {"chain": idx, "seed": cseed, "raised": raised, "program": listing(chain, pools)}
                    res["mismatch_details"].append(info)
                    log(f"soak: chain {idx} raised under the scheduler:\n" + json.dumps(info, indent=1, default=str))
                continue
            fault = None
            if inject_fault and idx % inject_fault == 0:
                fault = _inject(env_g)
                res["injected"] += fault is not None
            cnt, meta_bad = quick_count(env_g, env_e)
            if cnt is None:
                cnt = torch.zeros((), dtype=torch.int64, device=device)
            pending.append((chain, env_g, env_e, meta_bad, cnt, idx, fault))
            if len(pending) >= check_every:
                settle()
            now = _now()
            if now - last >= progress_s:
                last = now
                el = now - t0
                log(f"soak: {res['ops']:,}/{n_ops:,} ops, {res['chains']:,} chains, {el:.0f} s, "
                    f"{1e6 * el / max(res['ops'], 1):.1f} us/op, mismatches {res['mismatches']}, "
                    f"drift chains {res['drift_chains']}")
            if max_seconds is not None and now - t0 > max_seconds:
                res["truncated"] = True
                break
        if "runtime_error" in res:  # streams may wait for work that never completes: no sync, no checks
            res["seconds"] = round(_now() - t0, 2)
            res["ok"] = False
            return res
        settle()
    if device != "cpu":
        torch.cuda.synchronize()
    res["seconds"] = round(_now() - t0, 2)
    res["us_per_op"] = round(1e6 * res["seconds"] / max(res["ops"], 1), 2)
    d = _delta(c0, _sched_counters())
    res["counters"] = d
    res["intercepted"] = d["ops_intercepted"]
    res["fallbacks"] = sum(d["fallbacks"].values())
    res["intercepted_fraction"] = round(d["ops_intercepted"] / max(res["ops"], 1), 4)
    res["fallback_fraction"] = round(res["fallbacks"] / max(res["ops"], 1), 4)
    res["eager_rejected_ops"] = gen.rejected
    res["reproduce"] = (f"_reliability.rebuild_chain(seed, pool_seed={seed}, device={device!r}, "
                        f"chain_len={tuple(chain_len)}) with a detail's seed")
    res["ok"] = res["mismatches"] == 0 and res["ops"] >= n_ops and "runtime_error" not in res
    return res


_FOREIGN = ("where", "to(", "clone", "contiguous", "cumsum", "mm", "item", "gpuos.flush", "gt.")
_VIEWS = ("unsqueeze", "reshape", "transpose", "t()", "[", "expand")
_REDUCE = ("sum.", "mean.", "amax", "amin", "softmax", "log_softmax")


def _form_of(label):
    """The soak's op categories (for its coverage counts)."""
    if label.startswith(_FOREIGN):
        return "foreign"
    if label.startswith(_VIEWS):
        return "view"
    if ".out" in label:
        return "out"
    if label.endswith("_"):
        return "inplace"
    if label.startswith(_REDUCE):
        return "reduce"
    if ".Scalar" in label or label.startswith("rdiv"):
        return "scalar"
    return "functional"


def rebuild_chain(seed, pool_seed=0, device="cuda", chain_len=(10, 50)):
    """The chain a soak (pool_seed = its seed) or the stress (pool_seed = its seed, chain_len (5, 25)) ran under
    `seed` (a mismatch detail's "seed"): (chain, eager slots, pools). Replay it with run_chain; print listing()."""
    pools = Pools(device, pool_seed)
    rng = random.Random(seed)
    chain, env_e = ChainGen(pools).build(rng, rng.randint(*chain_len), seed=seed)
    return chain, env_e, pools


def _inject(env_g):
    """Self-test fault: one element of one float result off by 1 + 10 % (out of place: the tensor is replaced)."""
    for i, t in enumerate(env_g):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel() > 0:
            w = t.clone()
            flat = w.view(-1) if w.is_contiguous() else None
            if flat is None:
                continue
            flat[flat.numel() // 2] += 1.0 + 0.1 * flat[flat.numel() // 2].abs()
            env_g[i] = w
            return f"slot {i} element {flat.numel() // 2}"
    return None


# ================================================================================================ hang bounds
class Watch:
    """Bounds on blocking calls. ``with watch.call(what, bound):`` around a call; a monitor thread records a hang
    as soon as one runs past its bound (and dumps every thread's stack once); a call that returns late is recorded
    when it returns. A hang is counted once, for the innermost call (its enclosing calls are not counted again)."""

    def __init__(self, log=print):
        self.lock = threading.Lock()
        self.stacks = {}  # thread ident -> [[what, t0, bound, flagged]]
        self.hangs = []
        self.log = log
        self.dumped = False
        self._stop = threading.Event()
        self._thread = None

    @contextlib.contextmanager
    def call(self, what, bound):
        me = threading.get_ident()
        rec = [what, _now(), bound, False, threading.current_thread().name]
        with self.lock:
            st = self.stacks.setdefault(me, [])
            st.append(rec)
        try:
            yield
        finally:
            el = _now() - rec[1]
            with self.lock:
                st.pop()
                if el > bound and not rec[3]:
                    self._flag(st + [rec], el, finished=True)

    def _flag(self, stack, elapsed, finished):
        rec = stack[-1]
        for r in stack:
            r[3] = True
        h = {"thread": rec[4], "call": rec[0], "bound_s": rec[2], "elapsed_s": round(elapsed, 2),
             "finished": finished, "inside": [r[0] for r in stack[:-1]]}
        self.hangs.append(h)
        self.log(f"HANG: {json.dumps(h)}")

    def scan(self):
        now = _now()
        dump = False
        with self.lock:
            for st in self.stacks.values():
                for rec in st:
                    if not rec[3] and now - rec[1] > rec[2]:
                        # the innermost overdue call
                        k = max(i for i in range(len(st)) if now - st[i][1] > st[i][2])
                        self._flag(st[:k + 1], now - st[k][1], finished=False)
                        dump = True
                        break
        if dump and not self.dumped:
            self.dumped = True
            print("=== every thread's stack (a call passed its bound) ===", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)

    def start(self):
        def loop():
            while not self._stop.wait(0.25):
                self.scan()
        self._thread = threading.Thread(target=loop, name="reliability-watch", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def active(self):
        now = _now()
        with self.lock:
            return [{"thread": r[4], "call": r[0], "running_s": round(now - r[1], 1)}
                    for st in self.stacks.values() for r in st]


def bounded(what, fn, timeout, watch=None):
    """Run fn() in a daemon thread joined with `timeout`: (ok, value or exception text). A call still running is a
    hang (recorded in watch if given); it is left behind (a daemon)."""
    box = {}

    def run():
        try:
            box["v"] = fn()
        except BaseException as e:  # noqa: BLE001 -- reported
            box["e"] = f"{type(e).__name__}: {str(e)[:800]}"
            box["tb"] = traceback.format_exc()[-3000:]

    t = threading.Thread(target=run, name="bounded:" + what, daemon=True)
    t0 = _now()
    t.start()
    t.join(timeout)
    if t.is_alive():
        if watch is not None:
            with watch.lock:
                watch._flag([[what, t0, timeout, False, t.name]], _now() - t0, finished=False)
        print(f"=== stacks: {what} did not return within {timeout:.1f} s ===", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
        return False, f"no return within {timeout:.1f} s"
    if "e" in box:
        return False, box["e"] + "\n" + box["tb"]
    return True, box.get("v")


class _RW:
    """Many activities at once (shared), or one alone (exclusive: the rejected-call checks compare the global
    pending state before and after); a waiting exclusive holder blocks new shared ones."""

    def __init__(self):
        self.c = threading.Condition()
        self.readers = 0
        self.writer = False
        self.waiting = 0

    def acquire(self, exclusive, timeout):
        """False when not acquired within `timeout` (another holder is stuck: its own bound reports it)."""
        end = _now() + timeout
        with self.c:
            if exclusive:
                self.waiting += 1
                try:
                    while self.writer or self.readers:
                        left = end - _now()
                        if left <= 0:
                            return False
                        self.c.wait(left)
                    self.writer = True
                    return True
                finally:
                    self.waiting -= 1
                    self.c.notify_all()  # shared holders held back by this waiter may go on
            while self.writer or self.waiting:
                left = end - _now()
                if left <= 0:
                    return False
                self.c.wait(left)
            self.readers += 1
            return True

    def release(self, exclusive):
        with self.c:
            if exclusive:
                self.writer = False
            else:
                self.readers -= 1
            self.c.notify_all()


# ================================================================================================ stress
class _StressError(Exception):
    """Raised inside scheduler contexts on purpose: must come out unchanged."""


class _Stress:
    ACTIVITIES = ("chain", "explicit", "bad_inputs", "raise_in_ctx", "sync", "gemm_mix", "hot_chain", "nested")
    WEIGHTS = (30, 18, 4, 6, 5, 10, 8, 6)

    def __init__(self, seconds, threads, seed, device, log, activities=None, register=True):
        import gpuos
        import gpuos_ext
        self.gpuos, self.gx = gpuos, gpuos_ext
        self.seconds, self.nthreads, self.seed, self.dev, self.log = seconds, threads, seed, device, log
        self.acts = tuple(a for a in self.ACTIVITIES if activities is None or a in activities)
        self.weights = tuple(w for a, w in zip(self.ACTIVITIES, self.WEIGHTS) if a in self.acts)
        self.register = register
        T_ = timeout_s()
        self.block_s = 2 * T_ + 10     # one blocking call (a runtime wait raises after T_; a flush may wait twice)
        self.activity_s = 3 * T_ + 30  # one whole activity
        self.compile_s = max(300.0, 3 * T_)
        self.lock = threading.Lock()
        self.rw = _RW()
        self.watch = Watch(log)
        self.stop = threading.Event()
        self.iters = {}
        self.expected = {}
        self.info = {}
        self.mismatches, self.errors, self.drift = [], [], []
        self.n_mismatch = self.n_error = self.n_drift = 0
        self.inj = {"registered": [], "switches": 0, "rows_checked": 0}
        self.pools = None
        self.injector_waiting = False

    # ---------------------------------------------------------------- bookkeeping
    def count(self, what, d=None):
        with self.lock:
            (self.iters if d is None else d)[what] = (self.iters if d is None else d).get(what, 0) + 1

    def mismatch(self, what, detail):
        with self.lock:
            self.n_mismatch += 1
            if len(self.mismatches) < 10:
                self.mismatches.append({"activity": what, "thread": threading.current_thread().name, **detail})
        self.log(f"MISMATCH in {what}: {json.dumps(detail, default=str)[:4000]}")

    def error(self, what, e, tb=None):
        with self.lock:
            self.n_error += 1
            if len(self.errors) < 10:
                self.errors.append({"activity": what, "thread": threading.current_thread().name,
                                    "error": f"{type(e).__name__}: {str(e)[:800]}",
                                    "traceback": (tb or traceback.format_exc())[-3000:]})
        self.log(f"ERROR in {what}: {type(e).__name__}: {str(e)[:800]}")

    def close(self, what, got, exp, rtol=0.0, atol=0.0):
        """Compare (a host sync); a difference is a mismatch with the first bad element."""
        with self.watch.call(f"{what}: compare (host read)", self.block_s):
            if got.shape != exp.shape or got.dtype != exp.dtype:
                self.mismatch(what, {"why": f"gpuos {_meta(got)} vs eager {_meta(exp)}"})
                return False
            ok = torch.isclose(got.double(), exp.double(), rtol=rtol, atol=atol, equal_nan=True).all()
            if bool(ok):
                return True
        d = _first_bad(got, exp) if got.dtype.is_floating_point else {}
        self.mismatch(what, {"tensor": _meta(got), "rtol": rtol, "atol": atol,
                             **{k: v for k, v in d.items()}, "max_abs_diff": d.get("max_abs_diff")})
        return False

    def ctx(self, tc, **kw):
        r = tc.rng
        kw.setdefault("auto_flush_ms", r.choice([0.0, 0.5, 2.0]))
        if r.random() < 0.15:
            kw.setdefault("front", False)
        if r.random() < 0.08:
            kw.setdefault("size_threshold", 1024)
        return self.gpuos.scheduler_context(**kw)

    def randn(self, tc, *shape, dtype=F32, scale=1.0):
        return (torch.randn(*shape, device=self.dev, generator=tc.g) * scale).to(dtype)

    # ---------------------------------------------------------------- activities
    def a_chain(self, tc):
        r = tc.rng
        cseed = r.randrange(1 << 30)
        crng = random.Random(cseed)  # rebuild_chain(cseed, pool_seed=seed, chain_len=(5, 25)) gives it back
        chain, env_e = tc.gen.build(crng, crng.randint(5, 25), seed=cseed)
        kw = {"auto_flush_ms": r.choice([0.0, 0.5, 2.0])}
        lv = make_leaves(chain, self.pools, "gpuos")
        try:
            with self.watch.call("chain: scheduler context (ops + exit flush)", self.block_s):
                with self.gpuos.scheduler_context(**kw):
                    env_g = run_chain(chain, self.pools, "gpuos", lv)
        except self.gpuos.GpuosError:
            raise
        except Exception as e:  # noqa: BLE001 -- eager ran this chain
            self.mismatch("chain raised under the scheduler", {"seed": cseed, "error": f"{type(e).__name__}: {e}",
                                                               "program": listing(chain, self.pools)})
            return
        cnt, meta_bad = quick_count(env_g, env_e)
        with self.watch.call("chain: compare (host read)", self.block_s):
            n = int(cnt) if cnt is not None else 0
        if n or meta_bad:
            verdict, info = diagnose(chain, env_g, env_e, self.pools, kw)
            if verdict == "mismatch":
                self.mismatch("chain", info)
            elif verdict == "drift":
                with self.lock:
                    self.n_drift += 1
                    if len(self.drift) < 3:
                        self.drift.append(info)

    def a_explicit(self, tc):
        r, gx, gp = tc.rng, self.gx, self.gpuos
        dt = r.choice(FLOATS)
        shape = r.choice([(4096,), (1000,), (64, 64), (33, 65), (7,)])
        a, b = self.randn(tc, *shape, dtype=dt), self.randn(tc, *shape, dtype=dt)
        if len(shape) == 2 and r.random() < 0.3:  # a transposed operand
            a = self.randn(tc, shape[1], shape[0], dtype=dt).t()
        out = torch.full(shape, math.nan, device=self.dev, dtype=dt)
        kind = r.choice(["add", "sub", "mul", "div", "many", "gelu", "bcast", "reduce", "softmax", "mid_bad"])
        tol = (0.0, 0.0)
        if kind == "add":
            gx.submit_add(a, b, out)
            exp = a + b
        elif kind == "sub":
            gx.submit_sub(a, b, out)
            exp = a - b
        elif kind == "mul":
            gx.submit_mul(a, b, out)
            exp = a * b
        elif kind == "div":
            b = b.abs() + 0.5
            gx.submit_div(a, b, out)
            exp = a / b
        elif kind == "many":
            outs = [torch.full(shape, math.nan, device=self.dev, dtype=dt) for _ in range(3)]
            bs = [self.randn(tc, *shape, dtype=dt) for _ in range(3)]
            gx.submit_many("mul", [a] * 3, bs, outs)
            exp = torch.stack([a * x for x in bs])
        elif kind == "gelu":
            gp.submit("gelu", [a], out)
            exp = F.gelu(a.float()).to(dt)
            tol = {F32: (1e-4, 1e-5), F16: (2e-3, 1e-3), BF16: (1.6e-2, 1e-2)}[dt]
        elif kind == "bcast":
            row = self.randn(tc, shape[-1], dtype=dt)
            gp.submit("add", [a, row], out, alpha=0.5)
            exp = torch.add(a.float(), row.float(), alpha=0.5).to(dt)
            tol = {F32: (1e-6, 1e-6), F16: (1e-3, 1e-3), BF16: (1e-2, 1e-2)}[dt]
        elif kind in ("reduce", "softmax"):
            x = self.randn(tc, 16, 256, dtype=dt)
            if kind == "reduce":
                out = torch.full((16,), math.nan, device=self.dev, dtype=dt)
                gp.submit_reduce("sum", x, out)
                exp = x.float().sum(-1).to(dt)
                tol = {F32: (1e-5, 1e-4), F16: (2e-3, 2e-2), BF16: (1.6e-2, 1e-1)}[dt]
            else:
                out = torch.full((16, 256), math.nan, device=self.dev, dtype=dt)
                gp.submit_reduce("softmax", x, out)
                exp = torch.softmax(x.float(), -1).to(dt)
                tol = {F32: (1e-5, 1e-6), F16: (2e-3, 1e-4), BF16: (1.6e-2, 1e-3)}[dt]
        else:  # mid_bad: a rejected call between two good ones records nothing of its own
            gx.submit_add(a, b, out)
            try:
                gx.submit_add(a, b[..., :1] if b.dim() else b, torch.empty_like(out))
                if shape[-1] != 1:
                    self.mismatch("explicit mid_bad", {"why": "a shape-mismatched submit_add raised nothing"})
            except ValueError:
                self.count("explicit mid_bad ValueError", self.expected)
            out2 = torch.full(shape, math.nan, device=self.dev, dtype=dt)
            gx.submit_mul(a, b, out2)
            with self.watch.call("explicit: flush(sync=True)", self.block_s):
                gx.flush(sync=True)
            self.close("explicit mid_bad (mul after the rejected call)", out2, a * b)
            exp = a + b
            kind = "mid_bad"
        if kind != "mid_bad":
            if r.random() < 0.3:  # stream-ordered flush, then a stream sync
                with self.watch.call("explicit: flush() + stream sync", self.block_s):
                    gx.flush()
                    torch.cuda.current_stream().synchronize()
            else:
                with self.watch.call("explicit: flush(sync=True)", self.block_s):
                    gx.flush(sync=True)
        if kind == "many":
            out = torch.stack(outs)  # after the flush: stack reads the outputs
        self.close(f"explicit {kind} {dt}", out, exp, *tol)

    def a_bad_inputs(self, tc):
        """Rejected calls: each raises its typed error and leaves the global pending state unchanged (this
        activity runs alone: no other thread records meanwhile)."""
        gx = self.gx
        x = torch.randn(16, device=self.dev)
        cases = [
            ("cpu tensor", TypeError, lambda: gx.submit_add(torch.ones(4), torch.ones(4), torch.empty(4))),
            ("shape mismatch", ValueError,
             lambda: gx.submit_add(torch.randn(16, device=self.dev), torch.randn(8, device=self.dev),
                                   torch.empty(16, device=self.dev))),
            ("int64", TypeError,
             lambda: gx.submit_add(torch.arange(8, device=self.dev), torch.arange(8, device=self.dev),
                                   torch.empty(8, device=self.dev, dtype=torch.int64))),
            ("partial overlap", ValueError, lambda: gx.submit_add(x[0:8], x[0:8], x[4:12])),
            ("submit_mul cpu out", (TypeError, ValueError), lambda: gx.submit_mul(x, x, torch.empty(16))),
        ]
        tc.rng.shuffle(cases)

        def state():
            s = gx.stats()
            return (gx.pending(), gx.sched_stats()["deferred"], s["submitted"], s["subops"])
        before = state()
        for name, exc, call in cases[:tc.rng.randint(1, len(cases))]:
            want = exc.__name__ if isinstance(exc, type) else "/".join(x.__name__ for x in exc)
            try:
                call()
            except exc as e:
                self.count(f"bad input: {name} -> {type(e).__name__}", self.expected)
                continue
            except Exception as e:  # noqa: BLE001
                self.mismatch("bad_inputs", {"case": name, "why": f"expected {want}, got "
                                             f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            self.mismatch("bad_inputs", {"case": name, "why": f"no {want} raised"})
        after = state()
        if after != before:
            self.mismatch("bad_inputs", {"why": "rejected calls changed (pending, deferred, submitted, subops)",
                                         "before": before, "after": after})
        if before[0] or before[1]:
            self.count("work pending while every other activity was paused", self.info)
        # a bad op inside a scheduler context: torch's own error, and the context goes on
        a = self.randn(tc, 64)
        try:
            with self.ctx(tc):
                y = a * 2
                try:
                    torch.add(a, torch.ones(64))  # CUDA + CPU: eager raises (after the deferred work it depends on)
                    self.mismatch("bad_inputs", {"why": "cuda + cpu tensor add raised nothing"})
                except RuntimeError:
                    self.count("bad input in context -> RuntimeError", self.expected)
                z = y + 1
        except Exception as e:  # noqa: BLE001
            self.error("bad_inputs (in context)", e)
            return
        self.close("bad op inside a context", z, a * 2 + 1)

    def a_raise_in_ctx(self, tc):
        r = tc.rng
        x = self.randn(tc, r.choice([4096, 1000, 64]))
        err = _StressError(r.randrange(1 << 30))
        variant = r.choice(["plain", "after_fallback", "nested_inner"])
        y = None
        try:
            with self.watch.call("raise_in_ctx: context exit", self.block_s):
                if variant == "nested_inner":
                    with self.ctx(tc):
                        y = x * 2 + 1
                        try:
                            with self.ctx(tc):
                                y2 = torch.tanh(y)
                                raise err
                        except _StressError as e:
                            if e is not err:
                                self.mismatch("raise_in_ctx", {"why": "inner exception replaced", "got": repr(e)})
                        y = y2 * 0.5
                        raise err
                with self.ctx(tc):
                    y = x * 2 + 1
                    if variant == "after_fallback":
                        y = torch.cumsum(y, 0) * 0.5  # an eager op on deferred work, then a recorded one
                    raise err
        except _StressError as e:
            if e is not err or e.args != err.args:
                self.mismatch("raise_in_ctx", {"why": "exception changed on its way out", "got": repr(e)})
        except Exception as e:  # noqa: BLE001
            self.mismatch("raise_in_ctx", {"why": f"{type(e).__name__} instead of the raised _StressError",
                                           "error": str(e)[:500]})
            return
        else:
            self.mismatch("raise_in_ctx", {"why": "the exception did not propagate"})
            return
        if variant == "nested_inner":
            exp = torch.tanh(x * 2 + 1) * 0.5
        elif variant == "after_fallback":
            exp = torch.cumsum(x * 2 + 1, 0) * 0.5
        else:
            exp = x * 2 + 1
        self.close(f"raise_in_ctx {variant}: result of the ops before the raise", y, exp, 1e-5, 1e-5)

    def a_sync(self, tc):
        r = tc.rng
        k = r.choice(["synchronize", "empty_cache", "in_ctx_sync", "in_ctx_empty_cache", "stream_sync"])
        if k == "synchronize":
            with self.watch.call("torch.cuda.synchronize()", self.block_s):
                torch.cuda.synchronize()
        elif k == "empty_cache":
            with self.watch.call("torch.cuda.empty_cache()", self.block_s):
                torch.cuda.empty_cache()
        elif k == "stream_sync":
            with self.watch.call("current_stream().synchronize()", self.block_s):
                torch.cuda.current_stream().synchronize()
        else:
            x = self.randn(tc, 4096)
            with self.watch.call(f"{k}: context", self.block_s):
                with self.ctx(tc):
                    y = x * 3
                    if k == "in_ctx_sync":
                        torch.cuda.synchronize()
                    else:
                        torch.cuda.empty_cache()
                    z = torch.sigmoid(y) + 1
            self.close(k, z, torch.sigmoid(x * 3) + 1, 1e-5, 1e-6)
        self.count(k, self.info)

    def a_gemm_mix(self, tc):
        A, B, C, bias = tc.gemm
        with self.watch.call("gemm_mix: context", self.block_s):
            with self.ctx(tc):
                h = A @ B                         # heavy: the worker yields
                s = h[:32] * 0.5 + bias           # recorded (16,384 elements)
                m = s @ C                         # eager, depends on deferred s: a dependency flush
                t = torch.sigmoid(m) * 2 - 1      # recorded
                u = torch.cumsum(t, -1)           # foreign kernel on deferred work
                v = torch.softmax(u, -1)          # recorded reduction
                w = F.layer_norm(s, (s.shape[-1],))  # foreign, on deferred s
                srt = torch.sort(t, -1).values    # foreign
                o = (w[:, :64] * v[:, :1]).sum(-1)  # recorded
        h_e = A @ B
        s_e = h_e[:32] * 0.5 + bias
        m_e = s_e @ C
        t_e = torch.sigmoid(m_e) * 2 - 1
        u_e = torch.cumsum(t_e, -1)
        v_e = torch.softmax(u_e, -1)
        w_e = F.layer_norm(s_e, (s_e.shape[-1],))
        o_e = (w_e[:, :64] * v_e[:, :1]).sum(-1)
        for name, g, e in (("s", s, s_e), ("t", t, t_e), ("v", v, v_e), ("w", w, w_e),
                           ("sort", srt, torch.sort(t_e, -1).values), ("o", o, o_e)):
            if not self.close(f"gemm_mix {name}", g, e, 1e-3, 1e-4):
                break

    def a_hot_chain(self, tc):
        a, exp = tc.hot
        k = tc.rng.randint(10, 80)
        keep = tc.rng.randrange(k)
        kept = None
        with self.watch.call("hot_chain: context", self.block_s):
            with self.ctx(tc):
                for i in range(k):
                    b = torch.tanh(a) * 0.5 + a
                    if i == keep:
                        kept = b
        self.close("hot_chain (last)", b, exp, 1e-5, 1e-5)
        self.close("hot_chain (kept)", kept, exp, 1e-5, 1e-5)

    def a_nested(self, tc):
        r = tc.rng
        x = self.randn(tc, 32, 128)
        s = self.ctx(tc)
        with self.watch.call("nested: contexts", self.block_s):
            with s:
                y = x * 2
                with (s if r.random() < 0.5 else self.ctx(tc)):  # the same instance re-entered, or another
                    z = y + 1
                self.gpuos.flush()          # explicit flush inside a context
                v = z.sum(-1)[0].item()     # host read of deferred work
                w = z * y
        self.close("nested w", w, (x * 2 + 1) * (x * 2), 1e-6, 1e-6)
        ev = float((x * 2 + 1).sum(-1)[0])
        if not math.isclose(v, ev, rel_tol=1e-4, abs_tol=1e-3):
            self.mismatch("nested item", {"got": v, "eager": ev})

    # ---------------------------------------------------------------- injection (thread 0)
    def inj_register(self, tc, which):
        gp = self.gpuos
        name = f"stress_{which}_{os.getpid()}_{self.seed}"
        try:
            with self.watch.call(f"register {name} (quick check; compile in the background)", self.block_s):
                with gp.batch_install(wait=False):
                    if which == "sw":
                        gp.register_elementwise(name, "a + b", arity=2)
                        gp.install(name, "a - b", slot=1)
                    else:
                        gp.register_elementwise(name, "a * 0.5f + 1.0f", arity=1)
        except Exception as e:  # noqa: BLE001
            self.error(f"register {which}", e)
            return
        self.inj["registered"].append({"name": name, "kind": which, "t": round(_now() - self.t0, 1)})
        tc.inj_pending.append((name, which, _now()))

    def inj_poll(self, tc):
        """Pending registrations: ready -> usable; past the compile bound -> a hang."""
        if not tc.inj_pending:
            return
        ops = {o["name"]: o for o in self.gpuos.user_ops()}
        for item in list(tc.inj_pending):
            name, which, t0 = item
            st = ops.get(name, {}).get("state")
            if st == "ready":
                tc.inj_pending.remove(item)
                tc.inj_ready[which] = name
                self.inj.setdefault("ready", {})[name] = round(_now() - t0, 1)
            elif st == "failed":
                tc.inj_pending.remove(item)
                self.error(f"register {name}", RuntimeError(ops[name].get("error", "failed")))
            elif _now() - t0 > self.compile_s:
                tc.inj_pending.remove(item)
                with self.watch.lock:
                    self.watch._flag([[f"generation compile of {name}", t0, self.compile_s, False, "gen"]],
                                     _now() - t0, finished=False)

    def a_inj(self, tc):
        """The switched op: rows of one sub-op each, a switch between two of them; after the flush every row is
        wholly old (a + b) or new (a - b), and rows recorded after switch() returned are new."""
        gp, gx, r = self.gpuos, self.gx, tc.rng
        name = tc.inj_ready.get("sw")
        if name is not None:
            rows = r.choice([8, 32, 64])
            a = self.randn(tc, rows, 256)
            b = torch.rand(rows, 256, device=self.dev, generator=tc.g) + 0.5
            out = torch.full((rows, 256), math.nan, device=self.dev)
            cur = tc.inj_slot
            at = r.randrange(rows)
            for i in range(rows):
                if i == at:
                    with self.watch.call("switch() / rollback()", self.block_s):
                        if cur == 1 and r.random() < 0.4:
                            now = gp.rollback(name)  # returns the slot now active
                            if now != 0:
                                self.mismatch("inj", {"why": f"rollback() made slot {now} active, expected 0"})
                        else:
                            prev = gp.switch(name, 1 - cur)  # returns the previous slot
                            if prev != cur:
                                self.mismatch("inj", {"why": f"switch() returned {prev}, the active slot was {cur}"})
                    cur = 1 - cur
                    tc.inj_slot = cur
                    self.inj["switches"] += 1
                gp.submit(name, [a[i], b[i]], out[i])
            with self.watch.call("inj: flush(sync=True)", self.block_s):
                gx.flush(sync=True)
            old, new = (a + b, a - b) if cur == 1 else (a - b, a + b)  # new = the slot active after the switch
            is_old = (out == old).all(1)
            is_new = (out == new).all(1)
            bad = ~(is_old | is_new)
            late_old = ~is_new[at:]
            if bool(bad.any()) or bool(late_old.any()):
                i = int(bad.nonzero()[0]) if bool(bad.any()) else at + int(late_old.nonzero()[0])
                self.mismatch("inj switch", {"row": i, "switched_before_row": at, "active_slot_after": cur,
                                             "nan": int(out[i].isnan().sum()),
                                             "old_elems": int((out[i] == old[i]).sum()),
                                             "new_elems": int((out[i] == new[i]).sum()), "of": 256})
            self.inj["rows_checked"] += rows
        name = tc.inj_ready.get("f")
        if name is not None:
            dt = r.choice(FLOATS)
            x = self.randn(tc, 1000, dtype=dt)
            o = torch.full((1000,), math.nan, device=self.dev, dtype=dt)
            gp.submit(name, [x], o)
            with self.watch.call("inj f: flush(sync=True)", self.block_s):
                gx.flush(sync=True)
            self.close(f"injected {name} {dt}", o, (x.float() * 0.5 + 1.0).to(dt), 1e-3 if dt != F32 else 0.0, 0.0)

    # ---------------------------------------------------------------- threads
    def thread_main(self, i):
        tc = _TC()
        tc.rng = random.Random(self.seed * 7919 + i)
        tc.g = torch.Generator(device=self.dev)
        tc.g.manual_seed(self.seed * 7919 + i)
        tc.gen = ChainGen(self.pools)
        tc.inj_pending, tc.inj_ready, tc.inj_slot = [], {}, 0
        if self.device_index is not None:
            torch.cuda.set_device(self.device_index)
        with torch.no_grad():
            A = self.randn(tc, 512, 512, scale=512 ** -0.25)
            B = self.randn(tc, 512, 512, scale=512 ** -0.25)
            C = self.randn(tc, 512, 64, scale=512 ** -0.5)
            tc.gemm = (A, B, C, self.randn(tc, 512))
            a = self.randn(tc, 4096)
            tc.hot = (a, torch.tanh(a) * 0.5 + a)
            injector = i == 0 and self.register
            second_at = self.t0 + self.seconds / 2 if self.seconds >= 40 else None
            if injector:
                self.inj_register(tc, "sw")
            end = self.t0 + self.seconds
            while _now() < end and not self.stop.is_set():
                if injector:
                    self.inj_poll(tc)
                    if second_at is not None and _now() >= second_at:
                        second_at = None
                        self.inj_register(tc, "f")
                acts, ws = self.acts, self.weights
                if injector and tc.inj_ready:
                    acts, ws = acts + ("inj",), ws + (15,)
                act = tc.rng.choices(acts, ws)[0]
                exclusive = act == "bad_inputs"
                if not self.rw.acquire(exclusive, self.activity_s):
                    self.error(act, TimeoutError(f"could not start {act} within {self.activity_s:.0f} s "
                                                 f"(another activity holds the lock)"), tb="")
                    continue
                try:
                    with self.watch.call(f"activity {act}", self.activity_s):
                        getattr(self, "a_" + act)(tc)
                    self.count(act)
                except Exception as e:  # noqa: BLE001 -- an error that is not an expected typed one
                    self.error(act, e)
                    if isinstance(e, self.gpuos.GpuosError):
                        self.stop.set()  # the runtime failed: the final checks tell whether it recovers
                finally:
                    self.rw.release(exclusive)
            if injector:  # registrations still compiling: wait (bounded) so the result says if they ever finish
                self.injector_waiting = bool(tc.inj_pending)
                while tc.inj_pending and not self.stop.is_set():
                    self.inj_poll(tc)
                    time.sleep(0.2)
                self.injector_waiting = False

    def run(self):
        gx = self.gx
        gpu = self.dev != "cpu"  # cpu: a dry run of the machinery (scheduler contexts fall back to eager)
        self.device_index = torch.cuda.current_device() if gpu else None
        if gpu:
            ok, v = bounded("init()", gx.init, 300.0, self.watch)
            if not ok:
                return {"ok": False, "error": f"init() failed: {v}"}
        self.pools = Pools(self.dev, self.seed)
        errors = []
        orig_hook = threading.excepthook

        def hook(args):
            errors.append({"thread": args.thread.name if args.thread else "?", "type": args.exc_type.__name__,
                           "msg": str(args.exc_value)[:800]})
            orig_hook(args)
        threading.excepthook = hook
        self.watch.start()
        self.t0 = _now()
        threads = [threading.Thread(target=self.thread_main, args=(i,), name=f"stress-{i}", daemon=True)
                   for i in range(self.nthreads)]
        for t in threads:
            t.start()
        # wait for the threads: their last activity may take up to its bound, the injector may wait for a
        # generation compile; a thread stuck in a call flagged as a hang is not waited for beyond that
        end = self.t0 + self.seconds + self.activity_s
        end_inj = end + self.compile_s
        while True:
            alive = [t for t in threads if t.is_alive()]
            if not alive:
                break
            if self.watch.hangs:
                self.stop.set()
                hung = {h["thread"] for h in self.watch.hangs if not h["finished"]}
                if all(t.name in hung for t in alive):
                    break
            now = _now()
            if now > end_inj or (now > end and not (threads[0].is_alive() and self.injector_waiting)):
                break
            time.sleep(0.1)
        stuck = [t.name for t in threads if t.is_alive()]
        elapsed = _now() - self.t0
        if stuck:
            self.stop.set()
            self.log(f"threads still running after the run: {stuck}; active calls: {self.watch.active()}")
            self.watch.scan()
        self.watch.stop()
        timers = [t.name for t in threading.enumerate() if t.name == "gpuos-flush-timer"]
        final = self.final_checks() if gpu else {"ok": True, "skipped": "cpu dry run"}
        threading.excepthook = orig_hook
        res = {
            "seconds": round(elapsed, 1), "threads": self.nthreads, "seed": self.seed,
            "iterations": dict(sorted(self.iters.items())), "total_iterations": sum(self.iters.values()),
            "expected_errors": dict(sorted(self.expected.items())), "info": self.info,
            "mismatches": self.n_mismatch, "mismatch_details": self.mismatches,
            "drift_chains": self.n_drift, "drift_details": self.drift,
            "hangs": len(self.watch.hangs), "hang_details": self.watch.hangs[:20],
            "errors": self.n_error + len(errors), "error_details": self.errors, "thread_errors": errors,
            "stuck_threads": stuck, "timer_threads_left": timers, "injection": self.inj, "final": final,
            "bounds_s": {"call": self.block_s, "activity": self.activity_s, "compile": self.compile_s,
                         "gpuos_timeout_s": timeout_s()},
        }
        res["ok"] = (not res["mismatches"] and not res["hangs"] and not res["errors"] and not stuck
                     and not timers and final.get("ok", False))
        return res

    def final_checks(self):
        gx, gp = self.gx, self.gpuos
        out = {}
        n = 4096
        x = torch.randn(n, device=self.dev)
        y = torch.randn(n, device=self.dev)

        def add_check():
            o = torch.full((n,), math.nan, device=self.dev)
            gx.submit_add(x, y, o)
            gx.flush(sync=True)
            return bool(torch.equal(o, x + y))

        def sched_check():
            with gp.scheduler_context(auto_flush_ms=0):
                z = torch.tanh(x) * 0.5 + y
            torch.cuda.synchronize()
            return bool(torch.allclose(z, torch.tanh(x) * 0.5 + y, rtol=1e-5, atol=1e-5))

        def shutdown():
            gx.shutdown()
            return not gx.is_initialized()
        ok, v = bounded("stats()", lambda: dict(gp.stats()), 20.0, self.watch)
        out["stats_at_end"] = v if ok else f"stats() failed: {v}"
        steps = [("submit_add + flush(sync=True)", add_check, self.block_s),
                 ("scheduler context", sched_check, self.block_s),
                 ("shutdown()", shutdown, self.block_s),
                 ("init() again", lambda: gx.init() or gx.is_initialized(), 300.0),
                 ("submit_add after re-init", add_check, self.block_s),
                 ("final shutdown()", shutdown, self.block_s)]
        all_ok = True
        for what, fn, bound in steps:
            t0 = _now()
            ok, v = bounded(what, fn, bound, self.watch)
            out[what] = {"ok": ok and v is True, "seconds": round(_now() - t0, 2),
                         **({} if ok and v is True else {"detail": v})}
            if not (ok and v is True):
                all_ok = False
                self.log(f"FINAL CHECK FAILED: {what}: {v}")
                if not ok:
                    break
        out["ok"] = all_ok
        return out


class _TC:
    """Per-thread state of the stress."""


def stress(seconds=60.0, threads=6, seed=0, device="cuda", activities=None, register=True, log=print):
    """Threads mixing every kind of call for `seconds` (see the module docstring and _Stress). Returns counts of
    iterations per activity, mismatches (first ones in detail), hangs (calls past their bound), errors that were
    not the expected typed ones, and the final checks (runtime usable, shutdown, init again)."""
    return _Stress(seconds, threads, seed, device, log, activities, register).run()


# ================================================================================================ flush drift
def _rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak, the best fallback


RSS_BOUND = 16 << 20
ALLOC_BOUND = 1 << 20


def flush_drift(n_flushes=100_000, warmup=None, device="cuda", checkpoints=10, log=print):
    """Host RSS and torch.cuda.memory_allocated() across n_flushes flushes after a warm-up: explicit submit_add /
    submit('gelu') / submit_reduce each followed by flush(), every 10th a scheduler context around a fused chain
    (its exit flushes), every 1000th flush(sync=True). Measured after a full sync and gc.collect() at the same
    point of the cycle. Bounds: RSS_BOUND (16 MiB), ALLOC_BOUND (1 MiB) -- see tests/test_gpu_stress.py."""
    import gpuos
    import gpuos_ext as gx
    gx.init()
    n = 4096
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    o1, o2 = torch.empty_like(x), torch.empty_like(x)
    r_in = torch.randn(16, 256, device=device)
    r_out = torch.empty(16, device=device)
    ctx = gpuos.scheduler_context(auto_flush_ms=0)
    holder = [None]
    exp_z = torch.tanh(x) * 0.5 + y

    def one(i):
        k = i % 10
        if k == 9:
            with ctx:
                holder[0] = torch.tanh(x) * 0.5 + y
        elif k % 3 == 0:
            gx.submit_add(x, y, o1)
            gx.flush()
        elif k % 3 == 1:
            gpuos.submit("gelu", [x], o2)
            gx.flush()
        else:
            gpuos.submit_reduce("sum", r_in, r_out)
            gx.flush()
        if i % 1000 == 999:
            gx.flush(sync=True)

    def settle():
        holder[0] = None
        gx.flush(sync=True)
        torch.cuda.synchronize()
        gc.collect()
        return _rss_bytes(), torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    warm = warmup if warmup is not None else max(2000, n_flushes // 10)
    warm -= warm % 10
    t0 = _now()
    for i in range(warm):
        one(i)
    # The hot fused chain gets tier-2 code: a generation compiled by NVRTC in a background thread, which takes
    # ~110 MiB of RSS once (measured on the CPU: 221 -> 333 MiB over one compile of the worker). Measured from
    # after it: the 100,000-flush run at 4729f21 (H100) saw that step land 40,000-60,000 flushes into the window.
    gx.wait_generations()
    for i in range(warm, warm + 100):
        one(i)
    warm += 100
    rss0, al0, rs0 = settle()
    f0 = gx.stats()["flushes"]
    gens0 = len(gx.generation_info()["generations"])
    every = max(10, (n_flushes // max(checkpoints, 1)) // 10 * 10)
    series = []
    t1 = _now()
    for i in range(n_flushes):
        one(warm + i)
        if (i + 1) % every == 0 and i + 1 < n_flushes:
            rss, al, _ = settle()
            series.append({"flushes": i + 1, "rss_drift": rss - rss0, "alloc_drift": al - al0})
            log(f"drift: {i + 1:,} flushes, rss {(rss - rss0) / 1024:+.0f} KiB, allocated {al - al0:+d} B")
    loop_s = _now() - t1
    rss1, al1, rs1 = settle()
    runtime_flushes = gx.stats()["flushes"] - f0
    gens_during = len(gx.generation_info()["generations"]) - gens0
    correct = bool(torch.equal(o1, x + y)) and bool(torch.allclose(r_out, r_in.sum(-1), rtol=1e-5, atol=1e-4))
    with ctx:
        z = torch.tanh(x) * 0.5 + y
    correct = correct and bool(torch.allclose(z, exp_z, rtol=1e-5, atol=1e-5))
    res = {"flushes": n_flushes, "warmup_flushes": warm, "runtime_flushes": runtime_flushes,
           "rss_before": rss0, "rss_after": rss1, "rss_drift_bytes": rss1 - rss0,
           "alloc_before": al0, "alloc_after": al1, "alloc_drift_bytes": al1 - al0,
           "reserved_drift_bytes": rs1 - rs0,
           "max_rss_drift_bytes": max([s["rss_drift"] for s in series] + [rss1 - rss0]),
           "max_alloc_drift_bytes": max([abs(s["alloc_drift"]) for s in series] + [abs(al1 - al0)]),
           "series": series, "rss_bound_bytes": RSS_BOUND, "alloc_bound_bytes": ALLOC_BOUND,
           "results_correct": correct, "seconds": round(_now() - t0, 2), "generations_during": gens_during,
           "us_per_flush": round(1e6 * loop_s / max(n_flushes, 1), 2)}
    res["ok"] = correct and res["rss_drift_bytes"] < RSS_BOUND and abs(res["alloc_drift_bytes"]) <= ALLOC_BOUND
    return res


# ================================================================================================ child process
def _emit_result(res):
    sys.stdout.write(RESULT_TAG + json.dumps(res, default=str) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()


def main(argv=None):
    """python tests/_reliability.py {soak,stress,drift} [options]: run one part, print GPUOS_RESULT {json}."""
    import argparse
    p = argparse.ArgumentParser(prog="_reliability.py", description=main.__doc__)
    p.add_argument("kind", choices=["soak", "stress", "drift"])
    p.add_argument("--ops", type=int, default=1_000_000, help="soak: ops to run")
    p.add_argument("--max-seconds", type=float, default=None, help="soak: stop after this long (truncated)")
    p.add_argument("--inject-fault", type=int, default=0, help="soak self-test: corrupt every N-th chain")
    p.add_argument("--seconds", type=float, default=60.0, help="stress: duration")
    p.add_argument("--threads", type=int, default=6, help="stress: threads")
    p.add_argument("--no-register", action="store_true", help="stress: no injected op (no NVRTC compile)")
    p.add_argument("--flushes", type=int, default=100_000, help="drift: flushes measured")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--hard-limit-s", type=float, default=None,
                   help="faulthandler exit (every thread's stack) after this long: the last resort")
    a = p.parse_args(argv)
    if a.hard_limit_s:
        faulthandler.dump_traceback_later(a.hard_limit_s, exit=True)

    def log(msg):
        print(msg, flush=True)
    t0 = _now()
    try:
        if a.kind == "soak":
            res = soak(a.ops, seed=a.seed, device=a.device, max_seconds=a.max_seconds,
                       inject_fault=a.inject_fault, log=log)
        elif a.kind == "stress":
            res = stress(a.seconds, a.threads, a.seed, a.device, register=not a.no_register, log=log)
        else:
            res = flush_drift(a.flushes, device=a.device, log=log)
    except BaseException as e:  # noqa: BLE001 -- reported in the result
        res = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:2000]}", "traceback": traceback.format_exc()}
    res["kind"] = a.kind
    res["wall_s"] = round(_now() - t0, 2)
    try:
        import gpuos_ext
        res["gpuos_version"] = gpuos_ext.__version__
    except Exception:  # noqa: BLE001
        pass
    if a.device != "cpu" and torch.cuda.is_available():
        res["device_name"] = torch.cuda.get_device_name()
    _emit_result(res)
    os._exit(0)  # no atexit work on a possibly wedged runtime; daemon threads may be stuck


def run_child(kind, args=(), timeout=600.0, timeout_s_env=None, env_extra=None):
    """Run ``main([kind, *args])`` in a fresh interpreter (tests/_helpers.run_python: repo importable, GPUOS_*
    settings stripped except those given; GPUOS_CACHE_DIR passed on). Returns a dict: result (the parsed
    GPUOS_RESULT, or None), rc, stdout, stderr, timed_out."""
    import subprocess
    if TESTS_DIR not in sys.path:
        sys.path.insert(0, TESTS_DIR)
    from _helpers import run_python
    env = dict(env_extra or {})
    if timeout_s_env is not None:
        env["GPUOS_TIMEOUT_S"] = str(timeout_s_env)
    if os.environ.get("GPUOS_CACHE_DIR") and "GPUOS_CACHE_DIR" not in env:
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    code = (f"import sys; sys.path.insert(0, {TESTS_DIR!r}); import _reliability; "
            f"_reliability.main({[kind] + [str(x) for x in args]!r})")
    out = {"result": None, "rc": None, "stdout": "", "stderr": "", "timed_out": False}
    try:
        proc = run_python(code, env_extra=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        out.update(timed_out=True, stdout=text(e.stdout), stderr=text(e.stderr))
        return out
    out.update(rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            out["result"] = json.loads(line[len(RESULT_TAG):])
    return out


def describe_child(c, tail=12000):
    """The child's output for an assertion message (the tail of each stream)."""
    def t(s):
        return s if len(s) <= tail else "...\n" + s[-tail:]
    return (f"rc={c['rc']} timed_out={c['timed_out']}\n--- stdout ---\n{t(c['stdout'])}\n"
            f"--- stderr ---\n{t(c['stderr'])}")


if __name__ == "__main__":
    main()

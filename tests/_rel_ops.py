"""Reliability engine, part 1: constants, value intervals and the op catalog the random chains draw from
(see tests/_reliability.py for the whole)."""
from __future__ import annotations

import itertools
import math
import operator
import os
import time

import torch
import torch.nn.functional as F


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

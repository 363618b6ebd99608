"""Operator-library reference data shared by test_cpu_ops.py and test_gpu_ops.py (not a test module).

Everything here restates API_SPEC.md "Issue 3 additions": the op names, arities and scalar
parameters, plus for each elementwise op its PyTorch equivalent, an input domain and a
non-default scalar setting. The references always compute in float32 (inputs that were already
rounded to the test dtype are upcast), then the caller casts to the output dtype.
"""

import functools
import math

import torch
import torch.nn.functional as F

INF = math.inf
NAN = math.nan

# ---------------------------------------------------------------------------- the spec's op list

#: elementwise ops, in the order API_SPEC.md lists them
EW_OPS = [
    "add", "sub", "mul", "div", "maximum", "minimum", "pow",
    "neg", "reciprocal", "abs", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "sin", "cos",
    "erf", "silu", "hardsigmoid", "hardswish",
    "gelu", "gelu_tanh",
    "leaky_relu", "hardtanh", "elu", "softplus", "clamp", "clamp_min", "clamp_max",
    "clamp_tensor",
    "copy",
]
REDUCE_OPS = ["sum", "mean", "amax", "amin", "softmax", "log_softmax"]
MATMUL_OPS = ["mm"]   # kind "matmul": gpuos.submit_matmul (device_src/matmul.h)
ATTENTION_OPS = ["sdpa"]  # kind "attention": gpuos_ext.submit_attention (device_src/attention.h)
#: kind "data": data movement with integer operands (device_src/dataops.h; recorded by the scheduler only)
DATA_OPS = ["gather", "scatter", "argmax", "where", "add_int", "mul_int", "arange", "fill", "cmp"]
ALL_OPS = EW_OPS + REDUCE_OPS + MATMUL_OPS + ATTENTION_OPS + DATA_OPS

BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
ARITY = {op: 1 for op in ALL_OPS}
ARITY.update({op: 2 for op in BINARY})
ARITY["clamp_tensor"] = 3
ARITY["mm"] = 3   # a, b and the optional bias
ARITY["sdpa"] = 3  # q, k, v (the mask travels in the op's AttnArgs)
ARITY.update({"gather": 2, "scatter": 2, "where": 3, "add_int": 2, "mul_int": 2, "arange": 2, "cmp": 2})

#: scalar parameter names in table order, with the spec's defaults (None: the spec gives none)
SCALARS = {
    "add": [("alpha", 1.0)],
    "sub": [("alpha", 1.0)],
    "leaky_relu": [("negative_slope", 0.01)],
    "hardtanh": [("min_val", -1.0), ("max_val", 1.0)],
    "elu": [("alpha", 1.0)],
    "softplus": [("beta", 1.0), ("threshold", 20.0)],
    "clamp": [("min", -INF), ("max", INF)],
    "clamp_min": [("min", None)],
    "clamp_max": [("max", None)],
    "mm": [("alpha", 1.0), ("beta", 1.0)],
    "sdpa": [("scale", 1.0)],
}
SCALAR_OPS = [op for op in EW_OPS if op in SCALARS]

#: scalars the tests always pass explicitly because the spec gives the op no default
REQUIRED_KW = {"clamp_min": {"min": 0.25}, "clamp_max": {"max": -0.25}}

#: non-default scalar settings (partial dicts: omitted names keep their defaults)
NON_DEFAULT = {
    "add": [{"alpha": -2.5}],
    "sub": [{"alpha": 0.5}],
    "leaky_relu": [{"negative_slope": 0.2}],
    "hardtanh": [{"min_val": -0.5, "max_val": 2.0}, {"max_val": 0.25}],
    "elu": [{"alpha": 0.7}],
    "softplus": [{"beta": 2.0, "threshold": 5.0}, {"threshold": 1.0}],
    "clamp": [{"min": -0.5, "max": 0.75}, {"max": 0.5}, {"min": -0.25}],
    "clamp_min": [{"min": -1.5}],
    "clamp_max": [{"max": 1.25}],
}


def non_default_cases():
    """[(op, kwargs)] for every op with scalars; ids like 'clamp-1'."""
    return [(op, kw) for op in SCALAR_OPS for kw in NON_DEFAULT[op]]


def non_default_ids():
    return [f"{op}-{i}" for op in SCALAR_OPS for i in range(len(NON_DEFAULT[op]))]


# ---------------------------------------------------------------------------- op table access

@functools.lru_cache(maxsize=None)
def _table():
    import gpuos_ext

    return {row["name"]: row for row in gpuos_ext.op_table()}


def table_defaults(op):
    """{scalar name: default} from gpuos_ext.op_table()."""
    row = _table()[op]
    return dict(zip(row["scalars"], row["defaults"]))


def full_scalars(op, kw=None):
    """All scalars of `op` (table order) with table defaults overridden by REQUIRED_KW and kw."""
    s = table_defaults(op)
    s.update(REQUIRED_KW.get(op, {}))
    s.update(kw or {})
    return s


def positional_scalars(op, kw=None):
    """(s0, s1) for gpuos_ext._testing.cpu_apply, in table order."""
    s = full_scalars(op, kw)
    vals = [float(s[name]) for name in _table()[op]["scalars"]]
    vals += [0.0] * (2 - len(vals))
    return vals[0], vals[1]


# ---------------------------------------------------------------------------- references (fp32)

def _t(x, like):
    """Python number -> 0-d float32 tensor on like's device (numbers are fp32 scalar operands)."""
    if isinstance(x, torch.Tensor):
        return x.float()
    return torch.tensor(float(x), dtype=torch.float32, device=like.device)


def _first_tensor(xs):
    for x in xs:
        if isinstance(x, torch.Tensor):
            return x
    raise AssertionError("no tensor among the inputs")


_UNARY_REF = {
    "neg": torch.neg, "copy": torch.clone, "reciprocal": torch.reciprocal, "abs": torch.abs, "relu": torch.relu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "silu": F.silu,
    "hardsigmoid": F.hardsigmoid, "hardswish": F.hardswish, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
_BINARY_REF = {
    "mul": torch.mul, "div": torch.div, "maximum": torch.maximum, "minimum": torch.minimum,
    "pow": torch.pow,
}


def reference(op, inputs, kw=None):
    """torch equivalent of `op` computed in float32. inputs: tensors (any float dtype, upcast) or
    Python numbers. kw: the scalars (complete: use full_scalars)."""
    kw = kw or {}
    like = _first_tensor(inputs)
    xs = [_t(x, like) for x in inputs]
    if op in _UNARY_REF:
        return _UNARY_REF[op](xs[0])
    if op in _BINARY_REF:
        return _BINARY_REF[op](xs[0], xs[1])
    if op == "add":
        return torch.add(xs[0], xs[1], alpha=kw["alpha"])
    if op == "sub":
        return torch.sub(xs[0], xs[1], alpha=kw["alpha"])
    if op == "leaky_relu":
        return F.leaky_relu(xs[0], kw["negative_slope"])
    if op == "hardtanh":
        return F.hardtanh(xs[0], kw["min_val"], kw["max_val"])
    if op == "elu":
        return F.elu(xs[0], kw["alpha"])
    if op == "softplus":
        return F.softplus(xs[0], kw["beta"], kw["threshold"])
    if op == "clamp":
        return torch.clamp(xs[0], kw["min"], kw["max"])
    if op == "clamp_min":
        return torch.clamp_min(xs[0], kw["min"])
    if op == "clamp_max":
        return torch.clamp_max(xs[0], kw["max"])
    if op == "clamp_tensor":
        return torch.clamp(xs[0], xs[1], xs[2])
    raise KeyError(op)


def reduce_reference(op, x, keepdim=False):
    """torch reduction over the last dim, computed in float64 (the exact answer), not cast."""
    x = x.double()
    if op == "sum":
        return x.sum(-1, keepdim=keepdim)
    if op == "mean":
        return x.mean(-1, keepdim=keepdim)
    if op == "amax":
        return x.amax(-1, keepdim=keepdim)
    if op == "amin":
        return x.amin(-1, keepdim=keepdim)
    if op == "softmax":
        return torch.softmax(x, -1)
    if op == "log_softmax":
        return torch.log_softmax(x, -1)
    raise KeyError(op)


# ---------------------------------------------------------------------------- input domains

def _uniform(shape, lo, hi, device):
    return torch.rand(shape, device=device) * (hi - lo) + lo


def _away_from_zero(shape, device):
    r = torch.rand(shape, device=device) * 2.0 + 0.25
    s = torch.where(torch.rand(shape, device=device) < 0.5, -1.0, 1.0)
    return r * s


def make_input(op, index, shape, device="cpu"):
    """A float32 random input `index` of `op` inside the op's domain (caller casts to the dtype)."""
    if op in ("log", "sqrt", "rsqrt"):
        return _uniform(shape, 0.05, 4.0, device)
    if op == "reciprocal" or (op == "div" and index == 1):
        return _away_from_zero(shape, device)
    if op == "pow":
        return _uniform(shape, 0.25, 2.25, device) if index == 0 else torch.randn(shape, device=device) * 1.5
    if op in ("exp", "sigmoid", "tanh", "silu", "gelu", "gelu_tanh", "elu", "erf", "sin", "cos"):
        return torch.randn(shape, device=device) * 2.5
    if op == "softplus":
        return torch.randn(shape, device=device) * 6.0  # crosses the (beta*x > threshold) switch
    if op == "clamp_tensor" and index > 0:
        return torch.randn(shape, device=device)  # lo > hi in some places: torch gives hi there
    return torch.randn(shape, device=device) * 3.0


def scalar_operand(op, position):
    """A Python-number operand for the Tensor-Scalar forms, exactly representable in bf16."""
    if op == "pow":
        return 1.5 if position == 0 else 2.0  # base must stay positive
    if op == "div" and position == 1:
        return -1.25
    return {"add": 2.5, "sub": -0.75, "mul": 3.0, "div": 1.5, "maximum": 0.5, "minimum": -0.5}[op]


SCALAR_OPERAND_OPS = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]

# ---------------------------------------------------------------------------- tolerances

#: ops whose fp32 result is one correctly rounded IEEE operation (or exact): the output must then be
#: bit-identical to torch's fp32 result rounded (to nearest even) to the output dtype
#: (not sqrt: torch's CPU sqrt is not correctly rounded)
EXACT = ["add", "sub", "mul", "div", "maximum", "minimum", "neg", "abs", "relu", "reciprocal",
         "hardtanh", "clamp", "clamp_min", "clamp_max", "clamp_tensor", "copy"]

#: single library calls; fp32 allows some ulps of libm / CUDA math error
TRANSCENDENTAL = {"sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf"}
#: compositions of transcendental functions (cancellation in e.g. 1+tanh, exp-1)
COMPOSED = {"pow", "silu", "gelu", "gelu_tanh", "elu", "softplus"}


def ew_tol(op, dtype):
    """dict(rtol=, atol=) for torch.testing.assert_close."""
    if dtype == torch.float32:
        if op in COMPOSED:
            return dict(rtol=1e-4, atol=1e-5)
        if op in TRANSCENDENTAL:
            return dict(rtol=2e-5, atol=1e-6)
        return dict(rtol=1e-5, atol=1e-6)
    if dtype == torch.float16:
        return dict(rtol=1e-3, atol=1e-5)
    if dtype == torch.bfloat16:
        return dict(rtol=1.6e-2, atol=1e-5)
    raise KeyError(dtype)


def _acc_rel(n):
    """relative error allowed for an fp32 sum of n positive terms in some order (sequential
    chunks per thread, then a tree): ~ eps * sqrt(n) with margin"""
    return 5e-7 * math.sqrt(max(n, 1))


_DTYPE_TOL = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def assert_reduce_close(op, out, x, keepdim=False):
    """Compare out with the float64 reference of reducing x's last dim. Sums get an absolute
    allowance proportional to sum(|x|) of the row (fp32 accumulation order differs)."""
    ref = reduce_reference(op, x, keepdim=keepdim)
    assert out.shape == ref.shape, (op, tuple(out.shape), tuple(ref.shape))
    dtype = out.dtype
    got = out.double()
    ref_d = ref.to(dtype).double()  # the best answer representable in dtype
    rtol, atol = _DTYPE_TOL[dtype]
    absx = x.double().abs()
    absx = torch.where(torch.isfinite(absx), absx, torch.zeros_like(absx))
    if op in ("amax", "amin"):
        rtol, atol = 0.0, 0.0  # a selection: exact
        allow = torch.zeros_like(ref_d)
    elif op in ("sum", "mean"):
        # mixed signs: error ~ eps * partial sums <= eps * sum|x|; one sign: ~ eps * sqrt(n) * |sum|
        n = max(x.shape[-1], 1)
        allow = 4e-7 * absx.sum(-1, keepdim=keepdim) / (n if op == "mean" else 1)
        rtol = rtol + _acc_rel(x.shape[-1])
    elif op == "softmax":  # relative error of the fp32 row sum (the same for the whole row)
        rtol, atol = max(rtol, 1e-5) + _acc_rel(x.shape[-1]), max(atol, 1e-6)
        allow = torch.zeros_like(ref_d)
    else:  # log_softmax: absolute error ~ eps * |max| + relative error of the row sum
        rtol, atol = max(rtol, 1e-5), max(atol, 1e-5) + _acc_rel(x.shape[-1])
        if x.shape[-1] == 0:
            allow = torch.zeros_like(ref_d)
        else:
            allow = (4e-7 * absx.amax(-1, keepdim=True)).expand_as(ref_d)
    both_nan = torch.isnan(got) & torch.isnan(ref_d)
    same_inf = torch.isinf(got) & torch.isinf(ref_d) & (got == ref_d)
    with torch.no_grad():
        diff = (got - ref_d).abs()
        bound = atol + allow + rtol * ref_d.abs()
        ok = both_nan | same_inf | (diff <= bound)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:5].tolist()
        detail = [(i, float(got[tuple(i)]), float(ref_d[tuple(i)]), float(bound[tuple(i)])) for i in bad]
        raise AssertionError(f"{op} {dtype} shape {tuple(x.shape)}: {int((~ok).sum())} mismatches of "
                             f"{ok.numel()}; first (index, got, expected, tol): {detail}")


# ---------------------------------------------------------------------------- special values

#: (op, inputs as python lists (or numbers), kwargs) exercising NaN / inf / thresholds
SPECIAL_CASES = {
    "relu": ("relu", [[NAN, INF, -INF, -0.0, 0.0, 1.5, -1.5]], {}),
    "maximum": ("maximum", [[NAN, 1.0, NAN, -INF, INF, 2.0, -3.0], [1.0, NAN, NAN, INF, -INF, -2.0, 3.0]], {}),
    "minimum": ("minimum", [[NAN, 1.0, NAN, -INF, INF, 2.0, -3.0], [1.0, NAN, NAN, INF, -INF, -2.0, 3.0]], {}),
    "maximum_scalar": ("maximum", [[NAN, -INF, INF, 0.25, 1.0], 0.5], {}),
    "minimum_scalar": ("minimum", [[NAN, -INF, INF, 0.25, 1.0], 0.5], {}),
    "clamp": ("clamp", [[NAN, INF, -INF, 5.0, -5.0, 0.25]], {"min": -1.0, "max": 1.0}),
    "clamp_default": ("clamp", [[NAN, INF, -INF, 5.0, -5.0, 0.25]], {}),
    "clamp_min": ("clamp_min", [[NAN, INF, -INF, 5.0, -5.0, 0.25]], {"min": 0.5}),
    "clamp_max": ("clamp_max", [[NAN, INF, -INF, 5.0, -5.0, 0.25]], {"max": 0.5}),
    "hardtanh": ("hardtanh", [[NAN, INF, -INF, 5.0, -5.0, 0.25]], {}),
    "clamp_tensor": ("clamp_tensor", [[NAN, INF, -INF, 5.0, -5.0, 0.25, 0.0],
                                      [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0],
                                      [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0]], {}),
    "sigmoid": ("sigmoid", [[-INF, -1000.0, -100.0, -30.0, -20.0, 20.0, 30.0, 100.0, 1000.0, INF, NAN]], {}),
    "softplus": ("softplus", [[19.5, 20.0, 20.5, 25.0, 1e4, 1e30, -100.0, -INF, INF, NAN]], {}),
    "softplus_beta": ("softplus", [[2.0, 2.4, 2.6, 3.0, 50.0, 1e30, -100.0, -INF, INF, NAN]],
                      {"beta": 2.0, "threshold": 5.0}),
    "leaky_relu": ("leaky_relu", [[NAN, INF, -INF, -2.0, 2.0]], {}),
}

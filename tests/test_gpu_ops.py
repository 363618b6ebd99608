"""Operator library on the GPU: gpuos.submit / gpuos.submit_reduce against eager PyTorch.

Every elementwise op in f32 / f16 / bf16 (and mixed f16 + f32 -> f32 for ops with several inputs);
every op at least once on a non-contiguous layout; all layouts (transposed, stepped slice,
broadcast row / 0-d, expanded, 0-d, empty, in place) on a representative subset; Python-number
operands; NaN / inf. Reductions over the last dim for row lengths 1 .. 65536, keepdim,
non-contiguous inputs, -inf / NaN rows; chains mixing reductions and elementwise ops in one batch;
argument errors.

Outputs are poisoned with NaN (gaps of strided outputs with a sentinel that must survive).
References are torch's fp32 results (from the same rounded inputs) cast to the output dtype; ops
that are one IEEE fp32 operation must match bit for bit (see _opref.EXACT).
Comparisons need no explicit sync: gpuos.flush() is stream-ordered with torch's current stream.
"""

import functools
import re
import zlib

import pytest
import torch
from torch.testing import assert_close

import gpuos
from _opref import (
    ARITY, EW_OPS, EXACT, INF, NAN, REDUCE_OPS, REQUIRED_KW, SCALAR_OPERAND_OPS, SPECIAL_CASES,
    assert_reduce_close, ew_tol, full_scalars, make_input, non_default_cases, non_default_ids, reference,
    scalar_operand,
)

pytestmark = pytest.mark.gpu

DEV = "cuda"
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPE_IDS = {F32: "f32", F16: "f16", BF16: "bf16"}
#: "mixed": input i gets MIXED[i] (f16 + f32 (+ bf16) -> f32 out)
MIXED = (F16, F32, BF16)
MIXED_INPLACE = (F32, F16, BF16)  # in place: input 0 must already have the promoted dtype
M, N = 37, 70
SENTINEL = 7.0
SUBSET = ["add", "mul", "gelu", "clamp", "leaky_relu", "pow", "clamp_tensor"]
REDUCTIONS = ["sum", "mean", "amax", "amin"]
LAYOUT_KW = {"clamp": {"min": -0.5, "max": 0.75}}  # clamp's defaults (-inf, inf) are the identity


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


# ============================================================================ helpers

def dtypes_for(op, dt, inplace=False):
    """per-input dtypes for dtype spec dt (a torch dtype or 'mixed')"""
    if dt == "mixed":
        return list((MIXED_INPLACE if inplace else MIXED)[:ARITY[op]])
    return [dt] * ARITY[op]


def promoted(inputs):
    """torch.result_type semantics over the tensor inputs (numbers never promote): dimensioned
    tensors decide; 0-d tensors only when every tensor is 0-d (all dtypes here are floating)."""
    ts = [t for t in inputs if isinstance(t, torch.Tensor)]
    pool = [t for t in ts if t.dim() > 0] or ts
    return functools.reduce(torch.promote_types, [t.dtype for t in pool])


def scalars_to_pass(op, kw):
    return {**REQUIRED_KW.get(op, {}), **(kw or {})}


def is_exact(op, inputs, kw):
    if op not in EXACT or any(not isinstance(x, torch.Tensor) for x in inputs):
        return False
    if op in ("add", "sub") and float(full_scalars(op, kw)["alpha"]) != 1.0:
        return False  # a + alpha*b: FMA contraction or not
    return True


def expected_for(op, inputs, kw=None):
    return reference(op, inputs, full_scalars(op, scalars_to_pass(op, kw))).to(promoted(inputs))


def check(out, expected, op, inputs, kw=None, what=""):
    tol = dict(rtol=0.0, atol=0.0) if is_exact(op, inputs, kw) else ew_tol(op, out.dtype)
    assert out.dtype == expected.dtype, (op, what, out.dtype, expected.dtype)
    assert out.shape == expected.shape, (op, what, tuple(out.shape), tuple(expected.shape))
    assert_close(out, expected, equal_nan=True, **tol,
                 msg=lambda m: f"{op} [{what}] scalars={full_scalars(op, scalars_to_pass(op, kw))}: {m}")


def run_op(op, inputs, out, kw=None, what=""):
    """expected (computed first: `out` may alias an input), submit, flush, compare"""
    expected = expected_for(op, inputs, kw)
    gpuos.submit(op, inputs, out, **scalars_to_pass(op, kw))
    gpuos.flush()
    check(out, expected, op, inputs, kw, what)
    return expected


def inp(op, i, shape, dtype):
    return make_input(op, i, shape, DEV).to(dtype)


def nan_out(shape, dtype):
    return torch.full(shape, NAN, device=DEV, dtype=dtype)


# ---------------------------------------------------------------------------- layouts
# each returns (inputs, out, after) where after() checks memory around the output

def _none():
    return None


def _lay_contig(op, dts):
    ins = [inp(op, i, (M, N), d) for i, d in enumerate(dts)]
    return ins, nan_out((M, N), promoted(ins)), _none


def _lay_transposed(op, dts, m=M, n=N):
    ins = [inp(op, i, (n, m), d).t() for i, d in enumerate(dts)]
    return ins, nan_out((n, m), promoted(ins)).t(), _none


def _lay_transposed_big(op, dts):
    return _lay_transposed(op, dts, 300, 257)  # multi-tile


def _lay_stepped(op, dts):
    ins = [inp(op, i, (M, 2 * N), d)[:, ::2] for i, d in enumerate(dts)]
    base = torch.full((M, 2 * N), SENTINEL, device=DEV, dtype=promoted(ins))
    out = base[:, ::2]
    out.fill_(NAN)

    def after():
        assert (base[:, 1::2] == SENTINEL).all(), "wrote into the gaps of a stepped output"
    return ins, out, after


def _lay_bcast_row(op, dts):
    shapes = [(1, N), (M, N), (M, 1)]
    ins = [inp(op, i, shapes[i], d) for i, d in enumerate(dts)]
    return ins, nan_out((M, N), promoted(ins)), _none


def _lay_bcast_0d(op, dts):
    ins = [inp(op, i, (M, N) if i == 0 else (), d) for i, d in enumerate(dts)]
    return ins, nan_out((M, N), promoted(ins)), _none


def _lay_expanded(op, dts):
    bases = [(1, N), (M, 1), ()]
    ins = [inp(op, i, bases[i], d).expand(M, N) for i, d in enumerate(dts)]
    return ins, nan_out((M, N), promoted(ins)), _none


def _lay_zero_d(op, dts):
    ins = [inp(op, i, (), d) for i, d in enumerate(dts)]
    return ins, nan_out((), promoted(ins)), _none


def _lay_empty(op, dts):
    ins = [inp(op, i, (0, N), d) for i, d in enumerate(dts)]
    return ins, nan_out((0, N), promoted(ins)), _none


def _lay_inplace(op, dts):
    ins = [inp(op, i, (M, N), d) for i, d in enumerate(dts)]
    return ins, ins[0], _none


LAYOUTS = {
    "contig": _lay_contig, "transposed": _lay_transposed, "transposed_big": _lay_transposed_big,
    "stepped": _lay_stepped, "bcast_row": _lay_bcast_row, "bcast_0d": _lay_bcast_0d,
    "expanded": _lay_expanded, "zero_d": _lay_zero_d, "empty": _lay_empty, "inplace": _lay_inplace,
}
BROADCAST_LAYOUTS = {"bcast_row", "bcast_0d"}  # need >= 2 inputs (out = broadcast shape)


def run_layout(op, layout, dt, kw=None):
    ins, out, after = LAYOUTS[layout](op, dtypes_for(op, dt, inplace=(layout == "inplace")))
    run_op(op, ins, out, kw, what=f"{layout} {dt}")
    after()


# ============================================================================ elementwise: all ops

def _all_ops_params():
    ps = []
    for op in EW_OPS:
        for dt in (F32, F16, BF16):
            ps.append(pytest.param(op, dt, id=f"{op}-{DTYPE_IDS[dt]}"))
        if ARITY[op] >= 2:
            ps.append(pytest.param(op, "mixed", id=f"{op}-mixed"))
    return ps


@pytest.mark.parametrize("op,dt", _all_ops_params())
def test_ew_op_contiguous(rt, op, dt):
    """default scalars (not passed)"""
    run_layout(op, "contig", dt)


@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("op,kw", non_default_cases(), ids=non_default_ids())
def test_ew_non_default_scalars(rt, op, kw, dt):
    run_layout(op, "contig", dt, kw)


# every op at least once on a non-contiguous layout (and in place)
@pytest.mark.parametrize("layout,dt", [("transposed", F32), ("stepped", BF16), ("inplace", F16)],
                         ids=["transposed-f32", "stepped-bf16", "inplace-f16"])
@pytest.mark.parametrize("op", EW_OPS)
def test_ew_op_non_contiguous(rt, op, layout, dt):
    run_layout(op, layout, dt)


# ============================================================================ elementwise: layouts

def _layout_params():
    ps = []
    for op in SUBSET:
        for layout in LAYOUTS:
            if layout == "contig" or (layout in BROADCAST_LAYOUTS and ARITY[op] < 2):
                continue
            dts = [F32, BF16] + (["mixed"] if ARITY[op] >= 2 else [])
            for dt in dts:
                ps.append(pytest.param(op, layout, dt, id=f"{op}-{layout}-{DTYPE_IDS.get(dt, dt)}"))
    return ps


@pytest.mark.parametrize("op,layout,dt", _layout_params())
def test_ew_layouts(rt, op, layout, dt):
    kw = LAYOUT_KW.get(op)
    run_layout(op, layout, dt, kw)


def _runs_case(case):
    """(op, inputs, out, runs or None): a strided op whose operands are contiguous along the last dim in long runs
    (recorded as one contiguous sub-op per run, core/record.cpp record_ew_runs), or one that must not be."""
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(case.encode()))
    r = functools.partial(torch.randn, generator=g, device="cuda")
    if case == "repeat_kv":  # HF's repeat_kv: (1, 2, L, 64) expanded over a stride-0 dim of 2, copied out
        x = r(1, 2, 1000, 64).half()
        return "copy", [x[:, :, None].expand(1, 2, 2, 1000, 64)], torch.empty(1, 2, 2, 1000, 64, device="cuda",
                                                                                 dtype=F16), 4
    if case == "row_views":  # rows of wider buffers, 16-byte aligned rows
        a, b = r(8, 3072)[:, :2048], r(8, 2048)
        return "add", [a, b], torch.empty(8, 4096, device="cuda")[:, 1024:3072], 8
    if case == "unaligned_rows":  # rows start off 16 bytes: the runs take the element loop
        a = r(8, 3001).half()[:, 1:2049]
        return "mul", [a, 2.5], torch.empty(8, 2048, device="cuda", dtype=F16), 8
    if case == "cast_rows":  # fp32 runs into fp16 runs
        a = r(6, 1500)[:, :1024]
        return "copy", [a], torch.empty(6, 1024, device="cuda", dtype=F16), 6
    if case == "short_runs":  # runs of 256: the strided walk
        a = r(64, 512)[:, :256]
        return "neg", [a], torch.empty(64, 256, device="cuda"), None
    a = r(100, 1024)[:, :512]  # many_rows: 100 runs (> 64): the strided walk
    return "exp", [a], torch.empty(100, 512, device="cuda"), None


@pytest.mark.parametrize("case", ["repeat_kv", "row_views", "unaligned_rows", "cast_rows", "short_runs",
                                  "many_rows"])
def test_ew_long_contiguous_runs(rt, case):
    op, ins, out, runs = _runs_case(case)
    out.fill_(float("nan"))
    before = rt.stats()["subops"]
    gpuos.submit(op, ins, out)
    subops = rt.stats()["subops"] - before
    gpuos.flush(sync=True)
    x = [t.float() if isinstance(t, torch.Tensor) else t for t in ins]
    want = {"copy": lambda a: a, "add": torch.add, "mul": torch.mul, "neg": torch.neg, "exp": torch.exp}[op](*x)
    assert_close(out.float(), want.expand(out.shape).float(), rtol=1e-2 if out.dtype == F16 else 1e-5, atol=1e-3)
    tile = 4096  # kTileElems: live flushes keep whole tiles
    run = out.shape[-1] if out.dim() == 2 else out[0, 0, 0].numel()
    if runs is None:
        assert subops == -(-out.numel() // tile), "a strided op of short or many runs keeps the strided walk"
    else:
        assert subops == runs * -(-run // tile), "one contiguous sub-op (of whole tiles) per run"


def test_ew_bcast_0d_keeps_dimensioned_dtype(rt):
    """torch.result_type: an f32 0-d tensor does not promote an f16 tensor; its value is used at fp32"""
    a = inp("add", 0, (M, N), F16)
    b = torch.tensor(1.0 + 2.0 ** -12, device=DEV)  # not representable in f16
    out = nan_out((M, N), F16)
    run_op("add", [a, b], out, what="f16 + f32 0-d")
    with pytest.raises(TypeError):
        gpuos.submit("add", [a, b], nan_out((M, N), F32))


def test_ew_inputs_as_tuple_and_3d_broadcast(rt):
    a = inp("mul", 0, (4, 1, 6), F32)
    b = inp("mul", 1, (5, 1), BF16)
    out = nan_out((4, 5, 6), F32)
    expected = expected_for("mul", [a, b])
    gpuos.submit("mul", (a, b), out)
    gpuos.flush()
    check(out, expected, "mul", [a, b])


def test_ew_channels_last_4d(rt):
    x = inp("gelu_tanh", 0, (2, 8, 5, 6), BF16).to(memory_format=torch.channels_last)
    out = nan_out((2, 8, 5, 6), BF16)
    run_op("gelu_tanh", [x], out, what="channels_last")


# ============================================================================ python number operands

# A number operand takes the vector path with the tensor operand (one tile; three tiles with a tail that is not a
# multiple of the vector width).
@pytest.mark.parametrize("shape", [(M, N), (3, 4099)], ids=["1tile", "3tiles_tail"])
@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("position", [1, 0], ids=["tensor_scalar", "scalar_tensor"])
@pytest.mark.parametrize("op", SCALAR_OPERAND_OPS)
def test_ew_python_number_operand(rt, op, position, dt, shape):
    ins = [inp(op, i, shape, dt) for i in range(2)]
    ins[position] = scalar_operand(op, position)
    run_op(op, ins, nan_out(shape, dt), what=f"number at {position}, shape {shape}")


def test_ew_python_int_operand_and_alpha(rt):
    x = inp("mul", 0, (M, N), BF16)
    run_op("mul", [x, 3], nan_out((M, N), BF16), what="int operand")
    run_op("add", [x, 2], nan_out((M, N), BF16), {"alpha": -2}, what="int alpha")
    run_op("sub", [1.5, x], nan_out((M, N), BF16), {"alpha": 0.5}, what="number - alpha*x")


# ============================================================================ special values

@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", list(SPECIAL_CASES))
def test_ew_special_values(rt, case, dt):
    op, raw, kw = SPECIAL_CASES[case]
    ins = [torch.tensor(x, device=DEV).to(dt) if isinstance(x, list) else x for x in raw]
    shape = next(t for t in ins if isinstance(t, torch.Tensor)).shape
    run_op(op, ins, nan_out(shape, dt), kw, what=case)


# ============================================================================ many ops in one batch

#: ops whose whole real line is a valid domain: they may consume the previous op's output
_DEP_OK = {"add", "mul", "maximum", "neg", "abs", "relu", "tanh", "sin", "cos", "erf", "silu", "gelu",
           "hardswish", "clamp", "clamp_tensor", "hardtanh", "elu", "sigmoid", "leaky_relu"}


@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
def test_every_op_in_one_batch_with_dependencies(rt, dt):
    """all elementwise ops submitted before one flush; many read the previous op's output"""
    results = []
    prev = None
    for op in EW_OPS:
        ins = [inp(op, i, (M, N), dt) for i in range(ARITY[op])]
        if prev is not None and op in _DEP_OK:
            ins[0] = prev
        out = nan_out((M, N), dt)
        gpuos.submit(op, ins, out, **scalars_to_pass(op, None))
        results.append((op, ins, out))
        prev = out
    gpuos.flush()
    # expected values from each op's actual inputs (a dependent input was checked one step before)
    for op, ins, out in results:
        check(out, expected_for(op, ins), op, ins, what="one batch")


# ============================================================================ reductions

ROWS = {1: 64, 7: 64, 32: 50, 33: 50, 1000: 17, 4096: 5, 65536: 2}


def red_input(shape, dtype):
    return (torch.randn(shape, device=DEV) * 3.0).to(dtype)


def red_out_shape(op, x, keepdim=False):
    if op in ("softmax", "log_softmax"):
        return tuple(x.shape)
    return tuple(x.shape[:-1]) + ((1,) if keepdim else ())


def run_reduce(op, x, keepdim=False, out=None):
    if out is None:
        out = nan_out(red_out_shape(op, x, keepdim), x.dtype)
    x0 = x.clone()
    if keepdim:
        gpuos.submit_reduce(op, x, out, keepdim=True)
    else:
        gpuos.submit_reduce(op, x, out)
    gpuos.flush()
    assert_reduce_close(op, out, x0, keepdim=keepdim)
    assert torch.equal(x.nan_to_num(), x0.nan_to_num()), "input modified"
    return out


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("length", list(ROWS))
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce(rt, op, length, dt):
    run_reduce(op, red_input((ROWS[length], length), dt))


@pytest.mark.parametrize("shape", [(5, 33), (2, 3, 1000), (7,), (3, 65536)], ids=str)
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduce_keepdim(rt, op, shape):
    run_reduce(op, red_input(shape, F32), keepdim=True)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_1d_and_3d(rt, op):
    run_reduce(op, red_input((1000,), BF16))  # sum etc. -> 0-d out
    run_reduce(op, red_input((3, 4, 33), F16))


def _nc_transposed(dt):
    return red_input((257, 9), dt).t()  # (9, 257), last-dim stride 9


def _nc_stepped(dt):
    return red_input((9, 514), dt)[..., ::2]


def _nc_permuted(dt):
    return red_input((257, 3, 4), dt).permute(1, 2, 0)  # (3, 4, 257), last-dim stride 12


NON_CONTIG = {"transposed": _nc_transposed, "stepped": _nc_stepped, "permuted3d": _nc_permuted}


@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", list(NON_CONTIG))
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_non_contiguous_input(rt, op, layout, dt):
    x = NON_CONTIG[layout](dt)
    assert not x.is_contiguous()
    run_reduce(op, x)


# Layouts around the worker's tight-loop path (rows evenly spaced, contiguous, 16-byte aligned, a length that is
# a multiple of the vector width) and just outside it: each must equal torch whichever path runs.
FLAT_INPUTS = {
    "row_slice": lambda dt: red_input((6, 1024), dt)[:, :512],          # rows 1,024 elements apart
    "merged_3d": lambda dt: red_input((3, 4, 64), dt),                   # outer dims merge
    "unmergeable_3d": lambda dt: red_input((3, 5, 64), dt)[:, 1:, :],    # rows not evenly spaced
    "size1_outer": lambda dt: red_input((3, 1, 2, 64), dt),              # size-1 dim among the outer ones
    "unaligned_start": lambda dt: red_input((5, 66), dt)[:, 2:],         # 64 elements, row start not 16-B aligned
    "odd_length": lambda dt: red_input((9, 36), dt),                     # fp16/bf16: not a multiple of 8
}


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", list(FLAT_INPUTS))
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_row_layouts(rt, op, layout, dt):
    run_reduce(op, FLAT_INPUTS[layout](dt))


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_into_strided_out(rt, op):
    """out= a column (reductions) or a row slice of a wider tensor (softmax): the output row stride is not the
    row length."""
    x = red_input((7, 256), F32)
    if op in REDUCTIONS:
        out = nan_out((7, 3), F32)[:, 1]
    else:
        out = nan_out((7, 512), F32)[:, 256:]
    run_reduce(op, x, out=out)


def special_rows(op, length):
    x = torch.randn(8, length, device=DEV) * 3.0
    j = length // 2
    x[1, j] = -INF                   # one -inf
    x[2, :] = -INF                   # all -inf (softmax: nan, like torch)
    x[3, j] = NAN                    # NaN (amax: nan)
    x[4, :] = -INF
    x[4, length - 1] = 1.0           # one finite among -inf
    x[5, 0] = -INF
    x[5, length - 1] = NAN
    if op in REDUCTIONS:             # +inf: sum/mean inf or nan, amax inf, like torch
        x[6, j] = INF
        x[7, 0], x[7, length - 1] = INF, -INF
    return x


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("length", [1, 7, 1000, 4096 + 5])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_special_rows(rt, op, length, dt):
    run_reduce(op, special_rows(op, length).to(dt))


@pytest.mark.parametrize("op", ["sum", "mean", "softmax", "log_softmax"])
def test_reduce_empty_last_dim_like_torch(rt, op):
    """sum -> 0, mean -> nan, softmax of an empty row -> empty (torch semantics)"""
    x = torch.empty((3, 0), device=DEV)
    out = run_reduce(op, x)
    assert out.shape == red_out_shape(op, x)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_zero_rows(rt, op):
    run_reduce(op, torch.empty((0, 7), device=DEV))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_large_values_do_not_overflow(rt, op):
    x = torch.tensor([[1000.0, 999.0, -1000.0], [88.0, 89.0, 90.0]], device=DEV)
    out = run_reduce(op, x)
    assert torch.isfinite(out).all(), out


# ============================================================================ chains (one batch)

def test_chain_exp_then_sum(rt):
    x = red_input((33, 1000), F32) / 3.0
    y, s = nan_out(x.shape, F32), nan_out((33,), F32)
    gpuos.submit("exp", [x], y)
    gpuos.submit_reduce("sum", y, s)
    gpuos.flush()
    ey = torch.exp(x)
    check(y, ey, "exp", [x])
    assert_reduce_close("sum", s, ey)


@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
def test_chain_mixed_pipeline(rt, dt):
    """h = x*w (row broadcast); g = gelu(h); p = softmax(g); m = amax(p, keepdim); q = p - m;
    l = log_softmax(q); s = mean(l) -- all in one flush"""
    R, L = 24, 333
    x = red_input((R, L), dt)
    w = red_input((1, L), dt)
    h, g, p, q, l = (nan_out((R, L), dt) for _ in range(5))
    m, s = nan_out((R, 1), dt), nan_out((R,), dt)
    gpuos.submit("mul", [x, w], h)
    gpuos.submit("gelu", [h], g)
    gpuos.submit_reduce("softmax", g, p)
    gpuos.submit_reduce("amax", p, m, keepdim=True)
    gpuos.submit("sub", [p, m], q)
    gpuos.submit_reduce("log_softmax", q, l)
    gpuos.submit_reduce("mean", l, s)
    gpuos.flush()
    # check each stage against torch applied to the stage's actual (already checked) input
    check(h, expected_for("mul", [x, w]), "mul", [x, w])
    check(g, expected_for("gelu", [h]), "gelu", [h])
    assert_reduce_close("softmax", p, g)
    assert_reduce_close("amax", m, p, keepdim=True)
    check(q, expected_for("sub", [p, m]), "sub", [p, m])
    assert_reduce_close("log_softmax", l, q)
    assert_reduce_close("mean", s, l)


def test_chain_reduce_then_in_place_center(rt):
    """mean(x) read by an in-place x -= mean (write-after-read on x), then amax of the result"""
    x = red_input((40, 257), F32)
    x0 = x.clone()
    mu, mx = nan_out((40, 1), F32), nan_out((40,), F32)
    gpuos.submit_reduce("mean", x, mu, keepdim=True)
    gpuos.submit("sub", [x, mu], x)
    gpuos.submit_reduce("amax", x, mx)
    gpuos.flush()
    assert_reduce_close("mean", mu, x0, keepdim=True)
    check(x, expected_for("sub", [x0, mu]), "sub", [x0, mu])
    assert_reduce_close("amax", mx, x)


# ============================================================================ errors on CUDA

def _norm(msg):
    return re.sub(r"\s+", "", msg)


def test_out_shape_not_broadcast_shape_is_value_error(rt):
    a, b = inp("add", 0, (4, 5), F32), inp("add", 1, (1, 5), F32)
    with pytest.raises(ValueError) as ei:
        gpuos.submit("add", [a, b], nan_out((5, 5), F32))
    msg = _norm(str(ei.value))
    assert "4,5" in msg and "5,5" in msg, f"message should show the shapes: {ei.value}"
    with pytest.raises(ValueError):  # torch would resize out; gpuos requires the exact shape
        gpuos.submit("add", [inp("add", 0, (5,), F32), inp("add", 1, (5,), F32)], nan_out((4, 5), F32))
    with pytest.raises(ValueError):
        gpuos.submit("gelu", [inp("gelu", 0, (4, 5), F32)], nan_out((4, 5, 1), F32))


def test_non_broadcastable_inputs_are_value_error(rt):
    a, b = inp("mul", 0, (4, 5), F32), inp("mul", 1, (3, 5), F32)
    with pytest.raises(ValueError):
        gpuos.submit("mul", [a, b], nan_out((4, 5), F32))
    x = inp("clamp_tensor", 0, (4, 5), F32)
    with pytest.raises(ValueError):
        gpuos.submit("clamp_tensor", [x, inp("add", 0, (4, 5), F32), inp("add", 0, (4, 2), F32)],
                     nan_out((4, 5), F32))


@pytest.mark.parametrize("dts,out_dt", [
    ((F16, F32), F16), ((F16, F16), F32), ((BF16, F16), BF16), ((F32, F32), F16),
], ids=["f16+f32->f16", "f16+f16->f32", "bf16+f16->bf16", "f32+f32->f16"])
def test_out_dtype_not_promoted_is_type_error(rt, dts, out_dt):
    a, b = (inp("add", i, (4, 5), d) for i, d in enumerate(dts))
    want = torch.result_type(a, b)
    with pytest.raises(TypeError) as ei:
        gpuos.submit("add", [a, b], nan_out((4, 5), out_dt))
    msg = str(ei.value)
    for d in {want, out_dt}:
        name = str(d).replace("torch.", "")
        assert name in msg, f"message should name {name}: {msg}"


def test_unary_out_dtype_mismatch_is_type_error(rt):
    with pytest.raises(TypeError):
        gpuos.submit("exp", [inp("exp", 0, (4, 5), BF16)], nan_out((4, 5), F32))


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.bool])
def test_unsupported_dtype_is_type_error(rt, dtype):
    x = torch.ones((4, 5), device=DEV, dtype=dtype)
    with pytest.raises(TypeError):
        gpuos.submit("neg", [x], torch.ones((4, 5), device=DEV, dtype=dtype))


def test_op_level_errors_with_cuda_tensors(rt):
    a, b = inp("add", 0, (4, 5), F32), inp("add", 1, (4, 5), F32)
    out = nan_out((4, 5), F32)
    with pytest.raises(ValueError, match="gelu"):
        gpuos.submit("bogus_op", [a, b], out)
    with pytest.raises(ValueError):
        gpuos.submit("add", [a], out)
    with pytest.raises(ValueError):
        gpuos.submit("clamp_tensor", [a, b], out)
    with pytest.raises(TypeError, match="alpha"):
        gpuos.submit("add", [a, b], out, beta=1.0)


def test_partial_overlap_is_value_error(rt):
    buf = inp("add", 0, (20,), F32)
    with pytest.raises(ValueError):
        gpuos.submit("add", [buf[:10], inp("add", 1, (10,), F32)], buf[5:15])
    with pytest.raises(ValueError):
        gpuos.submit("neg", [buf[:10]], buf[1:11])


def test_rejected_submits_leave_batch_intact(rt):
    x = inp("sigmoid", 0, (M, N), F32)
    out = nan_out((M, N), F32)
    gpuos.submit("sigmoid", [x], out)
    for bad in (lambda: gpuos.submit("add", [x], out),
                lambda: gpuos.submit("add", [x, x], nan_out((M, N), F16)),
                lambda: gpuos.submit_reduce("amax", x[:, :0], nan_out((M,), F32))):
        with pytest.raises((ValueError, TypeError)):
            bad()
    gpuos.flush()
    check(out, expected_for("sigmoid", [x]), "sigmoid", [x])


@pytest.mark.parametrize("case", ["no_keepdim_but_keepdim_shape", "keepdim_but_flat_shape", "softmax_flat",
                                  "sum_full_shape", "wrong_rows"])
def test_reduce_out_wrong_shape_is_value_error(rt, case):
    x = red_input((4, 7), F32)
    op, shape, keepdim = {
        "no_keepdim_but_keepdim_shape": ("sum", (4, 1), False),
        "keepdim_but_flat_shape": ("amax", (4,), True),
        "softmax_flat": ("softmax", (4,), False),
        "sum_full_shape": ("mean", (4, 7), False),
        "wrong_rows": ("amin", (5,), False),
    }[case]
    with pytest.raises(ValueError):
        gpuos.submit_reduce(op, x, nan_out(shape, F32), keepdim=keepdim)


def test_reduce_out_dtype_mismatch_is_type_error(rt):
    x = red_input((4, 7), BF16)
    with pytest.raises(TypeError):
        gpuos.submit_reduce("sum", x, nan_out((4,), F32))
    with pytest.raises(TypeError):
        gpuos.submit_reduce("softmax", x, nan_out((4, 7), F16))


@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_amin_of_empty_last_dim_is_value_error(rt, op):
    x = torch.empty((3, 0), device=DEV)
    with pytest.raises(ValueError):
        gpuos.submit_reduce(op, x, nan_out((3,), F32))


def test_reduce_of_0d_input_is_value_error(rt):
    with pytest.raises(ValueError):
        gpuos.submit_reduce("sum", torch.ones((), device=DEV), nan_out((), F32))

"""Operator library without a GPU: the op table, the device functors evaluated on the CPU
(gpuos_ext._testing.cpu_apply / _cpu_reduce, the SAME functor code g++ compiles) against PyTorch, and
the argument checks of gpuos.submit / gpuos.submit_reduce that happen before any GPU work.

References are computed by PyTorch in float32 from the same (already rounded) inputs and cast
to the test dtype; see _opref.py.
"""

import zlib

import pytest
import torch
from torch.testing import assert_close

import gpuos
import gpuos_ext
from _opref import (
    ALL_OPS, ARITY, DATA_OPS, EW_OPS, EXACT, NAN, INF, REDUCE_OPS, SCALAR_OPERAND_OPS, SCALARS, SPECIAL_CASES,
    assert_reduce_close, ew_tol, full_scalars, make_input, non_default_cases, non_default_ids,
    positional_scalars, reference, scalar_operand,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["f32", "f16", "bf16"]
SHAPE = (6, 129)
TABLE_KEYS = {"id", "name", "arity", "kind", "functor", "scalars", "defaults", "aten"}


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _table():
    return gpuos_ext.op_table()


def _f32(v):
    return torch.tensor(v, dtype=torch.float32).item()


def cpu_apply(op, inputs, out, kw=None):
    s0, s1 = positional_scalars(op, kw)
    gpuos_ext._testing.cpu_apply(op, inputs, out, s0, s1)


def _cast(inputs, dtype):
    return [x.to(dtype) if isinstance(x, torch.Tensor) else x for x in inputs]


def check_apply(op, inputs, dtype, kw=None, shape=None, exact=False):
    """inputs: float32 tensors / numbers. Rounds tensors to dtype, runs _cpu_apply, compares."""
    inputs = _cast(inputs, dtype)
    if shape is None:
        shape = next(x for x in inputs if isinstance(x, torch.Tensor)).shape
    snapshot = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    out = torch.full(shape, NAN, dtype=dtype)
    cpu_apply(op, inputs, out, kw)
    expected = reference(op, snapshot, full_scalars(op, kw)).to(dtype)
    assert out.dtype == dtype and out.shape == expected.shape
    tol = dict(rtol=0.0, atol=0.0) if exact else ew_tol(op, dtype)
    assert_close(out, expected, equal_nan=True, **tol,
                 msg=lambda m: f"{op} {dtype} scalars={full_scalars(op, kw)}: {m}")
    for before, after in zip(snapshot, inputs):  # inputs are not written
        if isinstance(before, torch.Tensor):
            assert torch.equal(before.nan_to_num(), after.nan_to_num())


# ============================================================================ op table

def test_op_table_rows_have_all_keys():
    for row in _table():
        assert TABLE_KEYS <= set(row), f"row {row} lacks {TABLE_KEYS - set(row)}"
        assert isinstance(row["id"], int) and isinstance(row["arity"], int)
        assert isinstance(row["name"], str) and row["name"]
        assert isinstance(row["functor"], str)
        assert row["kind"] in ("ew", "reduce", "matmul", "attention", "data"), row
        assert all(isinstance(s, str) and s for s in row["scalars"]), row
        assert all(isinstance(d, float) for d in row["defaults"]), row
        assert all(isinstance(a, str) and a for a in row["aten"]), row


def test_op_table_names_and_ids_unique():
    rows = _table()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)), f"duplicate names: {sorted(names)}"
    ids = sorted(r["id"] for r in rows)
    assert ids == list(range(len(rows))), f"ids are not 0..{len(rows) - 1}: {ids}"


def test_op_table_arity_and_scalar_lengths():
    for row in _table():
        assert 1 <= row["arity"] <= 3, row
        assert len(row["scalars"]) == len(row["defaults"]), row
        assert len(row["scalars"]) <= 2, row  # _cpu_apply takes s0, s1
        assert len(set(row["scalars"])) == len(row["scalars"]), row


def test_op_table_aten_overloads_unique():
    seen = {}
    for row in _table():
        for a in row["aten"]:
            assert a not in seen, f"aten overload {a!r} served by both {seen[a]!r} and {row['name']!r}"
            seen[a] = row["name"]


def test_op_table_names_equal_spec_list():
    names = {r["name"] for r in _table()}
    assert names == set(ALL_OPS), (f"missing: {sorted(set(ALL_OPS) - names)}; "
                                   f"extra: {sorted(names - set(ALL_OPS))}")


def test_op_table_kinds_and_arity_match_spec():
    for row in _table():
        name = row["name"]
        assert row["kind"] == ("reduce" if name in REDUCE_OPS else "matmul" if name == "mm" else
                               "attention" if name == "sdpa" else "data" if name in DATA_OPS else "ew"), row
        assert row["arity"] == ARITY[name], row


def test_op_table_scalars_and_defaults_match_spec():
    for row in _table():
        spec = SCALARS.get(row["name"], [])
        assert row["scalars"] == [n for n, _ in spec], row
        for (n, d), got in zip(spec, row["defaults"]):
            if d is not None:  # stored as float32 is fine (the math is fp32)
                assert _f32(got) == _f32(d), f"{row['name']}.{n}: default {got}, spec says {d}"


def test_supported_ops_matches_table():
    ops = gpuos.supported_ops()
    assert isinstance(ops, list) and all(isinstance(o, str) for o in ops)
    assert ops == [r["name"] for r in _table()]
    assert set(ops) == set(ALL_OPS)


def test_every_functor_is_in_the_device_sources():
    text = "\n".join(gpuos_ext.device_sources().values())
    for row in _table():
        if row["functor"]:
            assert row["functor"] in text, f"{row['name']}: functor {row['functor']!r} not in device_src"


# ============================================================================ elementwise functors

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", EW_OPS)
def test_cpu_apply_matches_torch(op, dtype):
    inputs = [make_input(op, i, SHAPE) for i in range(ARITY[op])]
    check_apply(op, inputs, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", EXACT)
def test_cpu_apply_correctly_rounded_ops_are_bit_exact(op, dtype):
    """One IEEE fp32 operation then round-to-nearest-even to the dtype: no tolerance."""
    inputs = [make_input(op, i, SHAPE) for i in range(ARITY[op])]
    check_apply(op, inputs, dtype, exact=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op,kw", non_default_cases(), ids=non_default_ids())
def test_cpu_apply_non_default_scalars(op, kw, dtype):
    inputs = [make_input(op, i, SHAPE) for i in range(ARITY[op])]
    check_apply(op, inputs, dtype, kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("position", [1, 0], ids=["tensor_scalar", "scalar_tensor"])
@pytest.mark.parametrize("op", SCALAR_OPERAND_OPS)
def test_cpu_apply_python_number_operand(op, position, dtype):
    inputs = [make_input(op, i, SHAPE) for i in range(2)]
    inputs[position] = scalar_operand(op, position)
    check_apply(op, inputs, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cpu_apply_add_number_with_alpha(dtype):
    check_apply("add", [make_input("add", 0, SHAPE), 0.5], dtype, {"alpha": -3.0})
    check_apply("sub", [2.0, make_input("sub", 1, SHAPE)], dtype, {"alpha": 0.25})


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", list(SPECIAL_CASES))
def test_cpu_apply_special_values(case, dtype):
    op, raw, kw = SPECIAL_CASES[case]
    inputs = [torch.tensor(x, dtype=torch.float32) if isinstance(x, list) else x for x in raw]
    check_apply(op, inputs, dtype, kw)


@pytest.mark.parametrize("shape", [(1,), (0,), (2, 3, 5), (4097,)], ids=str)
@pytest.mark.parametrize("op", ["add", "gelu_tanh", "clamp_tensor"])
def test_cpu_apply_shapes(op, shape):
    inputs = [make_input(op, i, shape) for i in range(ARITY[op])]
    check_apply(op, inputs, torch.float32)


# ============================================================================ reduction functors

def _reduce_input(shape, dtype):
    x = torch.randn(shape) * 3.0
    rows, cols = shape
    if rows >= 2:
        x[1, 0] = -INF
        x[1, cols // 2] = -INF
    if rows >= 3:
        x[rows - 1, cols - 1] = NAN
    return x.to(dtype)


def _reduce_out(op, x):
    shape = x.shape if op in ("softmax", "log_softmax") else x.shape[:-1]
    return torch.full(shape, NAN, dtype=x.dtype)


@pytest.mark.parametrize("shape", [(3, 1), (4, 7), (2, 1000)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_cpu_reduce_matches_torch(op, dtype, shape):
    x = _reduce_input(shape, dtype)
    x0 = x.clone()
    out = _reduce_out(op, x)
    gpuos_ext._testing.cpu_reduce(op, x, out)
    assert_reduce_close(op, out, x0)
    assert torch.equal(x.nan_to_num(), x0.nan_to_num())


def _special_rows(op):
    rows = [
        [0.5, -1.0, 2.0, 3.0, -4.0, 0.25, 1.0],
        [0.5, -INF, 2.0, 3.0, -4.0, 0.25, 1.0],
        [-INF] * 7,
        [0.5, -1.0, NAN, 3.0, -4.0, 0.25, 1.0],
        [NAN] * 7,
        [-INF, -INF, -INF, 1.0, -INF, -INF, -INF],
    ]
    if op not in ("softmax", "log_softmax"):  # +inf: sum/mean -> inf or nan, amax -> inf, as torch
        rows += [[0.5, INF, 2.0, 3.0, -4.0, 0.25, 1.0], [INF, -INF, 2.0, 3.0, -4.0, 0.25, 1.0]]
    return torch.tensor(rows)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_cpu_reduce_special_rows(op, dtype):
    x = _special_rows(op).to(dtype)
    out = _reduce_out(op, x)
    gpuos_ext._testing.cpu_reduce(op, x, out)
    assert_reduce_close(op, out, x)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_cpu_softmax_large_values_do_not_overflow(op):
    x = torch.tensor([[1000.0, 999.0, -1000.0], [88.0, 89.0, 90.0]])
    out = _reduce_out(op, x)
    gpuos_ext._testing.cpu_reduce(op, x, out)
    assert torch.isfinite(out).all(), out
    assert_reduce_close(op, out, x)


# ============================================================================ submit checks (no GPU needed)

def _a(shape=(4, 5)):
    return torch.randn(shape)


def test_submit_functions_exist():
    assert callable(gpuos.submit) and callable(gpuos_ext.submit)
    assert callable(gpuos.submit_reduce)
    assert callable(gpuos.supported_ops)


# These pass CPU tensors: the op-level checks (name, arity, scalar names) are expected to come
# before the tensor checks, which would reject the CPU tensors with TypeError.

def test_submit_unknown_op_lists_supported_ops():
    with pytest.raises(ValueError) as ei:
        gpuos.submit("no_such_op", [_a(), _a()], _a())
    msg = str(ei.value)
    assert "no_such_op" in msg
    for name in ("add", "gelu_tanh", "clamp_tensor", "softplus"):
        assert name in msg, f"message does not list {name!r}: {msg}"


@pytest.mark.parametrize("op,n", [("add", 1), ("add", 3), ("neg", 2), ("gelu", 0), ("clamp_tensor", 2),
                                  ("clamp_tensor", 4)])
def test_submit_wrong_arity_is_value_error(op, n):
    with pytest.raises(ValueError) as ei:
        gpuos.submit(op, [_a() for _ in range(n)], _a())
    assert op in str(ei.value), str(ei.value)


@pytest.mark.parametrize("op,n,kw,names", [
    ("add", 2, {"beta": 2.0}, ["alpha"]),
    ("leaky_relu", 1, {"slope": 0.1}, ["negative_slope"]),
    ("softplus", 1, {"alpha": 1.0}, ["beta", "threshold"]),
    ("clamp", 1, {"lo": 0.0}, ["min", "max"]),
    ("relu", 1, {"alpha": 1.0}, []),
])
def test_submit_unknown_scalar_kwarg_is_type_error(op, n, kw, names):
    with pytest.raises(TypeError) as ei:
        gpuos.submit(op, [_a() for _ in range(n)], _a(), **kw)
    msg = str(ei.value)
    assert next(iter(kw)) in msg or op in msg, msg
    for name in names:
        assert name in msg, f"message does not name {op}'s scalar {name!r}: {msg}"


@pytest.mark.parametrize("case", ["binary", "unary", "number", "scalars", "ternary"])
def test_submit_cpu_tensors_is_type_error_mentioning_cuda(case):
    a, b, c, out = _a(), _a(), _a(), _a()
    call = {
        "binary": lambda: gpuos.submit("add", [a, b], out),
        "unary": lambda: gpuos.submit("gelu", [a], out),
        "number": lambda: gpuos.submit("mul", [a, 2.0], out),
        "scalars": lambda: gpuos.submit("hardtanh", (a,), out, min_val=-2.0, max_val=2.0),
        "ternary": lambda: gpuos.submit("clamp_tensor", [a, b, c], out),
    }[case]
    with pytest.raises(TypeError, match="CUDA"):
        call()


@pytest.mark.parametrize("op", ["sum", "softmax"])
def test_submit_reduce_cpu_tensor_is_type_error_mentioning_cuda(op):
    x = _a()
    out = torch.empty(x.shape if op == "softmax" else x.shape[:-1])
    with pytest.raises(TypeError, match="CUDA"):
        gpuos.submit_reduce(op, x, out)


def test_submit_reduce_unknown_op_is_value_error():
    x = _a()
    with pytest.raises(ValueError):
        gpuos.submit_reduce("gelu", x, torch.empty(4))
    with pytest.raises(ValueError):
        gpuos.submit_reduce("no_such_reduction", x, torch.empty(4))


def test_submit_reduce_takes_keywords_and_rejects_bad_ones():
    x = _a()
    out = torch.empty(x.shape[:-1])
    with pytest.raises(TypeError, match="CUDA"):  # keywords reach the same checks as positionals
        gpuos.submit_reduce(op="sum", x=x, out=out, keepdim=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dim'"):
        gpuos.submit_reduce("sum", x, out, dim=-1)
    with pytest.raises(TypeError, match="missing required argument 'out'"):
        gpuos.submit_reduce("sum", x)
    with pytest.raises(TypeError, match="multiple values for 'x'"):
        gpuos.submit_reduce("sum", x, out, x=x)
    with pytest.raises(TypeError, match="reduction name"):
        gpuos.submit_reduce(0, x, out)

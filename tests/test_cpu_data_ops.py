"""The data-movement ops (device_src/dataops.h, ops.def kind 4) without a GPU: gpuos_ext._testing.cpu_data runs
the same TensorRef plan the recording builds (csrc/tensor/record_data.cpp) and the same per-element rule the worker
runs, on CPU tensors, against torch. Also the handlers' constant encoding (gpuos._data_handlers.bits_of)."""
import zlib

import pytest
import torch

import gpuos_ext
from gpuos import _data_handlers as DH
from gpuos import _int_handlers as IH

T = gpuos_ext._testing
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
INDEX = [torch.int64, torch.int32]
U64 = (1 << 64) - 1


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _rand(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype in INDEX:
        return torch.randint(-50, 50, shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


# ----------------------------------------------------------------------------- gather (embedding / index_select)
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
@pytest.mark.parametrize("itype", INDEX)
@pytest.mark.parametrize("ishape", [(), (0,), (1,), (7,), (2, 3)], ids=["0d", "empty", "one", "many", "2d"])
def test_gather_rows_like_embedding(dtype, itype, ishape):
    w = _rand((11, 6), dtype)
    idx = torch.randint(0, 11, ishape, dtype=itype)
    out = torch.empty(tuple(ishape) + (6,), dtype=dtype)
    assert T.cpu_data("gather", out, [w, idx], [0, 0], 0) == 0
    assert torch.equal(out, w[idx.long()])


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_gather_index_select_any_dim_strided(dim):
    x = torch.randn(5, 9, 4).transpose(0, 2)[:, ::2]  # (4, 5, 5), no dim contiguous
    idx = torch.tensor([3, 0, 0, 2, 1, 1])[::2]      # strided index ([3, 0, 1])
    shape = list(x.shape)
    shape[dim] = idx.numel()
    out = torch.empty(shape)
    assert T.cpu_data("gather", out, [x, idx], [0, 0], dim) == 0
    assert torch.equal(out, x.index_select(dim, idx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_gather_out_of_range_writes_poison_and_counts(dtype):
    w = _rand((4, 3), dtype)
    idx = torch.tensor([1, 4, -1, 2])
    out = torch.full((4, 3), 7).to(dtype)
    assert T.cpu_data("gather", out, [w, idx], [0, 0], 0) == 6  # two rows of three elements
    assert torch.equal(out[0], w[1]) and torch.equal(out[3], w[2])
    if dtype.is_floating_point:
        assert out[1:3].isnan().all()
    else:
        assert (out[1:3] == 0).all()


# ----------------------------------------------------------------------------- scatter (index_copy_ / index_put_)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("itype", INDEX)
@pytest.mark.parametrize("n", [0, 1, 3])
def test_scatter_kv_cache_write(dtype, itype, n):
    cache = _rand((2, 3, 8, 4), dtype)                 # (B, H, L, D)
    k = _rand((2, 3, n, 4), dtype)
    pos = torch.randperm(8)[:n].to(itype)
    ref = cache.clone().index_copy_(2, pos.long(), k)
    assert T.cpu_data("scatter", cache, [k, pos], [0, 0], 2) == 0
    assert torch.equal(cache, ref)


def test_scatter_strided_source_and_cache_view():
    base = torch.randn(2, 8, 3, 4)
    cache = base.transpose(1, 2)                       # (2, 3, 8, 4) non-contiguous view of base
    src = torch.randn(2, 3, 4, 2).transpose(2, 3)      # (2, 3, 2, 4) strided
    pos = torch.tensor([5, 1])
    ref = cache.clone().index_copy_(2, pos, src)
    assert T.cpu_data("scatter", cache, [src, pos], [0, 0], 2) == 0
    assert torch.equal(cache, ref)


def test_scatter_negative_indices_wrap_only_for_index_put():
    x = torch.zeros(5, 2)
    src = torch.ones(2, 2)
    idx = torch.tensor([-1, 1])
    assert T.cpu_data("scatter", x, [src, idx], [0, 0], 0, ival=1) == 0  # index_put_: -1 is the last row
    ref = torch.zeros(5, 2)
    ref[idx] = src
    assert torch.equal(x, ref)
    y = torch.zeros(5, 2)
    assert T.cpu_data("scatter", y, [src, idx], [0, 0], 0, ival=0) == 2  # index_copy_: out of range, skipped
    assert torch.equal(y[1], src[1]) and (y[[0, 2, 3, 4]] == 0).all()


def test_scatter_out_of_range_never_writes_outside():
    buf = torch.zeros(12)
    x = buf[2:10].view(4, 2)
    assert T.cpu_data("scatter", x, [torch.ones(2, 2), torch.tensor([4, 100])], [0, 0], 0) == 4
    assert (buf == 0).all()


# ----------------------------------------------------------------------------- argmax
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_matches_torch_with_ties_and_nans(dtype, keepdim):
    x = torch.randint(0, 4, (6, 37)).to(dtype)         # many ties
    x[2, 5] = float("nan")
    x[2, 30] = float("nan")                            # first NaN wins
    x[3] = float("-inf")
    x[4, 0] = float("inf")
    out = torch.empty((6, 1) if keepdim else (6,), dtype=torch.int64)
    assert T.cpu_data("argmax", out, [x], [0], 0, keepdim=keepdim) == 0
    assert torch.equal(out, x.float().argmax(-1, keepdim=keepdim))
    assert out.view(-1)[2] == 5


def test_argmax_strided_rows():
    x = torch.randn(7, 5, 3).transpose(1, 2)           # last dim stride 3
    out = torch.empty(7, 3, dtype=torch.int64)
    T.cpu_data("argmax", out, [x], [0], 0)
    assert torch.equal(out, x.argmax(-1))


# ----------------------------------------------------------------------------- where / masked_fill
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.int32, torch.bool])
def test_where_broadcast_and_constants(dtype):
    cond = torch.rand(4, 1, 5) > 0.5
    a = _rand((3, 5), dtype)
    b = _rand((4, 3, 1), dtype)
    out = torch.empty(4, 3, 5, dtype=dtype)
    T.cpu_data("where", out, [cond, a, b], [0, 0, 0])
    assert torch.equal(out, torch.where(cond, a, b))
    value = True if dtype == torch.bool else -7 if not dtype.is_floating_point else -65504.0
    out2 = torch.empty(4, 3, 5, dtype=dtype)
    T.cpu_data("where", out2, [cond, None, b], [0, DH.bits_of(value, dtype), 0])  # masked_fill(b, cond, value)
    assert torch.equal(out2, b.expand(4, 3, 5).masked_fill(cond.expand(4, 3, 5), value))


def test_where_as_copy_with_constant_condition():
    x = torch.rand(3, 4).t() > 0.3                     # strided bool
    out = torch.empty(4, 3, dtype=torch.bool)
    T.cpu_data("where", out, [None, x, None], [1, 0, 0])
    assert torch.equal(out, x)


# ----------------------------------------------------------------------------- integer arithmetic, arange, fill
@pytest.mark.parametrize("otype", INDEX)
@pytest.mark.parametrize("alpha", [1, -3])
def test_add_int_is_integer_arithmetic(otype, alpha):
    big = (1 << 62) + 12345                            # fp32 cannot hold it: the result proves no float path
    a = torch.tensor([[big, -5, 7]], dtype=torch.int64).to(otype)
    b = torch.tensor([[3], [1 << 40]], dtype=torch.int64).to(otype)
    out = torch.empty(2, 3, dtype=otype)
    T.cpu_data("add_int", out, [a, b], [0, 0], ival=alpha)
    assert torch.equal(out, torch.add(a, b, alpha=alpha))


def test_add_int_mixed_dtypes_constants_and_wrapping():
    a = torch.tensor([(1 << 63) - 1, 2, 3])
    b = torch.tensor([True, False, True])
    out = torch.empty(3, dtype=torch.int64)
    T.cpu_data("add_int", out, [a, b], [0, 0], ival=1)
    assert torch.equal(out, a + b)                     # wraps like torch
    c = torch.tensor([1, 2, 3], dtype=torch.int32)
    out32 = torch.empty(3, dtype=torch.int32)
    T.cpu_data("add_int", out32, [c, None], [0, (-4) & U64], ival=1)
    assert torch.equal(out32, c - 4)
    T.cpu_data("mul_int", out, [a, None], [0, 3])
    assert torch.equal(out, a * 3)


@pytest.mark.parametrize("otype", INDEX)
def test_arange_and_fill(otype):
    out = torch.empty(9, dtype=otype)
    T.cpu_data("arange", out, [None, None], [5, (-3) & U64])
    assert torch.equal(out, torch.arange(5, 5 - 27, -3, dtype=otype))
    for dtype, v in ((otype, -2), (torch.float16, 0.1), (torch.bfloat16, float("-inf")), (torch.bool, True)):
        f = torch.empty(2, 3, dtype=dtype)
        T.cpu_data("fill", f, [None], [DH.bits_of(v, dtype)])
        assert torch.equal(f, torch.full((2, 3), v, dtype=dtype))


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("v", [0, 1, -1, 3.5, 1e-8, float("inf"), -65504, 2 ** 31 - 1])
def test_bits_of_matches_torch(dtype, v):
    try:
        ref = torch.tensor(v, dtype=dtype)
    except (RuntimeError, OverflowError):
        return
    if not dtype.is_floating_point and dtype != torch.bool and float(v) != int(v):
        with pytest.raises(ValueError):
            DH.bits_of(v, dtype)
        return
    if dtype == torch.float16 and abs(v) > 65504 and v != float("inf"):
        return
    raw = torch.empty((), dtype=dtype)
    T.cpu_data("fill", raw, [None], [DH.bits_of(v, dtype)])
    assert torch.equal(raw, ref), (v, dtype)


def test_bits_of_refuses_what_does_not_fit():
    """bits_of (csrc/sched/record.h: the one definition, used by the handlers and the dispatcher front): a value past
    the dtype's range raises OverflowError, a non-integer for an integer dtype ValueError; NaN in bf16 is its quiet
    NaN; a Python int past int64 is still a float constant; bools convert."""
    for v, dtype in ((1e6, torch.float16), (1e39, torch.float32), (2 ** 31, torch.int32), (2 ** 64, torch.int64),
                     (1.0, torch.int8)):
        with pytest.raises(OverflowError):
            DH.bits_of(v, dtype)
    for v in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            DH.bits_of(v, torch.int64)
    assert DH.bits_of(float("nan"), torch.bfloat16) == 0x7FC0
    assert DH.bits_of(2 ** 70, torch.float32) == int(torch.tensor(2.0 ** 70).view(torch.int32).item()) & 0xFFFFFFFF
    assert DH.bits_of(True, torch.int32) == 1 and DH.bits_of(-1, torch.int64) == U64
    with pytest.raises(TypeError):
        DH.bits_of(1, "int64")


def test_cpu_data_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown op 'add'"):
        T.cpu_data("add", torch.empty(1), [torch.empty(1), torch.empty(1)], [0, 0])
    with pytest.raises(ValueError, match="takes 2 inputs"):
        T.cpu_data("gather", torch.empty(1), [torch.empty(1)], [0])
    with pytest.raises(TypeError, match="CPU tensors"):
        T.cpu_data("fill", torch.empty(1, dtype=torch.complex64), [None], [0])


# ----------------------------------------------------------------------------- the scheduler's handlers, on the CPU
# gpuos/_data_handlers.py with its device test and its calls into the extension replaced: CPU tensors count as the
# device's, sched_data runs the op at once through cpu_data (the worker's rule), casts / amax run in torch. Each
# handler's parsing, output allocation and operand encoding are then checked against the aten op itself.
@pytest.fixture
def cpu_handlers(monkeypatch):
    import types

    def data(op, out, ins, bits=None, dim=0, ival=0, keepdim=False, fresh=True, thr=1 << 15):
        bits = list(bits) if bits is not None else [0] * len(ins)
        T.cpu_data(op, out, list(ins), bits, int(dim), int(ival), bool(keepdim))
        return out

    def cast(x, dtype, out, thr):
        return x.to(dtype) if out is None else out.copy_(x)

    ext = types.SimpleNamespace(sched_cast=cast, sched_reduce=lambda op, x, keepdim, thr: x.amax(-1, keepdim=keepdim))
    monkeypatch.setattr(DH, "_dev", lambda t: True)
    monkeypatch.setattr(DH, "_data", data)
    monkeypatch.setattr(DH, "_ext", ext)
    monkeypatch.setattr(DH, "_factory_device", lambda kw: torch.device("cpu") if kw.get("device") else None)
    h = DH.handlers()
    h.update(IH.compare_handlers())
    return h, IH.int_handlers()


A = torch.ops.aten


def _same(got, ref):
    if isinstance(ref, tuple):
        assert isinstance(got, tuple) and len(got) == len(ref)
        for g, r in zip(got, ref):
            _same(g, r)
        return
    assert isinstance(got, torch.Tensor), got
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.dtype, ref.shape)
    assert torch.equal(got.nan_to_num(), ref.nan_to_num()) and torch.equal(got.isnan(), ref.isnan())


def _cases():
    w = torch.randn(20, 6)
    x3 = torch.randn(4, 5, 6).transpose(0, 2)
    idx = torch.tensor([[3, 0], [19, 7]])
    cache = torch.randn(1, 2, 8, 4)
    k = torch.randn(1, 2, 2, 4)
    pos = torch.tensor([6, 1])
    logits = torch.randint(0, 3, (2, 9)).float()
    cond = torch.rand(2, 1, 6) > 0.5
    f16 = torch.randn(2, 3, 6).half()
    i64 = torch.tensor([[5, -3, 1 << 40]])
    i32 = torch.tensor([2, 3, 4], dtype=torch.int32)
    return [
        (A.embedding.default, (w, idx), {}),
        (A.embedding.default, (w, idx, 0), {}),
        (A.index_select.default, (x3, 1, torch.tensor([4, 0])), {}),
        (A.index_select.default, (x3, -1, torch.tensor(2)), {}),
        (A.index_copy.default, (cache, 2, pos, k), {}),
        (A.index_put.default, (cache, [None, None, torch.tensor([-1, 2])], k), {}),
        (A.index_put.default, (cache, [None, None, torch.tensor(3)], torch.ones(4)), {}),
        (A.argmax.default, (logits, -1, True), {}),
        (A.argmax.default, (logits, 0), {}),
        (A.argmax.default, (logits,), {}),
        (A.max.dim, (logits, 1), {}),
        (A.max.dim, (logits, 0, True), {}),
        (A.where.self, (cond, f16, f16[0]), {}),
        (A.where.self, (cond, f16, torch.tensor(-1.5)), {}),
        (A.where.ScalarOther, (cond, i64.t().expand(3, 6), 7), {}),
        (A.masked_fill.Scalar, (f16, cond, float("-inf")), {}),
        (A.masked_fill.Tensor, (f16, cond, torch.tensor(2.0)), {}),
        (A.clone.default, (x3,), {}),
        (A.clone.default, (i64.t(),), {}),
        (A.lt.Tensor, (i64, torch.tensor([[4], [2]])), {}),
        (A.le.Scalar, (f16, 0.1), {}),
        (A.ne.Tensor, (logits, logits.flip(-1)), {}),
        (A.arange.start_step, (3, 20, 4), {"device": "cpu"}),
        (A.arange.default, (6,), {"device": "cpu", "dtype": torch.int32}),
        (A.full.default, ([2, 3], -2.5), {"device": "cpu", "dtype": torch.bfloat16}),
        (A.full.default, ([2], 7), {"device": "cpu"}),
        (A.zeros.default, ([3],), {"device": "cpu"}),
        (A.ones.default, ([2, 2],), {"device": "cpu", "dtype": torch.int64}),
        (A.scalar_tensor.default, (-1.0,), {"device": "cpu", "dtype": torch.float16}),
        ("int", A.add.Tensor, (i64, torch.tensor(3)), {}),
        ("int", A.sub.Tensor, (i64, i32.view(3, 1)), {"alpha": 2}),
        ("int", A.mul.Scalar, (i32, -4), {}),
        ("int", A._to_copy.default, (i32,), {"dtype": torch.int64}),
        ("int", A._to_copy.default, (i64,), {"dtype": torch.float32}),
        ("int", A._to_copy.default, (torch.tensor([-2.7, 3.9]),), {"dtype": torch.int64}),
        ("int", A._to_copy.default, (torch.tensor([True, False]),), {"dtype": torch.int32}),
    ]


@pytest.mark.parametrize("case", range(len(_cases())))
def test_handlers_match_aten_on_cpu(cpu_handlers, case):
    h, ih = cpu_handlers
    c = _cases()[case]
    table = ih if c[0] == "int" else h
    ov, args, kwargs = c[1:] if c[0] == "int" else c
    got = table[ov](1 << 20, args, kwargs)
    assert not DH._is_reason(got), f"{ov} refused: {got}"
    _same(got, ov(*args, **kwargs))


def test_inplace_handlers_write_self_on_cpu(cpu_handlers):
    h, ih = cpu_handlers
    cache = torch.randn(1, 2, 8, 4)
    ref = cache.clone()
    k, pos = torch.randn(1, 2, 1, 4), torch.tensor([5])
    assert h[A.index_copy_.default](1 << 20, (cache, 2, pos, k), {}) is cache
    ref.index_copy_(2, pos, k)
    h[A.index_put_.default](1 << 20, (cache, [None, None, torch.tensor([-1])], k * 2), {})
    ref[:, :, -1:] = k * 2
    m = torch.rand(8, 4) > 0.5
    assert h[A.masked_fill_.Scalar](1 << 20, (cache, m, 0.5), {}) is cache
    ref.masked_fill_(m, 0.5)
    assert torch.equal(cache, ref)
    c = torch.tensor(4)
    assert ih[A.add_.Tensor](1 << 20, (c, 1), {}) is c and c.item() == 5


def test_handlers_refuse_what_torch_would_reject_or_we_do_not_do(cpu_handlers):
    h, ih = cpu_handlers
    cache, k = torch.zeros(1, 2, 8, 4), torch.ones(1, 2, 1, 4)
    refused = [
        h[A.index_copy_.default](1, (cache, 2, torch.tensor([1], dtype=torch.int32), k), {}),  # torch: int64 only
        h[A.index_copy_.default](1, (cache, 2, torch.tensor([1, 2]), k), {}),                   # no broadcasting
        h[A.index_copy_.default](1, (cache, 2, torch.tensor(1), k[:, :, 0]), {}),               # dims must match
        h[A.index_put_.default](1, (cache, [None, None, torch.tensor([1])], k, True), {}),      # accumulate
        h[A.index_put_.default](1, (cache, [torch.tensor([0]), None, torch.tensor([1])], k), {}),  # two indices
        h[A.index_put_.default](1, (cache, [None, None, torch.tensor([True] * 8)], k), {}),      # a bool mask
        h[A.where.self](1, (torch.ones(3, dtype=torch.bool), torch.ones(3), torch.ones(3).half()), {}),
        h[A.arange.default](1, (5.5,), {"device": "cpu"}),
        ih[A.add.Tensor](1, (torch.tensor([1]), 0.5), {}),                                     # promotes to float
        ih[A._to_copy.default](1, (torch.tensor([1]),), {"dtype": torch.bool}),
    ]
    assert all(DH._is_reason(r) for r in refused), refused
    assert torch.equal(cache, torch.zeros(1, 2, 8, 4))


def test_handlers_refuse_shapes_that_do_not_broadcast(cpu_handlers):
    """Eager raises torch's own error for these: the handlers must refuse, not raise their own."""
    h, ih = cpu_handlers
    a, b = torch.ones(3, dtype=torch.int64), torch.ones(4, dtype=torch.int64)
    assert DH._is_reason(h[A.where.self](1, (torch.ones(3, dtype=torch.bool), a, b), {}))
    assert DH._is_reason(h[A.lt.Tensor](1, (a, b), {}))
    assert DH._is_reason(ih[A.add.Tensor](1, (a, b), {}))
    assert DH._is_reason(h[A.masked_fill.Scalar](1, (a, torch.ones(4, dtype=torch.bool), 0), {}))

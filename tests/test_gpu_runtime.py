"""GPU runtime: numerics vs torch, strides, intra-batch dependencies, stream ordering, bounded waits, lifecycle,
ring overflow, stats, threads, warm-start cache (foreign work -- GEMMs, the burst grid, early publications, the
claim trace -- in test_gpu_foreign_work.py).

Every output is poisoned with NaN before submit, and every input is fresh random data, so a
sub-op that is skipped, reads stale memory or runs too early shows up as a mismatch.
"""

import json
import os
import re
import threading
import time

import pytest
import torch
from torch.testing import assert_close

import gpuos
import gpuos_ext
from _helpers import describe, run_python

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["f32", "f16", "bf16"]
OPS = ["add", "sub", "mul", "div"]
TORCH_OP = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
BOUND_S = 10.0  # "returns within bounded time"
SLEEP_CYCLES = 20_000_000  # ~10 ms spin kernel: makes stream-ordering bugs visible


def submit(op):
    return getattr(gpuos_ext, f"submit_{op}")


def ga(shape, dtype=torch.float32):
    """fresh random input"""
    return torch.randn(shape, device=DEV, dtype=torch.float32).to(dtype)


def gb(shape, dtype=torch.float32, op="div"):
    """fresh random input; for div kept at |b| >= 0.5"""
    b = torch.randn(shape, device=DEV, dtype=torch.float32)
    if op == "div":
        b = torch.where(b >= 0, b + 0.5, b - 0.5)
    return b.to(dtype)


def nan(shape, dtype=torch.float32):
    if isinstance(shape, int):
        shape = (shape,)
    return torch.full(shape, float("nan"), device=DEV, dtype=dtype)


def ref(op, a, b):
    """op computed in fp32 and rounded to the input dtype"""
    return TORCH_OP[op](a.float(), b.float()).to(a.dtype)


def gpu_sleep():
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(SLEEP_CYCLES)


# ============================================================================ numerics

@pytest.mark.parametrize("numel", [1, 255, 256, 4097, 1_000_000])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_op_matches_torch(rt, op, dtype, numel):
    a, b, out = ga(numel, dtype), gb(numel, dtype, op), nan(numel, dtype)
    expected = ref(op, a, b)
    submit(op)(a, b, out)
    rt.flush(sync=True)
    assert_close(out, expected)
    # inputs untouched
    assert_close(ref(op, a, b), expected)


@pytest.mark.parametrize("count,n,mode", [
    (1, 257, "single"), (7, 257, "single"), (1000, 257, "single"),
    (1, 257, "many"), (7, 257, "many"), (1000, 257, "many"),
    (100_000, 16, "many"),
])
def test_number_of_subops(rt, count, n, mode):
    """`count` sub-ops in one batch (100k overflows the default ring: automatic flushes)."""
    A, B, O = ga((count, n)), gb((count, n)), nan((count, n))
    ops = [OPS[i % 4] for i in range(count)]
    E = torch.empty_like(A)
    for k, op in enumerate(OPS):
        E[k::4] = ref(op, A[k::4], B[k::4])
    ra, rb, ro = A.unbind(0), B.unbind(0), O.unbind(0)
    if mode == "single":
        for i in range(count):
            submit(ops[i])(ra[i], rb[i], ro[i])
    else:
        for k, op in enumerate(OPS):
            idx = range(k, count, 4)
            if len(idx):
                rt.submit_many(op, [ra[i] for i in idx], [rb[i] for i in idx], [ro[i] for i in idx])
    rt.flush(sync=True)
    assert_close(O, E)


def test_submit_many_accepts_tuples(rt):
    a = [ga(100) for _ in range(3)]
    b = [gb(100) for _ in range(3)]
    o = [nan(100) for _ in range(3)]
    rt.submit_many("div", tuple(a), tuple(b), tuple(o))
    rt.flush(sync=True)
    for x, y, z in zip(a, b, o):
        assert_close(z, x / y)


def test_mixed_dtypes_ops_and_sizes_in_one_batch(rt):
    cases = []
    for dtype in DTYPES:
        for op in OPS:
            for numel in (3, 4096, 10_000):
                a, b, o = ga(numel, dtype), gb(numel, dtype, op), nan(numel, dtype)
                cases.append((ref(op, a, b), o))
                submit(op)(a, b, o)
    rt.flush(sync=True)
    for expected, o in cases:
        assert_close(o, expected)


# ============================================================================ strides

def _case_transposed_a(g, h):
    return g((64, 48)).t(), h((48, 64)), (48, 64), lambda t: t


def _case_transposed_b(g, h):
    return g((48, 64)), h((64, 48)).t(), (48, 64), lambda t: t


def _case_transposed_out(g, h):
    return g((48, 64)), h((48, 64)), (64, 48), lambda t: t.t()


def _case_all_transposed_multitile(g, h):
    return g((300, 300)).t(), h((300, 300)).t(), (300, 300), lambda t: t.t()


def _case_stepped_slices(g, h):
    return g((64, 128))[:, ::2], h((64, 128))[:, ::2], (64, 128), lambda t: t[:, ::2]


def _case_row_step_and_offset(g, h):
    return g((90, 80))[3::3, 5:], h((40, 80))[2:31, :-5], (30, 75), lambda t: t[1:, :]


def _case_offset_views(g, h):
    return g((70, 80))[3:, 5:], h((70, 80))[:-3, :-5], (70, 80), lambda t: t[2:-1, 1:-4]


def _case_expanded_a_row(g, h):
    return g((1, 64)).expand(48, 64), h((48, 64)), (48, 64), lambda t: t


def _case_expanded_b_col(g, h):
    return g((48, 64)), h((48, 1)).expand(48, 64), (48, 64), lambda t: t


def _case_expanded_scalar_multitile(g, h):
    return g((1,)).expand(10_000), h((10_000,)), (10_000,), lambda t: t


def _case_permuted_3d(g, h):
    return (g((8, 16, 32)).permute(2, 0, 1), h((32, 8, 16)), (16, 32, 8),
            lambda t: t.permute(1, 2, 0))


def _case_large_strided(g, h):
    return (g((1200, 1000))[:, ::2].t(), h((500, 2400))[:, ::2], (1200, 500), lambda t: t.t())


def _case_zero_dim(g, h):
    return g(()), h(()), (), lambda t: t


STRIDED = {f.__name__[len("_case_"):]: f for f in [
    _case_transposed_a, _case_transposed_b, _case_transposed_out, _case_all_transposed_multitile,
    _case_stepped_slices, _case_row_step_and_offset, _case_offset_views, _case_expanded_a_row,
    _case_expanded_b_col, _case_expanded_scalar_multitile, _case_permuted_3d, _case_large_strided,
    _case_zero_dim,
]}


@pytest.mark.parametrize("case", list(STRIDED))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", ["sub", "div"])
def test_strided(rt, op, dtype, case):
    a, b, base_shape, view = STRIDED[case](lambda s: ga(s, dtype), lambda s: gb(s, dtype, op))
    base = nan(base_shape, dtype)
    out = view(base)
    assert out.shape == a.shape == b.shape, (out.shape, a.shape, b.shape)
    written = torch.zeros(base_shape, dtype=torch.bool, device=DEV)
    view(written).fill_(True)
    expected = ref(op, a, b)
    submit(op)(a, b, out)
    rt.flush(sync=True)
    assert_close(out, expected)
    # nothing outside the out view was written
    assert base[~written].isnan().all(), "wrote outside the strided output view"


def test_channels_last_4d(rt):
    a = ga((2, 3, 17, 19)).contiguous(memory_format=torch.channels_last)
    b = gb((2, 3, 17, 19))
    out = nan((2, 3, 17, 19)).contiguous(memory_format=torch.channels_last)
    submit("mul")(a, b, out)
    rt.flush(sync=True)
    assert_close(out, a * b)


def test_empty_tensor_is_a_noop(rt):
    a, b, out = ga((0, 5)), gb((0, 5)), nan((0, 5))
    rt.submit_add(a, b, out)
    c, d, o2 = ga(10), gb(10), nan(10)
    rt.submit_add(c, d, o2)
    rt.flush(sync=True)
    assert_close(o2, c + d)


# ============================================================================ in-place

@pytest.mark.parametrize("kind", ["out_is_a", "out_is_b", "out_is_a_is_b", "a_is_b",
                                  "strided_out_is_a", "out_is_identical_view_of_a"])
@pytest.mark.parametrize("op", OPS)
def test_in_place(rt, op, kind):
    a, b = ga((64, 100)), gb((64, 100), op=op)
    if kind == "out_is_a":
        args = (a, b, a)
        expected = ref(op, a, b)
    elif kind == "out_is_b":
        args = (a, b, b)
        expected = ref(op, a, b)
    elif kind == "out_is_a_is_b":
        x = gb((64, 100), op=op)
        args = (x, x, x)
        expected = ref(op, x, x)
    elif kind == "a_is_b":
        x, out = gb((64, 100), op=op), nan((64, 100))
        args = (x, x, out)
        expected = ref(op, x, x)
    elif kind == "strided_out_is_a":
        x = a[:, ::2]
        args = (x, b[:, ::2], x)
        expected = ref(op, x, b[:, ::2])
    else:  # out is a distinct tensor object viewing exactly the same memory as a
        args = (a, b, a[:])
        expected = ref(op, a, b)
    submit(op)(*args)
    rt.flush(sync=True)
    assert_close(args[2], expected)


# ============================================================================ intra-batch dependencies

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("numel", [1000, 1_000_000])
def test_chain_add_then_mul(rt, dtype, numel):
    a, b, c = ga(numel, dtype), ga(numel, dtype), ga(numel, dtype)
    x, y = nan(numel, dtype), nan(numel, dtype)
    ex = ref("add", a, b)
    ey = ref("mul", ex, c)
    rt.submit_add(a, b, x)
    rt.submit_mul(x, c, y)
    rt.flush(sync=True)
    assert_close(x, ex)
    assert_close(y, ey)


def test_diamond_dag(rt):
    n = 300_000
    a, b, c, d = ga(n), ga(n), ga(n), gb(n)
    x, y, z, w = nan(n), nan(n), nan(n), nan(n)
    rt.submit_add(a, b, x)
    rt.submit_mul(a, c, y)
    rt.submit_sub(x, y, z)
    rt.submit_div(z, d, w)
    rt.flush(sync=True)
    assert_close(w, ((a + b) - (a * c)) / d)


def test_long_in_place_chain(rt):
    """RAW + WAW on the same tensor, 60 levels deep, multi-tile."""
    n = 100_000
    x0 = ga(n)
    x = x0.clone()
    expected = x0.clone()
    for i in range(60):
        op = OPS[i % 4]
        if op in ("mul", "div"):
            v = 1.0 + 0.01 * ga(n)
        else:
            v = ga(n)
        submit(op)(x, v, x)
        expected = TORCH_OP[op](expected, v)
    rt.flush(sync=True)
    assert_close(x, expected)


def test_write_after_read_hazard(rt):
    """y reads the OLD x; the later sub-op overwrites x. Sequential semantics must hold."""
    n = 200_000
    x, a, b, c = ga(n), ga(n), ga(n), ga(n)
    y = nan(n)
    ey = x + b
    ex = a * c
    rt.submit_add(x, b, y)
    rt.submit_mul(a, c, x)
    rt.flush(sync=True)
    assert_close(y, ey)
    assert_close(x, ex)


def test_dependency_through_overlapping_views(rt):
    """Two sub-ops write interleaved column views of `base`; a third reads all of `base`."""
    a1, b1, a2, b2 = ga((64, 500)), ga((64, 500)), ga((64, 500)), ga((64, 500))
    c = ga((64, 1000))
    base = nan((64, 1000))
    y = nan((64, 1000))
    eb = torch.empty(64, 1000, device=DEV)
    eb[:, ::2] = a1 + b1
    eb[:, 1::2] = a2 - b2
    rt.submit_add(a1, b1, base[:, ::2])
    rt.submit_sub(a2, b2, base[:, 1::2])
    rt.submit_mul(base, c, y)
    rt.flush(sync=True)
    assert_close(base, eb)
    assert_close(y, eb * c)


def test_chain_through_submit_many(rt):
    k, n = 50, 5000
    a = [ga(n) for _ in range(k)]
    b = [ga(n) for _ in range(k)]
    c = [ga(n) for _ in range(k)]
    x = [nan(n) for _ in range(k)]
    y = [nan(n) for _ in range(k)]
    rt.submit_many("add", a, b, x)
    rt.submit_many("mul", x, c, y)
    rt.flush(sync=True)
    for i in range(k):
        assert_close(y[i], (a[i] + b[i]) * c[i])


def test_chain_across_flushes_without_sync(rt):
    n = 1_000_000
    a, b, c = ga(n), ga(n), ga(n)
    x, y = nan(n), nan(n)
    gpu_sleep()
    rt.submit_add(a, b, x)
    rt.flush()
    rt.submit_mul(x, c, y)
    rt.flush()
    assert_close(y, (a + b) * c)


# ============================================================================ stream ordering

@pytest.mark.parametrize("numel", [4097, 1_000_000])
def test_output_consumed_right_after_flush(rt, numel):
    for _ in range(5):
        a, b, out = ga(numel), ga(numel), nan(numel)
        expected = (a + b) * 2
        gpu_sleep()  # the batch cannot start before this; a consumer not ordered after it sees NaN
        rt.submit_add(a, b, out)
        rt.flush()
        z = out * 2  # torch, same stream, no host sync
        assert_close(z, expected)


def test_input_produced_right_before_submit(rt):
    n = 1_000_000
    for _ in range(5):
        a, b = ga(n), ga(n)
        expected = a * 3 + b
        buf, out = nan(n), nan(n)
        gpu_sleep()
        torch.mul(a, 3, out=buf)  # producer queued on the stream, not finished
        rt.submit_add(buf, b, out)
        rt.flush()
        assert_close(out, expected)


def test_non_default_stream(rt):
    n = 1_000_000
    s = torch.cuda.Stream()
    a, b = ga(n), ga(n)
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(s):
        buf, out = nan(n), nan(n)
        gpu_sleep()
        torch.mul(a, 2, out=buf)
        rt.submit_sub(buf, b, out)
        rt.flush()
        z = out + 1
    s.synchronize()
    assert_close(z, a * 2 - b + 1)


# ============================================================================ input errors on CUDA

SHAPE_44 = r"[\[(]4, 4[\])]"
SHAPE_45 = r"[\[(]4, 5[\])]"


@pytest.mark.parametrize("bad", ["b", "out"])
@pytest.mark.parametrize("op", OPS)
def test_shape_mismatch_is_value_error(rt, op, bad):
    args = {"a": ga((4, 4)), "b": gb((4, 4)), "out": nan((4, 4))}
    args[bad] = nan((4, 5))
    with pytest.raises(ValueError, match=SHAPE_44) as ei:
        submit(op)(args["a"], args["b"], args["out"])
    msg = str(ei.value)
    assert re.search(SHAPE_45, msg), msg
    assert f"submit_{op}" in msg, msg


@pytest.mark.parametrize("other", ["b", "out"])
def test_dtype_mismatch_is_type_error(rt, other):
    """The message must reflect the actual dtypes (not just list the supported ones): two
    different mismatches give different messages, each naming the odd dtype."""
    msgs = {}
    for odd, pattern in ((torch.float16, r"float16|\bHalf\b"), (torch.bfloat16, r"bfloat16|BFloat16")):
        args = {"a": ga((4, 4)), "b": gb((4, 4)), "out": nan((4, 4))}
        args[other] = args[other].to(odd)
        with pytest.raises(TypeError, match=r"float32|\bFloat\b") as ei:
            rt.submit_mul(args["a"], args["b"], args["out"])
        msg = str(ei.value)
        assert re.search(pattern, msg), msg
        assert "submit_mul" in msg, msg
        msgs[odd] = msg
    assert msgs[torch.float16] != msgs[torch.bfloat16], "message does not depend on the dtypes"


@pytest.mark.parametrize("dtype,pattern", [(torch.int64, r"int64|\bLong\b"),
                                           (torch.float64, r"float64|\bDouble\b"),
                                           (torch.int32, r"int32|\bInt\b")])
def test_unsupported_dtype_is_type_error(rt, dtype, pattern):
    a = torch.arange(16, device=DEV).reshape(4, 4).to(dtype)
    with pytest.raises(TypeError, match=pattern):
        rt.submit_add(a, a.clone(), torch.empty_like(a))


def test_submit_many_length_mismatch_on_cuda(rt):
    with pytest.raises(ValueError, match=r"(?i)len"):
        rt.submit_many("add", [ga(8), ga(8)], [ga(8)], [nan(8), nan(8)])


def test_submit_many_shape_mismatch_on_cuda(rt):
    with pytest.raises(ValueError, match=SHAPE_45):
        rt.submit_many("add", [ga((4, 4)), ga((4, 4))], [ga((4, 4)), ga((4, 5))],
                       [nan((4, 4)), nan((4, 4))])


@pytest.mark.parametrize("kind", ["out_ahead_of_a", "out_behind_b", "2d_shifted_columns"])
def test_partial_overlap_is_value_error(rt, kind):
    if kind == "out_ahead_of_a":
        x = ga(101)
        a, b, out = x[:-1], ga(100), x[1:]
    elif kind == "out_behind_b":
        x = ga(101)
        a, b, out = ga(100), x[1:], x[:-1]
    else:
        x = ga((16, 17))
        a, b, out = x[:, :-1], ga((16, 16)), x[:, 1:]
    with pytest.raises(ValueError, match=r"(?i)overlap"):
        rt.submit_add(a, b, out)


def test_expanded_out_is_rejected(rt):
    """An out with stride-0 dims would have several elements write one location."""
    a, b = ga((8, 16)), ga((8, 16))
    out = nan((1, 16)).expand(8, 16)
    with pytest.raises(ValueError):
        rt.submit_add(a, b, out)


def test_rejected_submit_leaves_batch_intact(rt):
    a, b, out = ga(5000), ga(5000), nan(5000)
    rt.submit_add(a, b, out)
    with pytest.raises(ValueError):
        rt.submit_add(ga((4, 4)), ga((4, 5)), nan((4, 4)))
    with pytest.raises(TypeError):
        rt.submit_add(ga(4), ga(4).half(), nan(4))
    c, o2 = ga(5000), nan(5000)
    rt.submit_sub(out, c, o2)
    rt.flush(sync=True)
    assert_close(out, a + b)
    assert_close(o2, a + b - c)


# ============================================================================ bounded waits

def _alloc_free_1gib():
    big = torch.empty(1 << 28, dtype=torch.float32, device=DEV)  # 1 GiB
    big.fill_(1.0)
    del big
    torch.cuda.empty_cache()


@pytest.mark.parametrize("action", ["synchronize", "empty_cache", "alloc_free_1gib"])
def test_torch_calls_return_promptly_after_flush(rt, action):
    fn = {"synchronize": torch.cuda.synchronize, "empty_cache": torch.cuda.empty_cache,
          "alloc_free_1gib": _alloc_free_1gib}[action]
    # put freed blocks in the caching allocator so empty_cache really calls cudaFree
    tmp = torch.empty(64 << 20, dtype=torch.float32, device=DEV)
    del tmp
    n = 1_000_000
    a, b, out = ga(n), ga(n), nan(n)
    torch.cuda.synchronize()
    rt.submit_add(a, b, out)
    rt.flush()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    assert dt < BOUND_S, f"{action} took {dt:.1f} s right after flush()"
    assert_close(out, a + b)


def test_flush_sync_and_idle_then_synchronize(rt):
    a, b, out = ga(1000), ga(1000), nan(1000)
    rt.submit_add(a, b, out)
    rt.flush(sync=True)
    time.sleep(0.05)  # worker idles (and should exit)
    t0 = time.perf_counter()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert time.perf_counter() - t0 < BOUND_S
    assert_close(out, a + b)


def test_flush_with_nothing_pending(rt):
    rt.flush()
    rt.flush(sync=True)
    torch.cuda.synchronize()


# ============================================================================ lifecycle

def test_shutdown_completes_pending_work(rt):
    n = 300_000
    a, b, c = ga(n), ga(n), ga(n)
    x, y = nan(n), nan(n)
    rt.submit_add(a, b, x)
    rt.submit_mul(x, c, y)
    rt.shutdown()  # no flush before it
    assert rt.is_initialized() is False
    assert_close(x, a + b)
    assert_close(y, (a + b) * c)


def test_init_shutdown_init_computes(rt):
    for i in range(3):
        rt.shutdown()
        assert rt.is_initialized() is False
        rt.init()
        assert rt.is_initialized() is True
        rt.init()  # idempotent
        a, b, out = ga(10_000), gb(10_000), nan(10_000)
        rt.submit_div(a, b, out)
        rt.flush(sync=True)
        assert_close(out, a / b)


def test_submit_after_shutdown_reinitialises(rt):
    rt.shutdown()
    a, b, out = ga(1000), ga(1000), nan(1000)
    rt.submit_add(a, b, out)
    assert rt.is_initialized() is True
    rt.flush(sync=True)
    assert_close(out, a + b)


def test_gpuos_package_functions_work(rt):
    a, b, out = ga(1000), ga(1000), nan(1000)
    gpuos.submit_sub(a, b, out)
    gpuos.flush(sync=True)
    assert_close(out, a - b)


# ============================================================================ ring overflow

@pytest.fixture
def small_ring(rt):
    rt.shutdown()
    rt.init(capacity=64)
    yield rt
    rt.flush(sync=True)
    rt.shutdown()
    rt.init()


def test_queue_full_never_drops(small_ring):
    rt = small_ring
    k, n = 1000, 100
    A, B, O = ga((k, n)), gb((k, n)), nan((k, n))
    E = torch.empty_like(A)
    for j, op in enumerate(OPS):
        E[j::4] = ref(op, A[j::4], B[j::4])
    for i, (a, b, o) in enumerate(zip(A.unbind(0), B.unbind(0), O.unbind(0))):
        submit(OPS[i % 4])(a, b, o)
    rt.flush(sync=True)
    assert_close(O, E)


def test_queue_full_multitile_subops(small_ring):
    rt = small_ring
    k, n = 200, 10_000  # 3 tiles each: 600 tiles through a 64-slot ring
    a = [ga(n) for _ in range(k)]
    b = [ga(n) for _ in range(k)]
    o = [nan(n) for _ in range(k)]
    rt.submit_many("mul", a, b, o)
    rt.flush(sync=True)
    for x, y, z in zip(a, b, o):
        assert_close(z, x * y)


def test_queue_full_chain_across_automatic_flushes(small_ring):
    rt = small_ring
    n = 5000
    x = ga(n)
    expected = x.clone()
    for i in range(300):
        v = ga(n)
        if i % 2:
            rt.submit_add(x, v, x)
            expected = expected + v
        else:
            rt.submit_sub(x, v, x)
            expected = expected - v
    rt.flush()
    assert_close(x * 1, expected)


def test_flush_publishes_before_waiting_for_ring_room(small_ring):
    """A flush whose levels do not fit the ring beside the batches still in flight publishes the levels it has
    committed before it waits for room for the next, so the worker runs them meanwhile (room_publishes); every
    level's result is kept."""
    rt = small_ring
    n = 10_000  # 3 tiles per level: 60 dependent levels, 180 descriptors through 64 slots
    x = ga(n)
    vs = [ga(n) for _ in range(60)]
    expected = x.clone()
    for v in vs:
        expected = expected + v
    before = rt.stats()["room_publishes"]
    for v in vs:
        rt.submit_add(x, v, x)
    rt.flush(sync=True)
    assert_close(x, expected)
    assert rt.stats()["room_publishes"] > before, "every level was committed before the first was published"


def test_single_subop_larger_than_ring(small_ring):
    rt = small_ring
    n = 1_000_000  # 245 tiles > 64 slots
    a, b, out = ga(n), ga(n), nan(n)
    rt.submit_add(a, b, out)
    rt.flush(sync=True)
    assert_close(out, a + b)


# ============================================================================ stats

def test_stats_counters_increase(rt):
    s0 = rt.stats()
    a, b = ga(1000), ga(1000)
    o1, o2, o3 = nan(1000), nan(1000), nan(1000)
    rt.submit_add(a, b, o1)
    rt.submit_mul(a, b, o2)
    rt.submit_sub(a, b, o3)
    s1 = rt.stats()
    assert s1["submitted"] - s0["submitted"] == 3, (s0, s1)
    rt.flush(sync=True)
    s2 = rt.stats()
    assert s2["flushes"] - s0["flushes"] == 1, (s0, s2)
    assert s2["batches"] > s0["batches"], (s0, s2)
    assert s2["worker_launches"] >= 1, s2
    assert s2["submitted"] - s0["submitted"] == 3, (s0, s2)
    rt.submit_many("add", [a, b], [b, a], [o1, o2])
    assert rt.stats()["submitted"] > s2["submitted"]
    for k, v in s2.items():
        if k in ("submitted", "batches", "flushes", "worker_launches", "handovers",
                 "jit_compiles", "cache_hits"):
            assert isinstance(v, int) and v >= 0, (k, v)


# ============================================================================ threads

@pytest.mark.parametrize("streams", ["shared_stream", "stream_per_thread"])
def test_multithreaded_submit_and_flush(rt, streams):
    errors = []
    n_threads, iters, n = 4, 25, 20_000

    def worker(tid):
        try:
            s = torch.cuda.Stream() if streams == "stream_per_thread" else torch.cuda.current_stream()
            with torch.cuda.stream(s):
                for it in range(iters):
                    a, b = ga(n), gb(n)
                    outs = {op: nan(n) for op in OPS}
                    for op in OPS:
                        submit(op)(a, b, outs[op])
                    rt.flush()
                    for op in OPS:
                        assert_close(outs[op], TORCH_OP[op](a, b),
                                     msg=lambda m, op=op, it=it: f"thread {tid} iter {it} {op}: {m}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((tid, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(n_threads)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads hung (>60 s)"
    assert not errors, errors


# ============================================================================ warm start compiles nothing

_WARM_SCRIPT = """
    import json, sys
    import torch
    import gpuos, gpuos_ext
    try:
        gpuos_ext.init()
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for op in ("add", "sub", "mul", "div"):
                a = torch.randn(5000, device="cuda").to(dtype)
                b = (torch.rand(5000, device="cuda") + 0.5).to(dtype)
                out = torch.full_like(a, float("nan"))
                getattr(gpuos_ext, "submit_" + op)(a, b, out)
                gpuos_ext.flush(sync=True)
                exp = getattr(torch, op)(a.float(), b.float()).to(dtype)
                torch.testing.assert_close(out, exp)
        s = gpuos_ext.stats()
        gpuos_ext.shutdown()
    except gpuos.CompileError as e:
        print("COMPILE_ERROR", e)
        sys.exit(3)
    print("STATS " + json.dumps(s))
"""


def _stats_from(proc):
    for line in proc.stdout.splitlines():
        if line.startswith("STATS "):
            return json.loads(line[len("STATS "):])
    raise AssertionError("no STATS line\n" + describe(proc))


@pytest.mark.watchdog(400)
def test_warm_second_process_compiles_nothing(requires_gpu, tmp_path):
    cache = tmp_path / "cache"
    cold = run_python(_WARM_SCRIPT, {"GPUOS_CACHE_DIR": str(cache)}, timeout=120)
    assert cold.returncode == 0, describe(cold)
    s_cold = _stats_from(cold)
    assert s_cold["jit_compiles"] >= 1, f"cold start compiled nothing?\n{s_cold}"
    assert any(files for _, _, files in os.walk(cache)), "cold start wrote no cache files"

    warm = run_python(_WARM_SCRIPT, {"GPUOS_CACHE_DIR": str(cache), "GPUOS_FORBID_COMPILE": "1"},
                      timeout=120)
    assert warm.returncode == 0, "warm start needed a compile:\n" + describe(warm)
    s_warm = _stats_from(warm)
    assert s_warm["jit_compiles"] == 0, s_warm
    assert s_warm["cache_hits"] >= 1, s_warm

    fresh = run_python(_WARM_SCRIPT, {"GPUOS_CACHE_DIR": str(tmp_path / "fresh"),
                                      "GPUOS_FORBID_COMPILE": "1"}, timeout=120)
    assert fresh.returncode == 3, "GPUOS_FORBID_COMPILE=1 with an empty cache must raise " \
                                  "CompileError:\n" + describe(fresh)


@pytest.mark.watchdog(300)
def test_doctor_selftest_on_the_gpu():
    """`python -m gpuos --selftest` on a GPU: NVRTC compiles the worker for this GPU's arch, the explicit API, the
    scheduler and a reduction agree with eager, shutdown completes; exit status 0."""
    import subprocess
    import sys

    from _helpers import REPO_ROOT, describe
    out = subprocess.run([sys.executable, "-m", "gpuos", "--selftest"], capture_output=True, text=True, timeout=280,
                         cwd=REPO_ROOT)
    assert out.returncode == 0, describe(out)
    for check in ("pass  NVRTC compiles the worker for sm_", "pass  explicit API", "pass  scheduler_context",
                  "pass  submit_reduce", "pass  shutdown", "Result: OK"):
        assert check in out.stdout, (check, out.stdout)

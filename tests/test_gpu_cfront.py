"""The scheduler's dispatcher front (csrc/sched/cfront.h) on CUDA tensors: functional elementwise ops recorded in
C++ at the dispatcher, no-data ops run below the dispatch mode, every other op handed on to the mode unchanged --
results equal eager, and what the front must not take (a negative-bit view, a tensor autograd must see, another mode
on top) goes on to the mode."""
import pytest
import torch
import torch.nn.functional as F
import gpuos
import gpuos_ext
from _helpers import seen_ops_mode

pytestmark = pytest.mark.gpu


def _counted(step, worker=None):
    """step() under a scheduler context without grad -- the worker's "matmul" or "attention" switched on for it
    when named -- and the front's counters before and after: (results, before, after)."""
    switch = {"matmul": (gpuos.worker_matmul_enabled, gpuos.set_worker_matmul),
              "attention": (gpuos.worker_attention_enabled, gpuos.set_worker_attention)}.get(worker)
    was = switch[0]() if switch else None
    if switch:
        switch[1](True)
    try:
        with torch.no_grad(), gpuos.scheduler_context():
            c0 = gpuos_ext.cfront_info()
            out = step()
            c1 = gpuos_ext.cfront_info()
    finally:
        if switch:
            switch[1](was)
    return out, c0, c1


def _delta(before, after):
    return {k: after[k] - before[k] for k in ("seen", "recorded", "nodata")}


def _chain(x):
    y = torch.sigmoid(torch.relu(x * 2.0 + 1.0))
    return (y - x).view(-1).unsqueeze(0)


def test_functional_chain_is_recorded_by_the_front():
    x = torch.randn(64, 256, device="cuda")
    ref = _chain(x)
    before, s0 = gpuos_ext.cfront_info(), gpuos.stats()
    with gpuos.scheduler_context(front=False):  # the torch-function front off: every op reaches the dispatcher
        out = _chain(x)
    after, s1 = gpuos_ext.cfront_info(), gpuos.stats()
    torch.testing.assert_close(out, ref)
    d = _delta(before, after)
    assert d["recorded"] >= 5 and d["nodata"] >= 2, d  # mul, add, relu, sigmoid, sub; view, unsqueeze
    assert s1["ops_intercepted"] - s0["ops_intercepted"] >= d["recorded"], (s0["ops_intercepted"], s1["ops_intercepted"])


@pytest.mark.parametrize("cfront", [True, False])
def test_negative_view_and_autograd_inputs_go_to_the_mode(cfront):
    """A Negative-bit view reaches the dispatch mode unresolved in copy_ / clone (they resolve the bit themselves):
    never recorded as plain memory (reason math_bits), with or without the front."""
    x = torch.randn(32, 128, device="cuda")
    neg = torch._neg_view(x)  # a Negative-bit view: its kernel must resolve the bit
    w = torch.randn(32, 128, device="cuda", requires_grad=True)
    before = gpuos_ext.cfront_info()
    with gpuos.scheduler_context(front=False, cfront=cfront):
        a = neg + 1.0
        b = w * 2.0
        c = torch.empty_like(x).copy_(neg)
        d = neg.clone()
    after = gpuos_ext.cfront_info()
    torch.testing.assert_close(a, -x + 1.0)
    torch.testing.assert_close(b.detach(), w.detach() * 2.0)
    torch.testing.assert_close(c, -x)
    torch.testing.assert_close(d, -x)
    assert b.grad_fn is not None
    if cfront:
        assert _delta(before, after)["recorded"] == 0, _delta(before, after)


def test_another_mode_on_top_sees_every_op():
    x = torch.randn(16, 64, device="cuda")
    before = gpuos_ext.cfront_info()
    with gpuos.scheduler_context(front=False):
        with seen_ops_mode() as seen:
            y = (x + 1.0).relu().view(-1)
    after = gpuos_ext.cfront_info()
    torch.testing.assert_close(y, (x + 1.0).relu().view(-1))
    assert {"aten.add.Tensor", "aten.relu.default", "aten.view.default"} <= set(seen.funcs), seen.funcs
    assert _delta(before, after)["recorded"] == 0 and _delta(before, after)["nodata"] == 0


def test_views_of_pending_outputs_read_the_right_values():
    """A view the front runs below the mode (no flush) of an output still deferred, then read by a recorded op and
    by an eager one (a matmul: the dispatch mode flushes first)."""
    x = torch.randn(8, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda")
    with gpuos.scheduler_context(front=False):
        y = (x * 3.0).sigmoid()
        v = y.view(4, 128).transpose(0, 1)
        z = v + 1.0
        m = y @ w
    torch.testing.assert_close(z, (x * 3.0).sigmoid().view(4, 128).transpose(0, 1) + 1.0)
    torch.testing.assert_close(m, (x * 3.0).sigmoid() @ w, rtol=1e-4, atol=1e-4)


def test_reshape_that_copies_reads_written_values():
    """reshape copies when no view can do (repeat_kv's expand + reshape): the front must not run it below the mode
    (its copy would read a deferred output before the worker wrote it) -- it decomposes, and its clone reaches the
    mode, which flushes first."""
    x = torch.randn(4, 2, 64, device="cuda")
    before = gpuos_ext.cfront_info()
    with gpuos.scheduler_context(front=False):
        y = torch.sigmoid(x * 3.0)                               # deferred
        r = y[:, None].expand(4, 3, 2, 64).reshape(12, 128)    # a copy of y, repeated
        t = y.transpose(0, 1).reshape(-1)                        # a copy (not viewable)
    after = gpuos_ext.cfront_info()
    ref = torch.sigmoid(x * 3.0)
    torch.testing.assert_close(r, ref[:, None].expand(4, 3, 2, 64).reshape(12, 128))
    torch.testing.assert_close(t, ref.transpose(0, 1).reshape(-1))
    assert _delta(before, after)["recorded"] >= 2, _delta(before, after)  # mul (a Python number), sigmoid


@pytest.mark.parametrize("cfront", [True, False])
def test_results_equal_with_and_without_the_front(cfront):
    torch.manual_seed(0)
    x = torch.randn(4, 1, 256, device="cuda", dtype=torch.float16)
    g = torch.ones(256, device="cuda", dtype=torch.float16)

    def step(t):
        v = t.float().pow(2).mean(-1, keepdim=True)
        return (g * (t.float() * torch.rsqrt(v + 1e-6)).to(torch.float16)) * torch.sigmoid(t) + t

    ref = step(x)
    with gpuos.scheduler_context(cfront=cfront):
        out = step(x)
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)


def test_direct_calls_reach_the_handlers():
    """Reductions, matmuls and casts -- no fast spec, no composite -- go from the front straight to the scheduler's
    handlers (csrc/sched/cfront_call.cpp): results equal eager and the calls are counted; a tensor that needs grad
    keeps the mode's way through Autograd."""
    torch.manual_seed(0)
    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.float16)

    def step(t):
        h = torch.mm(t, w)
        return h.float().pow(2).mean(-1, keepdim=True), torch.amax(h, dim=-1), h.to(torch.float32).sum(0)

    ref = step(x)
    before = gpuos_ext.cfront_info()
    with torch.no_grad(), gpuos.scheduler_context():
        out = step(x)
    after = gpuos_ext.cfront_info()
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=2e-2, atol=2e-2)
    # mm, the two _to_copy, mean, amax recorded by the front itself (cfront_native.cpp), sum(0) by a direct call
    taken = sum(after[k] - before[k] for k in ("direct", "native"))
    assert taken >= 5 and after["direct"] > before["direct"], (before, after)
    wg = w.float().requires_grad_()
    with gpuos.scheduler_context():
        y = torch.mm(x.float(), wg)
    assert y.grad_fn is not None
    torch.testing.assert_close(y.detach(), x.float() @ w.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_native_matmuls_and_casts_are_recorded_by_the_front(dtype):
    """mm / bmm / addmm at decode sizes and floating casts are recorded by the front itself (no Python handler):
    counted native, results equal eager (an integer cast too, through the integer data op); a product of too many
    rows goes on to its handler."""
    torch.manual_seed(0)
    x = torch.randn(4, 256, device="cuda", dtype=dtype)
    w = torch.randn(256, 128, device="cuda", dtype=dtype)
    b = torch.randn(128, device="cuda", dtype=dtype)
    q, k = torch.randn(8, 1, 64, device="cuda", dtype=dtype), torch.randn(8, 64, 32, device="cuda", dtype=dtype)
    big = torch.randn(512, 256, device="cuda", dtype=dtype)

    def step():
        return (torch.mm(x, w), torch.addmm(b, x, w, beta=0.5, alpha=2.0), torch.bmm(q, k), x.float(),
                torch.mm(big, w), x.to(torch.int32))

    ref = step()
    out, c0, c1 = _counted(step, "matmul")
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.float(), r.float(), rtol=2e-2, atol=2e-1)
    assert c1["native"] - c0["native"] == 5, (c0, c1)  # mm, addmm, bmm, the float and the integer cast
    assert c1["direct"] - c0["direct"] >= 1, (c0, c1)  # the 512-row product: its handler


def test_native_reductions_are_recorded_by_the_front():
    """Last-dim reductions (mean.dim, sum.dim_IntList, amax, _softmax: softmax.int decomposes into it) are recorded
    by the front itself: counted native, results equal eager; one over another dim and one with a dtype go on to
    their handler."""
    torch.manual_seed(0)
    x = torch.randn(4, 1, 256, device="cuda", dtype=torch.float16)

    def step():
        f = x.float()
        return (f.pow(2).mean(-1, keepdim=True), torch.amax(f, dim=-1), torch.softmax(f, -1), f.sum(-1),
                f.sum(0), x.sum(-1, dtype=torch.float32))

    ref = step()
    out, c0, c1 = _counted(step)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.float(), r.float(), rtol=1e-3, atol=1e-3)
    assert c1["native"] - c0["native"] >= 5, (c0, c1)  # the cast, mean, amax, _softmax, sum(-1)
    assert c1["direct"] - c0["direct"] >= 2, (c0, c1)  # sum(0), sum(dtype=)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_native_clones_and_joins_are_recorded_by_the_front(dtype):
    """clone (preserve / contiguous format, of a transposed and of an expanded view: HF repeat_kv) and cat (HF
    rotate_half's halves, a legacy empty piece, dtypes promoted, a negative dim) are recorded by the front itself:
    counted native, values equal eager; an integer clone, a channels-last clone and a cat with an integer piece go
    on to their handlers."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, device="cuda", dtype=dtype)
    kv = torch.randn(1, 2, 5, 8, device="cuda", dtype=dtype)
    i = torch.arange(12, device="cuda").view(3, 4)
    img = torch.randn(1, 3, 4, 4, device="cuda", dtype=dtype)
    empty = torch.empty(0, device="cuda", dtype=dtype)

    def step():
        h = x * 2
        rot = torch.cat((-h[..., 8:], h[..., :8]), dim=-1)
        rep = kv[:, :, None].expand(1, 2, 3, 5, 8).clone(memory_format=torch.contiguous_format)
        return (rot, torch.cat([empty, h, x.float()], 1), h.transpose(0, 1).clone(), rep,
                h.mT.clone(memory_format=torch.contiguous_format),
                i.clone(), img.clone(memory_format=torch.channels_last), torch.cat([i.float(), i], 0))

    ref = step()
    out, c0, c1 = _counted(step)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype and o.stride() == r.stride(), (o.shape, o.stride(), r.stride())
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    assert c1["native"] - c0["native"] >= 5, (c0, c1)  # two cats, three clones (and x.float() but from fp32: a cast)
    assert c1["direct"] - c0["direct"] >= 3, (c0, c1)  # the integer clone, channels-last, the integer cat


def test_native_mask_builders_are_recorded_by_the_front():
    """The data ops HF's mask code issues per step -- scalar_tensor (torch.where(cond, number, number) makes two),
    where.self and integer arange (each overload) -- are recorded by the front itself: counted native, values,
    dtypes and shapes equal eager; a float arange goes on to its handler."""
    dev = torch.device("cuda", torch.cuda.current_device())
    pos = torch.arange(6, device=dev)
    x = torch.randn(2, 8, device=dev, dtype=torch.float16)
    m16 = torch.finfo(torch.float16).min

    def step():
        r = torch.arange(8, device=dev)
        mask = r[None, :] <= pos[:, None]
        return (torch.where(mask, 0.0, m16), torch.where(mask[:2], x, torch.zeros_like(x)),
                torch.arange(3, 11, device=dev, dtype=torch.int32), torch.arange(10, -5, -4, device=dev),
                torch.scalar_tensor(7, device=dev, dtype=torch.int64), torch.scalar_tensor(True, device=dev),
                torch.arange(0.0, 2.0, 0.5, device=dev), torch.where(mask[:2], x, 2.0),
                torch.scalar_tensor(1e6, device=dev, dtype=torch.float32))

    ref = step()
    out, c0, c1 = _counted(step)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype and o.device == r.device, (o, r)
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    # 3 integer aranges, 2 + 2 scalar_tensors (the first where's and the two asked for; float32 1e6 fits), 2 wheres
    assert c1["native"] - c0["native"] >= 9, (c0, c1)
    assert c1["direct"] - c0["direct"] >= 1, (c0, c1)  # the float arange


def test_integer_arithmetic_is_recorded_by_the_front():
    """add / sub / mul on integer operands (positions, cache lengths: refused by the float record) are recorded by the
    front as the worker's integer arithmetic: counted native, values and dtypes equal eager (int32 + int64
    promotes, alpha, a Python number, a CPU 0-d tensor, wrapping at int64's edge); an integer tensor plus 0.5 (a
    float result) goes on to the mode."""
    dev = torch.device("cuda", torch.cuda.current_device())
    pos = torch.arange(5, device=dev)
    p32 = torch.arange(5, device=dev, dtype=torch.int32)
    edge = torch.full((2,), (1 << 63) - 1, device=dev)

    def step():
        return (pos + 1, pos - p32, torch.add(pos, pos, alpha=3), pos * torch.tensor(7), torch.mul(p32, 3),
                torch.sub(p32, 2), edge + 1, pos + 0.5)

    ref = step()
    out, c0, c1 = _counted(step)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype and o.shape == r.shape, (o, r)
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    assert c1["native"] - c0["native"] == 7, (c0, c1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_native_comparisons_embedding_and_integer_casts_are_recorded_by_the_front(dtype):
    """What HF's mask and input code issues per step beside the matmuls -- comparisons (le.Tensor of positions, a
    float tensor against a number rounded to its dtype, a transposed one, a CPU 0-d operand), embedding, and casts
    with an integer side (int64 -> int32 / float, bool -> int64, float -> int64 truncating) -- are recorded by the
    front itself: counted native, values, dtypes and shapes equal eager; an integer tensor against a float number
    (a float compare) and a cast to bool go on to their handlers."""
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(0)
    pos, cache_pos = torch.arange(6, device=dev), torch.tensor([3, 4], device=dev)
    x = torch.randn(4, 8, device=dev, generator=g).to(dtype)
    w = torch.randn(32, 16, device=dev, generator=g).to(dtype)
    ids = torch.tensor([[1, 5, 31], [0, 0, 7]], device=dev)

    def step():
        return (pos[None, :] <= cache_pos[:, None], x > 0.1, x.t() < 0.0, pos == torch.tensor(2), pos.ne(3),
                F.embedding(ids, w), pos.to(torch.int32), pos.to(dtype), (pos > 2).to(torch.int64),
                (x * 10).to(torch.int64), pos.lt(2.5), pos.to(torch.bool))

    ref = step()
    out, c0, c1 = _counted(step)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype and o.device == r.device, (o, r)
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    # le, gt, lt, eq, ne, embedding, 4 casts, the second gt; the float compare and the cast to bool: direct calls
    assert c1["native"] - c0["native"] == 11, (c0, c1)
    assert c1["direct"] - c0["direct"] >= 2, (c0, c1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_native_layer_norm_and_fills_are_recorded_by_the_front(dtype):
    """GPT-2's layer norms (native_layer_norm over the last dim, with and without weight and bias) and the fills of
    the eager-attention path (zeros / ones / full) are recorded by the front itself: counted native, outputs within
    the dtype's tolerance of eager's (the fills exact: values, dtypes, shapes); a layer norm over two dims goes on to
    its handler."""
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.randn(1, 3, 64, device=dev, generator=g) * 3 + 1).to(dtype)
    w, b = torch.randn(64, device=dev, generator=g).to(dtype), torch.randn(64, device=dev, generator=g).to(dtype)

    def step():
        return (F.layer_norm(x, (64,), w, b, 1e-5), F.layer_norm(x, (64,)), F.layer_norm(x, (64,), w, None, 1e-3),
                torch.zeros(2, 3, device=dev), torch.ones(4, device=dev, dtype=dtype),
                torch.full((2, 2), 7, device=dev), torch.full((3,), True, device=dev),
                torch.full((2,), -1.5, device=dev, dtype=dtype), F.layer_norm(x.view(1, 3, 8, 8), (8, 8)))

    ref = step()
    out, c0, c1 = _counted(step)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.shape == r.shape and o.dtype == r.dtype, (i, o, r)
        torch.testing.assert_close(o, r, **(tol if i in (0, 1, 2, 8) else {"rtol": 0, "atol": 0}))
    assert c1["native"] - c0["native"] == 8, (c0, c1)  # three layer norms, five fills
    assert c1["direct"] - c0["direct"] >= 1, (c0, c1)   # the two-dim layer norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_native_argmax_is_recorded_by_the_front(dtype):
    """Greedy decoding's next token -- argmax over the vocabulary (the last dim of a strided view, keepdim or not),
    over another dim, over every element of a contiguous tensor -- is recorded by the front itself: counted native,
    indices equal eager's (a tie takes the first); over every element of a transposed tensor it goes on to its
    handler."""
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(2, 5, 300, device=dev, generator=g).to(dtype)
    logits[0, 4, 7] = logits[0, 4, 9] = 100.0  # a tie in the last row

    def step():
        return (logits[:, -1].argmax(-1), logits.argmax(-1, keepdim=True), logits.argmax(1), logits[0].argmax(),
                logits[0].t().argmax())

    ref = step()
    out, c0, c1 = _counted(step)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype == torch.int64, (o, r)
        assert torch.equal(o, r), (o, r)
    assert out[0][0].item() == 7
    assert c1["native"] - c0["native"] == 4 and c1["direct"] - c0["direct"] >= 1, (c0, c1)


def _inplace_inputs(dev):
    g = torch.Generator(device=dev).manual_seed(0)
    return {"cache": torch.zeros(1, 2, 16, 8, device=dev, dtype=torch.float16),
            "cache_t": torch.zeros(1, 16, 2, 8, device=dev, dtype=torch.float16).transpose(1, 2),  # strided
            "kv": torch.randn(1, 2, 1, 8, device=dev, generator=g).half(),
            "kv2": torch.randn(1, 2, 2, 8, device=dev, generator=g).half(),
            "pos": torch.tensor([3], device=dev), "pos2": torch.tensor([9, 5], device=dev),
            "p0": torch.tensor(12, device=dev), "n": torch.arange(4, device=dev),
            "x": torch.randn(4, 32, device=dev, generator=g), "y": torch.randn(4, 32, device=dev, generator=g)}


def _inplace_step(t):
    """What a static-cache decode step writes in place: the KV cache (index_copy_ with a 1-d, a two-position and a
    0-d index; a strided cache), positions (integer add_ / sub_ / mul_) and a float residual (add_ with alpha,
    mul_). Returns whether each op returned self."""
    c, ct, n, x = t["cache"], t["cache_t"], t["n"], t["x"]
    same = [c.index_copy_(2, t["pos"], t["kv"]) is c, c.index_copy_(2, t["pos2"], t["kv2"]) is c,
            c.index_copy_(2, t["p0"], t["kv"]) is c, ct.index_copy_(2, t["pos2"], t["kv2"]) is ct]
    same += [t["pos"].add_(1) is t["pos"], n.mul_(3) is n, n.sub_(t["pos"], alpha=2) is n]
    same += [x.add_(t["y"], alpha=0.5) is x, x.mul_(2.0) is x]
    return same


def test_inplace_writes_are_recorded_by_the_front_with_version_counters():
    """KV cache writes (index_copy_), integer position updates (add_ / sub_ / mul_) and float in-place elementwise
    ops are recorded by the front itself (the front sits above ADInplaceOrView: cfront_inplace_done): counted native
    (7: four cache writes, three integer updates) and recorded (2), every op returns self, values equal eager, and
    each written tensor's version counter moves exactly as eager moves it."""
    dev = torch.device("cuda", torch.cuda.current_device())
    ref, got = _inplace_inputs(dev), _inplace_inputs(dev)
    v_ref = {k: t._version for k, t in ref.items()}
    same_ref = _inplace_step(ref)
    v_got = {k: t._version for k, t in got.items()}
    same, c0, c1 = _counted(lambda: _inplace_step(got))
    assert same == same_ref == [True] * 9
    for k in ref:  # the float residual within rounding (the worker's a + alpha * b may fuse differently)
        tol = {} if k == "x" else {"rtol": 0, "atol": 0}
        torch.testing.assert_close(got[k], ref[k], **tol, msg=k)
        assert got[k]._version - v_got[k] == ref[k]._version - v_ref[k], k
    assert c1["native"] - c0["native"] == 7 and c1["recorded"] - c0["recorded"] >= 2, (c0, c1)


def test_inplace_writes_the_front_must_not_take_go_to_the_mode():
    """An inference tensor written outside inference mode raises eager's error (the front leaves it to the mode and
    its kernels); inside inference mode it is recorded (no version counter to bump); a leaf that requires grad
    raises autograd's error; an int32 index raises torch's -- with the scheduler exactly as without it."""
    dev = torch.device("cuda", torch.cuda.current_device())
    with torch.inference_mode():
        inf = torch.zeros(4, device=dev, dtype=torch.int64)
    with gpuos.scheduler_context():
        with pytest.raises(RuntimeError, match="inference tensor"):
            inf.add_(1)
    with torch.inference_mode(), gpuos.scheduler_context():
        c0 = gpuos_ext.cfront_info()
        inf.add_(2)
        c1 = gpuos_ext.cfront_info()
    assert c1["native"] - c0["native"] == 1, (c0, c1)
    assert inf.tolist() == [3, 3, 3, 3]  # eager's first add_ wrote before it raised, as without the scheduler
    w = torch.zeros(4, device=dev, requires_grad=True)
    cache = torch.zeros(1, 2, 8, 4, device=dev)
    with gpuos.scheduler_context():
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            w.add_(1.0)
        with pytest.raises(RuntimeError, match="long tensor for index"):
            cache.index_copy_(2, torch.tensor([1], device=dev, dtype=torch.int32), torch.ones(1, 2, 1, 4, device=dev))
    assert torch.equal(w.detach(), torch.zeros(4, device=dev)) and not cache.any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_native_efficient_attention_is_recorded_by_the_front(dtype):
    """The efficient SDPA backend op (what F.scaled_dot_product_attention with a float mask runs: HF's sdpa path) at
    decode shapes, GQA, with a bias or causal, is recorded by the front itself: counted native, the output within
    tolerance of torch's; one asked for its log-sum-exp goes on to the handler."""
    torch.manual_seed(0)
    eff = torch.ops.aten._scaled_dot_product_efficient_attention.default
    q = torch.randn(1, 4, 1, 64, device="cuda", dtype=dtype)
    k = torch.randn(1, 2, 40, 64, device="cuda", dtype=dtype).repeat_interleave(2, 1)
    v = torch.randn(1, 2, 40, 64, device="cuda", dtype=dtype).repeat_interleave(2, 1)
    bias = torch.zeros(1, 1, 1, 40, device="cuda", dtype=dtype)
    bias[..., 30:] = torch.finfo(dtype).min

    def step():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            b = F.scaled_dot_product_attention(q, k, v, scale=0.1)
        return ((a,), (b,), eff(q, k, v, None, True, 0.0, False), eff(q, k, v, None, False, 0.0, False, scale=0.1))

    ref = step()
    out, c0, c1 = _counted(step, "attention")
    for o, r in zip(out, ref):
        torch.testing.assert_close(o[0], r[0], rtol=2e-2, atol=2e-2)
    assert out[2][1].shape == ref[2][1].shape and len(out[3]) == len(ref[3]) == 4
    assert c1["native"] - c0["native"] == 3 and c1["direct"] - c0["direct"] >= 1, (c0, c1)


# torch.autograd.forward_ad loads its jvp decompositions through torch.jit.script (deprecated in torch 2.13)
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_forward_ad_tangents_survive_the_scheduler():
    """A dual tensor's ops under the scheduler while a forward-AD level is open (the front steps aside: Autograd's
    forward-mode kernels must see them) give eager's primal and tangent; nothing is recorded by the front."""
    import torch.autograd.forward_ad as fwAD
    g = torch.Generator(device="cuda").manual_seed(0)
    x, t = torch.randn(4, 64, device="cuda", generator=g), torch.randn(4, 64, device="cuda", generator=g)
    w = torch.randn(64, 32, device="cuda", generator=g)

    def step():
        d = fwAD.make_dual(x, t)
        return fwAD.unpack_dual(torch.sigmoid(torch.mm(d * 2 - 1, w)).sum(-1))

    with fwAD.dual_level():
        ref = step()
    with fwAD.dual_level():
        got, c0, c1 = _counted(step, "matmul")
    assert got.tangent is not None
    torch.testing.assert_close(got.primal, ref.primal, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.tangent, ref.tangent, rtol=1e-4, atol=1e-4)
    assert all(c1[k] == c0[k] for k in ("recorded", "native", "direct")), (c0, c1)


def test_native_records_equal_their_handlers_bit_for_bit():
    """Every kind the front records itself (cfront_native.cpp, cfront_data.cpp) against the Python handler it stands
    in for: one step of each, once with the front's own records and once with them off (sched_set_cfront_native([],
    {}): the same ops by direct calls to the handlers, in place through the mode), both under the worker and with
    no timer flush -- results equal bit for bit, with the same dtypes, shapes and strides, and the in-place writes
    land the same."""
    from gpuos import scheduler as S
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(4, 64, device=dev, generator=g).half()
    w = torch.randn(64, 32, device=dev, generator=g).half()
    b = torch.randn(32, device=dev, generator=g).half()
    ln_w, ln_b = torch.randn(64, device=dev, generator=g).half(), torch.randn(64, device=dev, generator=g).half()
    emb = torch.randn(50, 64, device=dev, generator=g).half()
    ids = torch.tensor([[3, 49, 0]], device=dev)
    pos = torch.arange(6, device=dev)
    q = torch.randn(1, 4, 1, 32, device=dev, generator=g).half()
    kv = torch.randn(1, 4, 20, 32, device=dev, generator=g).half()

    def step(cache, n):
        h = torch.mm(x, w)
        mask = pos[None, :] <= pos[:3, None]
        return (h, torch.addmm(b, x, w, beta=0.5), h.float(), pos.to(torch.int32), (h * 4).to(torch.int64),
                h.t().clone(), torch.cat([h, h.float()], 0), torch.scalar_tensor(3.5, device=dev),
                torch.where(mask, 0.0, -1e4), torch.arange(2, 9, 3, device=dev), x > 0.25, F.embedding(ids, emb),
                h.argmax(-1), F.layer_norm(x, (64,), ln_w, ln_b), torch.zeros(3, 2, device=dev),
                torch.full((2,), 9, device=dev), h.float().mean(-1), torch.softmax(h.float(), -1),
                cache.index_copy_(2, pos[:2], kv[:, :, :2].contiguous()), n.add_(pos[:4]),
                torch.ops.aten._scaled_dot_product_efficient_attention(q, kv, kv, None, False)[0])

    def run(native):
        cache, n = torch.zeros(1, 4, 8, 32, device=dev, dtype=torch.float16), torch.arange(4, device=dev)
        was = (gpuos.worker_matmul_enabled(), gpuos.worker_attention_enabled())
        gpuos.set_worker_matmul(True), gpuos.set_worker_attention(True)
        try:
            with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):  # no timer: the same batches
                if not native:
                    gpuos_ext.sched_set_cfront_native([], {})
                c0 = gpuos_ext.cfront_info()
                try:
                    out = step(cache, n)
                finally:
                    c1 = gpuos_ext.cfront_info()
                    S._push_tables()
        finally:
            gpuos.set_worker_matmul(was[0]), gpuos.set_worker_attention(was[1])
        return out + (cache, n), c1["native"] - c0["native"]

    (mine, n_mine), (theirs, n_theirs) = run(True), run(False)
    # (integer add_ off the native table too: the fast table's integer retry, cfront_try_int_arith)
    assert n_mine >= 20 and n_theirs == 1, (n_mine, n_theirs)
    for i, (a, r) in enumerate(zip(mine, theirs)):
        assert a.dtype == r.dtype and a.shape == r.shape and a.stride() == r.stride(), (i, a.shape, r.shape)
        assert torch.equal(a, r), i

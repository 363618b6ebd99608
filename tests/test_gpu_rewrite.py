"""The deferred queue's rewrites (csrc/sched/rewrite.h), on the GPU: HF's repeat_kv read from its source by the
attention task (the copies dropped), residual adds folded into their matmul as its bias, and ops nobody can read
dropped -- each against eager, each with a case where the rewrite must not happen (a write in between, a product
or copy still read), checked by the counters in gpuos.stats(). The contexts run without the flush timer: a timer
flush between two ops (any first call may take 2 ms) would publish the first alone, and the counts would vary."""

import pytest
import torch
import torch.nn.functional as F

import gpuos
from _helpers import tiny_hf_llama

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}


@pytest.fixture
def worker_tasks():
    was_a, was_m = gpuos.worker_attention_enabled(), gpuos.worker_matmul_enabled()
    gpuos.set_worker_attention(True)
    gpuos.set_worker_matmul(True)
    yield
    gpuos.set_worker_attention(was_a)
    gpuos.set_worker_matmul(was_m)


def _counts():
    s = gpuos.stats()
    return {k: s[k] for k in ("epilogues", "copies_folded", "dead_ops", "gqa_reads")}


def _delta(before):
    now = _counts()
    return {k: now[k] - before[k] for k in now}


def repeat_kv(x, n_rep):  # transformers' models/llama: the expanded copy SDPA gets with a mask
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def _attn_inputs(dt, hkv, n_rep, L, g):
    q = torch.randn(1, hkv * n_rep, 1, 64, generator=g, device=DEV).to(dt)
    cache_k = torch.randn(1, hkv, L, 64, generator=g, device=DEV).to(dt)
    cache_v = torch.randn(1, hkv, L, 64, generator=g, device=DEV).to(dt)
    mask = torch.zeros(1, 1, 1, L, device=DEV, dtype=dt)
    mask[..., L // 2:] = torch.finfo(dt).min
    return q, cache_k, cache_v, mask


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("n_rep", [2, 4])
@pytest.mark.parametrize("masked", [True, False], ids=["mask", "nomask"])
def test_repeat_kv_is_read_from_its_source(rt, worker_tasks, dtype, n_rep, masked):
    dt = DTYPES[dtype]
    q, ck, cv, mask = _attn_inputs(dt, 2, n_rep, 48, torch.Generator(device=DEV).manual_seed(1))  # copies < 2^15
    m = mask if masked else None

    def step():
        return F.scaled_dot_product_attention(q, repeat_kv(ck, n_rep), repeat_kv(cv, n_rep), attn_mask=m)

    ref = step()
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        got = step()
    d = _delta(c0)
    assert d["gqa_reads"] == 2 and d["dead_ops"] >= 2, d  # k and v from the cache; both copies dropped
    torch.testing.assert_close(got.float(), ref.float(), atol=TOL[dt], rtol=TOL[dt])


def test_repeat_kv_written_between_keeps_the_copy(rt, worker_tasks):
    """The cache is written after the copy and before the attention: the attention must see the copy's values."""
    dt = torch.float16
    q, ck, cv, mask = _attn_inputs(dt, 2, 2, 64, torch.Generator(device=DEV).manual_seed(2))

    def step(ck, cv):
        k, v = repeat_kv(ck, 2), repeat_kv(cv, 2)
        ck.mul_(3)  # in place on the source
        cv.add_(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    ref = step(ck.clone(), cv.clone())
    c0 = _counts()
    ck2, cv2 = ck.clone(), cv.clone()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        got = step(ck2, cv2)
    assert _delta(c0)["gqa_reads"] == 0
    torch.testing.assert_close(got.float(), ref.float(), atol=TOL[dt], rtol=TOL[dt])
    torch.testing.assert_close(ck2, ck * 3)


def test_repeat_kv_copy_still_read_is_kept(rt, worker_tasks):
    """Python keeps the repeated k: the attention may read the source, but the copy must still be written."""
    dt = torch.float16
    q, ck, cv, mask = _attn_inputs(dt, 2, 4, 48, torch.Generator(device=DEV).manual_seed(3))
    ref_k = repeat_kv(ck, 4)
    ref = F.scaled_dot_product_attention(q, ref_k, repeat_kv(cv, 4), attn_mask=mask)
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        k = repeat_kv(ck, 4)
        got = F.scaled_dot_product_attention(q, k, repeat_kv(cv, 4), attn_mask=mask)
    d = _delta(c0)
    assert d["gqa_reads"] == 2 and d["dead_ops"] == 1, d  # only v's copy was unreadable
    torch.testing.assert_close(k, ref_k, atol=0, rtol=0)
    torch.testing.assert_close(got.float(), ref.float(), atol=TOL[dt], rtol=TOL[dt])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("form", ["res_plus_mm", "mm_plus_res", "alpha_on_mm", "alpha_on_res"])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("bias", ["none", "addmm", "addmm_scaled"])
def test_residual_add_folds_into_the_matmul(rt, worker_tasks, dtype, form, rows, bias):
    """F.linear (Llama) or GPT-2's Conv1D addmm (bias, optionally beta / alpha), then a residual add in each form."""
    dt = {"f32": torch.float32, **DTYPES}[dtype]
    g = torch.Generator(device=DEV).manual_seed(4)
    x = torch.randn(1, rows, 256, generator=g, device=DEV).to(dt)
    res = torch.randn(1, rows, 384, generator=g, device=DEV).to(dt)
    w = (torch.randn(384, 256, generator=g, device=DEV) / 16).to(dt)
    b = torch.randn(384, generator=g, device=DEV).to(dt)

    def step():
        if bias == "none":
            y = F.linear(x, w)
        else:
            kw = {"beta": 0.5, "alpha": 2.0} if bias == "addmm_scaled" else {}
            y = torch.addmm(b, x.view(-1, 256), w.t(), **kw).view(1, rows, 384)
        if form == "res_plus_mm":
            return res + y
        if form == "mm_plus_res":
            return y + res
        if form == "alpha_on_mm":
            return torch.add(res, y, alpha=0.5)
        return torch.add(y, res, alpha=2.0)

    ref = step()
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        got = step()
    assert _delta(c0)["epilogues"] == 1
    tol = TOL[dt] * 4
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


def test_residual_fold_refused_while_the_product_is_read(rt, worker_tasks):
    g = torch.Generator(device=DEV).manual_seed(5)
    x = torch.randn(1, 1, 256, generator=g, device=DEV).half()
    res = torch.randn(1, 1, 256, generator=g, device=DEV).half()
    w = (torch.randn(256, 256, generator=g, device=DEV) / 16).half()
    ry = F.linear(x, w)
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        y = F.linear(x, w)
        z = y + res
        bcast = F.linear(x, w) + res[0, 0]  # the other operand broadcasts: not a bias of the product's shape
    assert _delta(c0)["epilogues"] == 0
    torch.testing.assert_close(y, ry, atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(z.float(), (ry + res).float(), atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(bcast.float(), (ry + res[0, 0]).float(), atol=4e-3, rtol=4e-3)


def test_residual_fold_keeps_a_write_to_the_weight_in_order(rt, worker_tasks):
    """The weight is written between the product and the add: the product must use the old weight."""
    g = torch.Generator(device=DEV).manual_seed(6)
    x = torch.randn(1, 256, generator=g, device=DEV)
    res = torch.randn(1, 128, generator=g, device=DEV)
    w = torch.randn(128, 256, generator=g, device=DEV) / 16
    ref = F.linear(x, w) + res
    w2 = w.clone()
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        y = F.linear(x, w2)
        w2.mul_(2)
        got = y + res
        del y  # the product is read by the add alone: only the write keeps the fold out
    assert _delta(c0)["epilogues"] == 0
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w2, w * 2)


def rotate_half(x):  # transformers' models/llama
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_cat_of_a_computed_piece_writes_it_in_place(rt, dtype):
    """rotate_half: the neg writes its half of the cat's output (no copy of it); the rotary around it as HF has it."""
    dt = {"f32": torch.float32, **DTYPES}[dtype]
    g = torch.Generator(device=DEV).manual_seed(8)
    q = torch.randn(1, 1, 4, 64, generator=g, device=DEV).to(dt).transpose(1, 2)  # HF's (B, H, L, D) view
    cos = torch.randn(1, 1, 1, 64, generator=g, device=DEV).to(dt)
    sin = torch.randn(1, 1, 1, 64, generator=g, device=DEV).to(dt)

    def step():
        return q * cos + rotate_half(q) * sin, torch.cat((q[..., :16] * 2, q[..., 16:]), dim=-1)

    ref = step()
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        got = step()
    assert _delta(c0)["copies_folded"] == 2
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=TOL[dt], rtol=TOL[dt])


def test_cat_piece_still_read_is_copied(rt):
    g = torch.Generator(device=DEV).manual_seed(9)
    x = torch.randn(4, 64, generator=g, device=DEV)
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        n = -x[:, 32:]
        out = torch.cat((n, x[:, :32]), dim=-1)
        cast = torch.cat(((x[:, :32] * 3).half(), x[:, 32:]), dim=-1)  # the half piece is cast: a real copy
    assert _delta(c0)["copies_folded"] == 0
    torch.testing.assert_close(n, -x[:, 32:])
    torch.testing.assert_close(out, torch.cat((-x[:, 32:], x[:, :32]), dim=-1))
    torch.testing.assert_close(cast, torch.cat(((x[:, :32] * 3).half(), x[:, 32:]), dim=-1))


def test_unreadable_ops_are_dropped_and_live_ones_kept(rt):
    g = torch.Generator(device=DEV).manual_seed(7)
    a = torch.randn(1000, generator=g, device=DEV)
    b = a.clone()
    c0 = _counts()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        t = a * 2
        del t             # nobody can read it: dropped
        b.mul_(3)         # b is Python's: kept
        u = a + 1
        u.add_(1)         # in place on a live result: kept
    d = _delta(c0)
    assert d["dead_ops"] == 1, d
    torch.testing.assert_close(b, a * 3)
    torch.testing.assert_close(u, a + 2)


def test_hf_llama_decode_uses_the_rewrites(rt, worker_tasks):
    """HF Llama (GQA, sdpa, static cache) under the scheduler: eager's tokens, with repeat_kv read from the cache
    and the residual adds folded into o_proj / down_proj."""
    cfg, generate = tiny_hf_llama(DEV)
    with torch.no_grad():
        ref = generate("static")
        c0 = _counts()
        with gpuos.scheduler_context(auto_flush_ms=0):
            got = generate("static")
    d = _delta(c0)
    assert torch.equal(got, ref), (got, ref)
    steps = 7  # decode steps after the prefill (which may use the rewrites too: 12 rows fit both tasks)
    assert d["gqa_reads"] >= 2 * cfg.num_hidden_layers * steps, d
    assert d["epilogues"] >= 2 * cfg.num_hidden_layers * steps, d

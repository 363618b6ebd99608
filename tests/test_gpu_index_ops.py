"""Data-movement ops of a decode step in the worker (issue #16; ops.def kind 4, device_src/dataops.h), under
scheduler_context on the GPU, against eager torch: embedding / index_select (gathers), index_copy_ / index_put_
(KV-cache writes), argmax / max(dim), where / masked_fill, integer arithmetic and casts, arange / full / zeros /
scalar_tensor / clone. Each test checks that its op did not fall back (gpuos.stats()["fallback_ops"]), and the
ordering tests that a cache write and a later read of the cache in the same context see each other. Indices out
of range: never a read or write outside a tensor, NaN / 0 written, stats()["index_faults"] raised."""

import pytest
import torch
import torch.nn.functional as F

import gpuos
import gpuos_ext

pytestmark = pytest.mark.gpu

DEV = "cuda"
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
INDEX = [torch.int64, torch.int32]


def _fallbacks():
    return dict(gpuos.stats()["fallback_ops"])


def _new(before):
    return {k: v - before.get(k, 0) for k, v in gpuos.stats()["fallback_ops"].items() if v - before.get(k, 0)}


def _no_fallback(before, *names):
    new = _new(before)
    bad = {k: v for k, v in new.items() if any(n in k for n in names)}
    assert not bad, f"fell back: {bad} (all new fallbacks: {new}; reasons {gpuos.stats()['fallbacks']})"


def _gen(seed=0):
    return torch.Generator(device=DEV).manual_seed(seed)


# ----------------------------------------------------------------------------- gathers
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("itype", INDEX)
@pytest.mark.parametrize("ishape", [(0,), (1, 1), (7,), (2, 5)], ids=["empty", "one", "many", "batch"])
def test_embedding(rt, dtype, itype, ishape):
    w = torch.randn(50, 24, device=DEV, generator=_gen(1)).to(dtype)
    idx = torch.randint(0, 50, ishape, device=DEV, generator=_gen(2)).to(itype)
    ref = F.embedding(idx, w)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        y = F.embedding(idx, w)
        z = y * 2  # a consumer in the same batch
    _no_fallback(before, "embedding")
    assert y.shape == ref.shape and y.dtype == dtype and torch.equal(y, ref)
    assert torch.equal(z, ref * 2)


def test_embedding_strided_weight_and_index(rt):
    w = torch.randn(24, 50, device=DEV).t()           # (50, 24), column-major
    idx = torch.randint(0, 50, (3, 8), device=DEV)[:, ::2]
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        y = F.embedding(idx, w)
    _no_fallback(before, "embedding")
    assert torch.equal(y, F.embedding(idx, w))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("itype", INDEX)
def test_index_select(rt, dim, itype):
    x = torch.randn(4, 6, 5, device=DEV).transpose(0, 2)   # (5, 6, 4)
    idx = torch.tensor([3, 0, 0, 2], device=DEV, dtype=itype)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        y = x.index_select(dim, idx)
        y0 = x.index_select(dim, idx[1])               # a 0-d index keeps the dim
    _no_fallback(before, "index_select")
    assert torch.equal(y, x.index_select(dim, idx)) and torch.equal(y0, x.index_select(dim, idx[1]))


def test_gather_reads_deferred_work_and_feeds_it(rt):
    """The index and the table come from deferred ops; the result feeds another: dependency levels, no fusion."""
    w = torch.randn(16, 8, device=DEV)
    pos = torch.tensor([1, 5, 5], device=DEV)
    with torch.no_grad(), gpuos.scheduler_context():
        w2 = w * 3 + 1
        p2 = pos + 2
        y = F.embedding(p2, w2).sigmoid()
    assert torch.equal(y, F.embedding(pos + 2, w * 3 + 1).sigmoid())


# ----------------------------------------------------------------------------- cache writes
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("itype", [torch.int64])  # index_copy_ takes int64 indices only (torch raises otherwise)
@pytest.mark.parametrize("n", [0, 1, 4])
def test_index_copy_kv_cache_then_read(rt, dtype, itype, n):
    """HF StaticCache.update: k_cache.index_copy_(2, cache_position, k), then attention reads the cache."""
    cache = torch.randn(2, 4, 16, 32, device=DEV, generator=_gen(3)).to(dtype)
    k = torch.randn(2, 4, n, 32, device=DEV, generator=_gen(4)).to(dtype)
    pos = torch.randperm(16, device=DEV, generator=_gen(5))[:n].to(itype)
    ref = cache.clone().index_copy_(2, pos.long(), k)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        r = cache.index_copy_(2, pos, k)
        s = (cache * 2).sum(-1)                         # worker read of the written cache (same batch)
        host = cache[0, 0].float().cpu()                # an eager read: flushed first
    _no_fallback(before, "index_copy")
    assert r is cache and torch.equal(cache, ref)
    torch.testing.assert_close(s, (ref * 2).sum(-1), rtol=1e-2, atol=1e-2)
    assert torch.equal(host, ref[0, 0].float().cpu())


def test_index_copy_functional_and_strided(rt):
    base = torch.randn(2, 16, 4, 8, device=DEV)
    cache = base.transpose(1, 2)                        # (2, 4, 16, 8) non-contiguous
    k = torch.randn(2, 4, 8, 2, device=DEV).transpose(2, 3)   # (2, 4, 2, 8) strided
    pos = torch.tensor([9, 3], device=DEV)
    ref_out = torch.index_copy(cache, 2, pos, k)
    ref_cache = cache.clone().index_copy_(2, pos, k * 0)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        out = torch.index_copy(cache, 2, pos, k)       # reads the cache before the in-place write below
        cache.index_copy_(2, pos, k * 0)
    _no_fallback(before, "index_copy")
    assert torch.equal(out, ref_out) and torch.equal(cache, ref_cache)
    assert torch.equal(base.transpose(1, 2), ref_cache)  # written through the view


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [4, 16], ids=["elements", "vectors"])
def test_index_put_cache_write_with_negative_index(rt, dtype, width):
    """cache[:, :, pos] = k (aten::index_put_ with one index tensor), negative indices count from the end; 16 elements
    per position move as 16-byte vectors (dataops.h data_vec_elems), 4 one by one."""
    cache = torch.zeros(1, 2, 8, width, device=DEV, dtype=dtype)
    k = torch.randn(1, 2, 2, width, device=DEV).to(dtype)
    pos = torch.tensor([-1, 2], device=DEV)
    ref = cache.clone()
    ref[:, :, pos] = k
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        cache[:, :, pos] = k
        m = cache.amax(-1)
    _no_fallback(before, "index_put")
    assert torch.equal(cache, ref) and torch.equal(m, ref.amax(-1))


def test_index_put_broadcast_values(rt):
    x = torch.zeros(5, 3, device=DEV)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        x[torch.tensor([0, 4], device=DEV)] = torch.tensor([1.0, 2.0, 3.0], device=DEV)
    _no_fallback(before, "index_put")
    assert torch.equal(x[0], torch.tensor([1.0, 2.0, 3.0], device=DEV)) and torch.equal(x[4], x[0])
    assert (x[1:4] == 0).all()


# ----------------------------------------------------------------------------- argmax / max
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_ties_nan_and_greedy_pattern(rt, dtype, keepdim):
    logits = torch.randint(0, 5, (3, 1000), device=DEV, generator=_gen(6)).to(dtype)  # ties everywhere
    logits[1, 17] = float("nan")
    logits[1, 900] = float("nan")
    logits[2] = float("-inf")
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        a = logits.argmax(-1, keepdim=keepdim)
        nxt = logits[:, -1:].argmax(-1)                 # a strided column
        a0 = logits.argmax(0)                           # another dim: a moved view
    _no_fallback(before, "argmax")
    assert torch.equal(a, logits.argmax(-1, keepdim=keepdim)) and torch.equal(nxt, logits[:, -1:].argmax(-1))
    assert torch.equal(a0, logits.argmax(0))
    assert a.view(-1)[1].item() == 17


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim,keepdim", [(-1, False), (-1, True), (0, True)])
def test_max_dim_values_and_indices(rt, dtype, dim, keepdim):
    x = torch.randint(0, 7, (4, 33), device=DEV, generator=_gen(7)).to(dtype)
    x[2, 3] = float("nan")
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        v, i = x.max(dim, keepdim=keepdim)
    _no_fallback(before, "max.dim")
    rv, ri = x.max(dim, keepdim=keepdim)
    assert torch.equal(v.nan_to_num(), rv.nan_to_num()) and torch.equal(i, ri)


def test_argmax_flat(rt):
    x = torch.randn(3, 5, device=DEV)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        a = x.argmax()
    _no_fallback(before, "argmax")
    assert a.dim() == 0 and a.item() == x.argmax().item()


# ----------------------------------------------------------------------------- where / masked_fill
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_where_broadcast_mask(rt, dtype):
    cond = torch.rand(1, 1, 4, 9, device=DEV) > 0.5
    a = (torch.randn(2, 3, 4, 9, device=DEV) * 10).to(dtype)
    b = (torch.randn(9, device=DEV) * 10).to(dtype)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        y = torch.where(cond, a, b)
        y2 = torch.where(cond, a, 0)                     # a Python number
    _no_fallback(before, "where")
    assert torch.equal(y, torch.where(cond, a, b)) and torch.equal(y2, torch.where(cond, a, 0))


@pytest.mark.parametrize("dtype", FLOATS)
def test_masked_fill_causal_mask_patterns(rt, dtype):
    scores = torch.randn(1, 2, 5, 5, device=DEV).to(dtype)
    causal = torch.ones(5, 5, device=DEV, dtype=torch.bool).triu(1)
    minval = torch.finfo(dtype).min
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        m1 = scores.masked_fill(causal, minval)
        m2 = scores.masked_fill(causal, torch.tensor(float("-inf")))           # a CPU 0-d value
        m3 = scores.masked_fill(causal, torch.tensor(2.0, device=DEV, dtype=dtype))  # a CUDA 0-d value
        s = scores.clone()
        s.masked_fill_(causal, 0.0)
    _no_fallback(before, "masked_fill")
    assert torch.equal(m1, scores.masked_fill(causal, minval))
    assert torch.equal(m2, scores.masked_fill(causal, float("-inf")))
    assert torch.equal(m3, scores.masked_fill(causal, 2.0))
    assert torch.equal(s, scores.masked_fill(causal, 0.0))


# ----------------------------------------------------------------------------- integers, factories
def test_position_arithmetic_stays_integer(rt):
    big = (1 << 60) + 7                                  # not representable in fp32: proves integer arithmetic
    pos = torch.tensor([big, 3], device=DEV)
    p32 = torch.tensor([5, 6], device=DEV, dtype=torch.int32)
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        a = pos + 1
        b = pos - p32 * 2
        c = pos.clone()
        c += 5
        d = p32.long() + torch.arange(2, device=DEV)
        e = torch.arange(7, 11, device=DEV).unsqueeze(0) + pos[1]
    _no_fallback(before, "add", "sub", "mul", "arange", "_to_copy", "clone")
    assert a.tolist() == [big + 1, 4] and b.tolist() == [big - 10, 3 - 12]
    assert c.tolist() == [big + 5, 8] and d.tolist() == [5, 7] and e.tolist() == [[10, 11, 12, 13]]


def test_factories(rt):
    before = _fallbacks()
    with torch.no_grad(), gpuos.scheduler_context():
        a = torch.arange(5, device=DEV)
        b = torch.arange(2, 20, 3, device=DEV, dtype=torch.int32)
        c = torch.full((2, 3), -2.5, device=DEV, dtype=torch.float16)
        d = torch.zeros(4, device=DEV)
        e = torch.ones(2, 2, device=DEV, dtype=torch.int64)
        f = torch.scalar_tensor(3.0, device=DEV)
    _no_fallback(before, "arange", "full", "zeros", "ones", "scalar_tensor")
    assert torch.equal(a, torch.arange(5, device=DEV)) and torch.equal(b, torch.arange(2, 20, 3, device=DEV,
                                                                                    dtype=torch.int32))
    assert torch.equal(c, torch.full((2, 3), -2.5, device=DEV, dtype=torch.float16))
    assert torch.equal(d, torch.zeros(4, device=DEV)) and torch.equal(e, torch.ones(2, 2, device=DEV).long())
    assert f.dim() == 0 and f.item() == 3.0


# ----------------------------------------------------------------------------- bad input
def test_index_out_of_range_is_flagged_never_read(rt):
    w = torch.randn(8, 4, device=DEV)
    idx = torch.tensor([1, 8, -1], device=DEV)
    cache = torch.zeros(1, 1, 4, 2, device=DEV)
    torch.cuda.synchronize()
    gpuos_ext.clear_index_faults()
    with torch.no_grad(), gpuos.scheduler_context():
        y = F.embedding(idx, w)
        cache.index_copy_(2, torch.tensor([0, 99], device=DEV), torch.ones(1, 1, 2, 2, device=DEV))
    torch.cuda.synchronize()
    assert gpuos.stats()["index_faults"] == 1
    assert torch.equal(y[0], w[1]) and y[1:].isnan().all()
    assert torch.equal(cache[0, 0, 0], torch.ones(2, device=DEV)) and (cache[0, 0, 1:] == 0).all()
    gpuos_ext.clear_index_faults()
    assert gpuos.stats()["index_faults"] == 0
    with torch.no_grad(), gpuos.scheduler_context():   # the runtime goes on working
        z = F.embedding(idx[:1], w) + 1
    assert torch.equal(z, w[1:2] + 1)


def test_wrong_index_dtype_falls_back_to_torchs_error(rt):
    w = torch.randn(8, 4, device=DEV)
    with pytest.raises((RuntimeError, IndexError)) as eager:
        F.embedding(torch.tensor([1.0], device=DEV), w)
    with torch.no_grad(), gpuos.scheduler_context():
        with pytest.raises(type(eager.value)):
            F.embedding(torch.tensor([1.0], device=DEV), w)
        with pytest.raises(RuntimeError):                # index_copy_ of another dtype: torch's message
            torch.zeros(4, 2, device=DEV).index_copy_(0, torch.tensor([0], device=DEV),
                                                       torch.ones(1, 2, device=DEV, dtype=torch.float16))
        with pytest.raises((RuntimeError, IndexError)):  # an int32 index: torch's error, not a silent write
            torch.zeros(4, 2, device=DEV).index_copy_(0, torch.tensor([0], device=DEV, dtype=torch.int32),
                                                       torch.ones(1, 2, device=DEV))
        with pytest.raises((RuntimeError, IndexError)):  # a source of the wrong shape is not broadcast
            torch.zeros(4, 2, device=DEV).index_copy_(0, torch.tensor([0, 1], device=DEV), torch.ones(1, 2, device=DEV))


def test_data_ops_are_not_fused(rt):
    """An elementwise chain around gathers / where: correct values, and the data ops stay their own sub-ops."""
    w = torch.randn(10, 16, device=DEV)
    idx = torch.tensor([3, 3, 9], device=DEV)
    mask = torch.rand(3, 16, device=DEV) > 0.5
    with torch.no_grad(), gpuos.scheduler_context():
        y = torch.where(mask, F.embedding(idx, w * 2).exp(), -1.0).relu() + 1
    ref = torch.where(mask, F.embedding(idx, w * 2).exp(), -1.0).relu() + 1
    torch.testing.assert_close(y, ref)


# ----------------------------------------------------------------------------- a Hugging Face decode step
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_hf_llama_decode_step_keeps_data_ops_in_the_worker(rt, cache):
    """One greedy decode step of a tiny HF Llama (fp32, sdpa) under scheduler_context: the same next token and
    logits as eager, and none of the data-movement ops of the step (embedding, the cache write, the mask's arange /
    le / where / scalar_tensor, position arithmetic and casts, argmax) falls back. Matmuls and sdpa stay eager here
    (worker matmul off; the attention task is separate work)."""
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    model = T.LlamaForCausalLM(cfg).to(DEV).eval()
    ids = torch.randint(0, 128, (1, 5), device=DEV)

    def prefill():
        kw = {"past_key_values": T.StaticCache(config=cfg, max_cache_len=32)} if cache == "static" else {}
        out = model(ids, use_cache=True, **kw)
        return out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

    def step(past, tok):
        out = model(tok, past_key_values=past, use_cache=True, cache_position=torch.tensor([5], device=DEV))
        return out.logits[:, -1].float(), out.logits[:, -1].argmax(-1, keepdim=True)

    with torch.no_grad():
        ref_logits, ref_tok = step(*prefill())
        past, tok = prefill()
        before = _fallbacks()
        with gpuos.scheduler_context():
            logits, nxt = step(past, tok)
    data_ops = ("embedding", "index_copy", "index_put", "argmax", "arange", "aten.le.", "where", "scalar_tensor",
                "clone", "zeros", "_to_copy", "aten.add.", "aten.add_.")
    _no_fallback(before, *data_ops)
    assert torch.equal(nxt, ref_tok)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)

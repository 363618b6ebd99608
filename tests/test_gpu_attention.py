"""The worker's decode attention (issue #16, device_src/attention.h) against torch, on the GPU.

dtype (fp16, bf16) x query length (1, 4, 16) x heads (MHA, GQA 4:1, MQA) x KV length (1, 7, 128, 1000, 4096; 32,768
for a Llama-like case) x mask (none, causal, additive float, bool) through gpuos.submit_attention; layouts (HF's
transposed views, a static cache's slice, broadcast masks); head dims 8..256; split-KV partials combined and the
scratch left clean; the scheduler's SDPA backend handlers (flash / efficient / cuDNN) with and without the
torch-function front, fallbacks with their reasons; HF-style eager attention (matmul, scale, mask add, softmax,
matmul) through the worker matmul; HF Llama decode tokens equal to eager.
Reference: torch's math SDPA in fp32 on the same (rounded) inputs; tolerance: a few roundings of the output dtype.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import gpuos
import gpuos_ext
from _helpers import tiny_hf_llama

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}
HEADS = {"mha": (4, 4), "gqa": (8, 2), "mqa": (4, 1)}


def _reference(q, k, v, mask=None, is_causal=False, scale=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    G = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
    m = mask if mask is None or mask.dtype == torch.bool else mask.float()
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), kf, vf, attn_mask=m, is_causal=is_causal, scale=scale)


def _check(out, q, k, v, mask=None, is_causal=False, scale=None):
    ref = _reference(q, k, v, mask, is_causal, scale)
    ref = torch.nan_to_num(ref, nan=0.0)  # a fully masked row: 0 (torch's safe softmax; older math gives NaN)
    tol = TOL[out.dtype] * max(1.0, ref.abs().max().item())
    err = (out.float() - ref).abs().max().item()
    assert err <= tol, f"max error {err:.3g} > {tol:.3g} (q {tuple(q.shape)}, k {tuple(k.shape)}, {out.dtype})"


def _mask(kind, B, H, Lq, Lk, dt, g):
    if kind == "float":
        m = torch.randn(B, 1, Lq, Lk, generator=g, device=DEV) * 2
        m[..., : max(1, Lk // 3)] = float("-inf") if Lk > 1 else 0.0  # masked-out positions, as HF's min value
        m[..., -1] = 0.0  # every row sees something
        return m.to(dt)
    if kind == "bool":
        m = torch.rand(B, H, Lq, Lk, generator=g, device=DEV) > 0.3
        m[..., 0] = True
        return m
    return None


def _qkv(B, Hq, Hkv, Lq, Lk, D, dt, g):
    q = torch.randn(B, Hq, Lq, D, generator=g, device=DEV).to(dt)
    k = torch.randn(B, Hkv, Lk, D, generator=g, device=DEV).to(dt)
    v = torch.randn(B, Hkv, Lk, D, generator=g, device=DEV).to(dt)
    return q, k, v


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("q_len", [1, 4, 16])
@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("kv_len", [1, 7, 128, 1000, 4096])
@pytest.mark.parametrize("mask", ["none", "causal", "float", "bool"])
def test_attention_matches_torch(rt, dtype, q_len, heads, kv_len, mask):
    dt = DTYPES[dtype]
    Hq, Hkv = HEADS[heads]
    B, D = 2, 64
    g = torch.Generator(device=DEV).manual_seed(q_len * 100003 + kv_len * 7 + Hkv)
    q, k, v = _qkv(B, Hq, Hkv, q_len, kv_len, D, dt, g)
    m = _mask(mask, B, Hq, q_len, kv_len, dt, g)
    out = torch.full_like(q, float("nan"))
    gpuos.submit_attention(q, k, v, out, attn_mask=m, is_causal=mask == "causal")
    gpuos.flush()
    _check(out, q, k, v, m, mask == "causal")


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("D", [8, 16, 32, 128, 256])
def test_attention_head_dims(rt, dtype, D):
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(D)
    q, k, v = _qkv(1, 8, 2, 3, 777, D, dt, g)
    out = torch.empty_like(q)
    gpuos.submit_attention(q, k, v, out, scale=0.3)
    gpuos.flush()
    _check(out, q, k, v, scale=0.3)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_attention_llama_like_32k(rt, dtype):
    """32 heads / 8 KV heads / head_dim 128 at KV 32,768: the longest split (64 slices of 512)."""
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(32)
    q, k, v = _qkv(1, 32, 8, 1, 32768, 128, dt, g)
    out = torch.empty_like(q)
    gpuos.submit_attention(q, k, v, out)
    gpuos.flush()
    _check(out, q, k, v)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("layout", ["hf_transposed", "static_cache_slice", "strided_q_out"])
@pytest.mark.parametrize("mask", ["none", "float"])
def test_attention_layouts(rt, dtype, layout, mask):
    dt = DTYPES[dtype]
    B, Hq, Hkv, Lq, Lk, D = 2, 8, 2, 4, 300, 64
    g = torch.Generator(device=DEV).manual_seed(hash(layout) % 1000)
    if layout == "hf_transposed":  # (B, L, H, D) projections viewed (B, H, L, D)
        q = torch.randn(B, Lq, Hq, D, generator=g, device=DEV).to(dt).transpose(1, 2)
        k = torch.randn(B, Lk, Hkv, D, generator=g, device=DEV).to(dt).transpose(1, 2)
        v = torch.randn(B, Lk, Hkv, D, generator=g, device=DEV).to(dt).transpose(1, 2)
    elif layout == "static_cache_slice":  # (B, Hkv, Lmax, D) caches, the first Lk positions
        q = torch.randn(B, Hq, Lq, D, generator=g, device=DEV).to(dt)
        k = torch.randn(B, Hkv, 1024, D, generator=g, device=DEV).to(dt)[:, :, :Lk]
        v = torch.randn(B, Hkv, 1024, D, generator=g, device=DEV).to(dt)[:, :, :Lk]
    else:  # q with a stepped head dim, out a transposed view
        q = torch.randn(B, Hq, Lq, 2 * D, generator=g, device=DEV).to(dt)[..., ::2]
        k, v = (torch.randn(B, Hkv, Lk, D, generator=g, device=DEV).to(dt) for _ in range(2))
    m = _mask(mask, B, Hq, Lq, Lk, dt, g)
    if layout == "strided_q_out":
        out = torch.empty(B, Lq, Hq, D, device=DEV, dtype=dt).transpose(1, 2)
    else:
        out = torch.empty(B, Hq, Lq, D, device=DEV, dtype=dt)
    gpuos.submit_attention(q, k, v, out, attn_mask=m)
    gpuos.flush()
    _check(out, q, k, v, m)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("pos, window", [(100, None), (0, None), (4091, None), (700, 50), (3000, 1)])
def test_attention_mask_bounds_the_kv_range(rt, dtype, kind, pos, window):
    """A static cache of 4,096 slots at position `pos` (query row i sees [pos - window + 1 or 0, pos + i]; GQA,
    4 query rows): K and V are NaN outside every row's visible range, so a result without NaN shows that the
    masked-out slots were not read (they used to be, weighted 0: 0 * NaN = NaN). Row 0 of the second batch sees
    nothing (its output is 0)."""
    dt = DTYPES[dtype]
    B, Hq, Hkv, Lq, Lk, D = 2, 8, 2, 4, 4096, 64
    g = torch.Generator(device=DEV).manual_seed(pos * 31 + (window or 0))
    q, k, v = _qkv(B, Hq, Hkv, Lq, Lk, D, dt, g)
    j = torch.arange(Lk, device=DEV)
    i = torch.arange(Lq, device=DEV)[:, None]
    see = (j <= pos + i) & (j >= (pos - window + 1 if window else 0))  # (Lq, Lk)
    see = see.expand(B, 1, Lq, Lk).clone()
    see[1, :, 0] = False
    m = see if kind == "bool" else torch.zeros(see.shape, device=DEV, dtype=dt).masked_fill(~see, float("-inf"))
    ref = _reference(q, k, v, m)
    anyrow = see.any(dim=2)[:, 0]  # (B, Lk): some row of the batch sees the slot
    kp, vp = k.clone(), v.clone()
    kp.masked_fill_(~anyrow[:, None, :, None], float("nan"))
    vp.masked_fill_(~anyrow[:, None, :, None], float("nan"))
    out = torch.full_like(q, float("nan"))
    gpuos.submit_attention(q, kp, vp, out, attn_mask=m)
    gpuos.flush()
    ref = torch.nan_to_num(ref, nan=0.0)
    assert not out.isnan().any(), "a masked-out kv slot was read"
    assert (out[1, :, 0] == 0).all(), "a row that sees nothing is 0"
    tol = TOL[dt] * max(1.0, ref.abs().max().item())
    assert (out.float() - ref).abs().max().item() <= tol


def test_attention_mask_broadcasts(rt):
    """A 2-D (Lq, Lk) mask and a per-head (1, Hq, 1, Lk) mask (stride-0 dims)."""
    g = torch.Generator(device=DEV).manual_seed(3)
    q, k, v = _qkv(2, 8, 2, 4, 200, 64, torch.float16, g)
    for m in (torch.randn(4, 200, generator=g, device=DEV).half(),
              torch.randn(1, 8, 1, 200, generator=g, device=DEV).half(),
              torch.randn(200, generator=g, device=DEV).float()):
        out = torch.empty_like(q)
        gpuos.submit_attention(q, k, v, out, attn_mask=m)
        gpuos.flush()
        _check(out, q, k, v, m)


def test_split_partials_share_a_level_and_leave_the_scratch_clean(rt):
    """Independent split attentions in one flush (one level: their tiles' items interleave nowhere, each tile's
    items stay consecutive), then again: a counter left non-zero would combine too early the second time."""
    g = torch.Generator(device=DEV).manual_seed(11)
    cases = [_qkv(1, 32, 8, 1, 4096, 128, torch.float16, g) for _ in range(3)]
    for _ in range(2):
        outs = [torch.full_like(q, float("nan")) for q, _, _ in cases]
        for (q, k, v), o in zip(cases, outs):
            gpuos.submit_attention(q, k, v, o)
        gpuos.flush()
        for (q, k, v), o in zip(cases, outs):
            _check(o, q, k, v)


def test_attention_reads_results_of_earlier_work_in_the_flush(rt):
    """k scaled by an elementwise op of the same flush: the attention waits for it (dependency level)."""
    g = torch.Generator(device=DEV).manual_seed(12)
    q, k, v = _qkv(1, 8, 2, 1, 1000, 64, torch.float16, g)
    k2 = torch.empty_like(k)
    gpuos.submit("mul", [k, 0.5], k2)
    out = torch.empty_like(q)
    gpuos.submit_attention(q, k2, v, out)
    gpuos.flush()
    _check(out, q, k * 0.5, v)


@pytest.mark.parametrize("case, exc, match", [
    ("q_len17", ValueError, "query length 17"),
    ("fp32", TypeError, "float16 or bfloat16"),
    ("head_dim96", ValueError, "head_dim 96"),
    ("heads", ValueError, "multiple of k's heads"),
    ("k_strided_d", ValueError, "contiguous"),
    ("mask_shape", ValueError, "broadcast"),
    ("out_shape", ValueError, "out must be"),
    ("mask_and_causal", ValueError, "is_causal"),
])
def test_attention_argument_errors_name_the_problem(rt, case, exc, match):
    g = torch.Generator(device=DEV).manual_seed(1)
    q, k, v = _qkv(1, 4, 2, 1, 64, 64, torch.float16, g)
    m, causal, out = None, False, torch.empty_like(q)
    if case == "q_len17":
        q = torch.randn(1, 4, 17, 64, device=DEV).half()
        out = torch.empty_like(q)
    elif case == "fp32":
        q, k, v, out = q.float(), k.float(), v.float(), out.float()
    elif case == "head_dim96":
        q, k, v = (torch.randn(1, h, n, 96, device=DEV).half() for h, n in ((4, 1), (2, 64), (2, 64)))
        out = torch.empty_like(q)
    elif case == "heads":
        q = torch.randn(1, 3, 1, 64, device=DEV).half()
        out = torch.empty_like(q)
    elif case == "k_strided_d":
        k = torch.randn(1, 2, 64, 128, device=DEV).half()[..., ::2]
    elif case == "mask_shape":
        m = torch.zeros(1, 1, 1, 63, device=DEV).half()
    elif case == "out_shape":
        out = torch.empty(1, 4, 2, 64, device=DEV).half()
    elif case == "mask_and_causal":
        m, causal = torch.zeros(1, 1, 1, 64, device=DEV).half(), True
    with pytest.raises(exc, match=match):
        gpuos.submit_attention(q, k, v, out, attn_mask=m, is_causal=causal)
    gpuos.flush()


# ------------------------------------------------------------------------------------------- the scheduler
@pytest.fixture
def worker_attention():
    was = gpuos.worker_attention_enabled()
    gpuos.set_worker_attention(True)
    yield
    gpuos.set_worker_attention(was)


def _fallbacks():
    s = gpuos.stats()
    return dict(s["fallback_ops"]), dict(s["fallbacks"])


def _new(before, now):
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("front", [True, False], ids=["front", "dispatch"])
@pytest.mark.parametrize("kind", ["plain", "causal", "float_mask", "gqa"])
@pytest.mark.parametrize("cudnn", [False, True], ids=["no_cudnn", "cudnn"])
def test_sdpa_under_the_scheduler_runs_in_the_worker(rt, worker_attention, dtype, front, kind, cudnn):
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(7)
    Hkv = 2 if kind == "gqa" else 8
    q, k, v = _qkv(1, 8, Hkv, 4 if kind == "causal" else 1, 513, 128, dt, g)
    m = _mask("float", 1, 8, q.shape[2], 513, dt, g) if kind == "float_mask" else None
    kw = {"attn_mask": m, "is_causal": kind == "causal"}
    if kind == "gqa":
        kw["enable_gqa"] = True
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    try:
        ops0, fb0 = _fallbacks()
        with torch.no_grad(), gpuos.scheduler_context(front=front):
            y = F.scaled_dot_product_attention(q, k, v, **kw)
        ops1, fb1 = _fallbacks()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    new_ops = _new(ops0, ops1)
    assert not any("scaled_dot_product" in o for o in new_ops), (new_ops, _new(fb0, fb1))
    _check(y, q, k, v, m, kind == "causal")


@pytest.mark.parametrize("kv", [128, 200, 1000])
def test_captured_attention_splits_the_kv_range_finer_and_replays_right(rt, worker_attention, kv):
    """A program's decode attention cuts the kv range into splits of at most 16 positions (record_attention's
    kCaptureAttnMinRows; a live flush: GPUOS_ATTN_MIN_ROWS, 64) -- at most one per warp where those cover it in
    splits of <= 32 positions (kCaptureLocalRows: a claim then holds whole tiles, combined in shared memory) --
    and the replay with new q / k / v values equals torch."""
    g = torch.Generator(device=DEV).manual_seed(11)
    q, k, v = _qkv(1, 8, 2, 1, kv, 128, torch.float16, g)
    prog = gpuos.capture(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    tiles = 2 * 2  # KV heads x row groups of 2 of the 4 query heads per KV head
    info = prog.info()
    most = 8 if kv <= 8 * 32 else 64  # one split per warp of the default 256-thread block
    assert info["tiles"] == tiles * gpuos_ext._testing.attention_split(tiles, kv, 4096, min_rows=16,
                                                                      max_split=most), info
    assert info["tiles"] > tiles * gpuos_ext._testing.attention_split(tiles, kv, 4096), info  # live: 64 rows
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=g, device=DEV).to(t.dtype))
        _check(prog(), q, k, v)


@pytest.mark.parametrize("kind", ["float_mask", "causal", "g8"])
def test_captured_attention_local_combine_with_masks_and_query_rows(rt, worker_attention, kind):
    """The shared-memory combine of a captured attention's tiles (kAttnTileMajor) with a float mask, a causal
    query of 4 rows, and 8 query heads per KV head (4 row groups per KV head: tiles of one head in one claim);
    replays with new values equal torch."""
    g = torch.Generator(device=DEV).manual_seed(12)
    hq, hkv, lq = (16, 2, 1) if kind == "g8" else (8, 2, 4 if kind == "causal" else 1)
    q, k, v = _qkv(1, hq, hkv, lq, 160, 64, torch.float16, g)
    m = _mask("float", 1, hq, lq, 160, torch.float16, g) if kind == "float_mask" else None
    kw = {"attn_mask": m, "is_causal": kind == "causal", "enable_gqa": True}
    prog = gpuos.capture(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=g, device=DEV).to(t.dtype))
        _check(prog(), q, k, v, m, kind == "causal")


def test_sdpa_fallbacks_have_reasons(rt, worker_attention):
    """Shapes the task refuses run with torch, counted under their reason; the results are torch's."""
    g = torch.Generator(device=DEV).manual_seed(8)
    cases = [("attention_shape", _qkv(1, 4, 4, 17, 64, 64, torch.float16, g)),   # q_len 17: prefill
             ("attention_shape", _qkv(1, 4, 4, 1, 64, 96, torch.float16, g)),    # head_dim 96
             ("dtype", _qkv(1, 4, 4, 1, 64, 64, torch.float32, g))]
    for reason, (q, k, v) in cases:
        ops0, fb0 = _fallbacks()
        with torch.no_grad(), gpuos.scheduler_context():
            y = F.scaled_dot_product_attention(q, k, v)
        ops1, fb1 = _fallbacks()
        new_ops, new = _new(ops0, ops1), _new(fb0, fb1)
        # (a backend torch decomposes -- math -- never reaches the handlers: nothing to count then)
        if any("scaled_dot_product" in o for o in new_ops):
            assert new.get(reason, 0) >= 1, (reason, new, new_ops)
        torch.testing.assert_close(y.float(), F.scaled_dot_product_attention(q, k, v).float(), atol=2e-3, rtol=2e-3)


def test_sdpa_switched_off_stays_with_torch(rt):
    was = gpuos.worker_attention_enabled()
    gpuos.set_worker_attention(False)
    try:
        q, k, v = _qkv(1, 4, 4, 1, 64, 64, torch.float16, torch.Generator(device=DEV).manual_seed(9))
        _, fb0 = _fallbacks()
        with torch.no_grad(), gpuos.scheduler_context():
            y = F.scaled_dot_product_attention(q, k, v)
        assert _new(fb0, _fallbacks()[1]).get("attention_off", 0) >= 1
        _check(y, q, k, v)
    finally:
        gpuos.set_worker_attention(was)


def test_sdpa_with_grad_stays_with_torch(rt, worker_attention):
    q, k, v = _qkv(1, 4, 4, 1, 64, 64, torch.float16, torch.Generator(device=DEV).manual_seed(10))
    q.requires_grad_(True)
    with gpuos.scheduler_context():
        y = F.scaled_dot_product_attention(q, k, v)
    y.float().sum().backward()  # autograd got torch's own kernel (and its saved log-sum-exp)
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_flash_logsumexp_is_computed(rt, worker_attention):
    """aten::_scaled_dot_product_flash_attention called directly: output and log-sum-exp both match torch's."""
    q, k, v = _qkv(1, 8, 8, 2, 700, 64, torch.float16, torch.Generator(device=DEV).manual_seed(13))
    ref = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
    with torch.no_grad(), gpuos.scheduler_context():
        got = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
    torch.testing.assert_close(got[0].float(), ref[0].float(), atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(got[1], ref[1], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_hf_eager_attention_pattern_in_the_worker(rt, worker_attention, dtype):
    """HF's eager_attention_forward at decode (matmul, scale, mask add, softmax in fp32, cast, matmul) with the
    worker matmul on: no fallback for the matmuls, the mask add, the scale or the softmax; same as eager."""
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(14)
    B, H, Lq, Lk, D = 1, 8, 1, 300, 64
    q, k, v = _qkv(B, H, H, Lq, Lk, D, dt, g)
    mask = torch.zeros(B, 1, Lq, Lk, device=DEV, dtype=dt)
    mask[..., 250:] = torch.finfo(dt).min

    def attn(q, k, v):
        w = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
        w = w + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)

    ref = attn(q, k, v)
    was = gpuos.worker_matmul_enabled()
    gpuos.set_worker_matmul(True)
    try:
        ops0, _ = _fallbacks()
        with torch.no_grad(), gpuos.scheduler_context():
            y = attn(q, k, v)
        new = _new(ops0, _fallbacks()[0])
    finally:
        gpuos.set_worker_matmul(was)
    assert not any(n in o for o in new for n in ("mm", "mul", "add", "softmax", "_to_copy")), new
    torch.testing.assert_close(y.float(), ref.float(), atol=TOL[dt] * 4, rtol=TOL[dt] * 4)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_hf_llama_decode_tokens_equal_eager(rt, worker_attention, cache):
    """A small random Llama (4 heads / 2 KV heads / head_dim 64, fp16, sdpa): 8 greedy decode steps under the
    scheduler (worker matmul and attention on) give eager's tokens."""
    cfg, generate = tiny_hf_llama(DEV)

    def run():
        return generate(cache)

    with torch.no_grad():
        ref = run()
        was = gpuos.worker_matmul_enabled()
        gpuos.set_worker_matmul(True)
        try:
            ops0, _ = _fallbacks()
            with gpuos.scheduler_context():
                got = run()
            new = _new(ops0, _fallbacks()[0])
        finally:
            gpuos.set_worker_matmul(was)
    assert torch.equal(got, ref), (got, ref)
    # The decode steps' SDPA ran in the worker: fallbacks of the backend ops come from the prefill (12 rows) only.
    sdpa = sum(n for o, n in new.items() if "scaled_dot_product" in o)
    assert sdpa <= cfg.num_hidden_layers, new

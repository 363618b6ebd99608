"""Decode-step ops beyond the elementwise table (issue #16) under scheduler_context, on the GPU: casts
(aten::_to_copy: .float() / .half() / .to(dtype)) and copy_ (cache writes, casting copies), recorded as the
table's `copy` op and fused with their neighbours; the hand-written RMSNorm of HF Llama.
"""

import pytest
import torch

import gpuos

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _fallback_ops():
    return dict(gpuos.stats()["fallback_ops"])


def _new_fallbacks(before):
    return {k: v - before.get(k, 0) for k, v in gpuos.stats()["fallback_ops"].items() if v - before.get(k, 0)}


@pytest.mark.parametrize("src,dst", [(torch.float16, torch.float32), (torch.float32, torch.bfloat16),
                                     (torch.bfloat16, torch.float16), (torch.float32, torch.float32)])
def test_casts_are_recorded_and_exact(rt, src, dst):
    x = (torch.randn(3, 257, device=DEV) * 100).to(src)
    before = _fallback_ops()
    with torch.no_grad(), gpuos.scheduler_context():
        y = x.to(dst)
        z = (x.float() * 2).to(dst)
    assert not any("copy" in k for k in _new_fallbacks(before)), _new_fallbacks(before)
    assert y.dtype == dst and torch.equal(y, x.to(dst))
    assert torch.equal(z, (x.float() * 2).to(dst))


def test_copy_into_a_cache_slice_and_casting_copy(rt):
    cache = torch.zeros(2, 8, 16, 64, device=DEV, dtype=torch.float16)
    k = torch.randn(2, 8, 1, 64, device=DEV, dtype=torch.float32)
    before = _fallback_ops()
    with torch.no_grad(), gpuos.scheduler_context():
        cache[:, :, 5:6].copy_(k)            # a cast into a strided slice
        v = torch.empty(2, 8, 1, 64, device=DEV, dtype=torch.float16)
        v.copy_(cache[:, :, 5:6] * 3)
    assert not any("copy" in k_ for k_ in _new_fallbacks(before)), _new_fallbacks(before)
    ref = torch.zeros_like(cache)
    ref[:, :, 5:6] = k.half()
    assert torch.equal(cache, ref)
    assert torch.equal(v, ref[:, :, 5:6] * 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hf_llama_rmsnorm_pattern(rt, dtype):
    """LlamaRMSNorm.forward: to(float32), pow(2).mean(-1, keepdim), * rsqrt(var + eps), weight * to(dtype)."""
    x = torch.randn(1, 1, 4096, device=DEV, dtype=dtype)
    w = torch.randn(4096, device=DEV, dtype=dtype)

    def rmsnorm(h):
        h32 = h.to(torch.float32)
        var = h32.pow(2).mean(-1, keepdim=True)
        return w * (h32 * torch.rsqrt(var + 1e-6)).to(dtype)

    ref = rmsnorm(x)
    before = _fallback_ops()
    with torch.no_grad(), gpuos.scheduler_context():
        y = rmsnorm(x)
    assert _new_fallbacks(before) == {}, _new_fallbacks(before)
    torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2)


def test_cat_and_stack_rotary_and_cache_patterns(rt):
    """rotate_half (cat of -x2, x1 on the last dim), a dynamic cache's cat on the sequence dim, stack, mixed
    dtypes (promotion): recorded (no cat / stack fallback), equal to eager."""
    g = torch.Generator(device=DEV).manual_seed(2)
    q = torch.randn(1, 8, 1, 64, generator=g, device=DEV, dtype=torch.float16)
    past = torch.randn(1, 8, 9, 64, generator=g, device=DEV, dtype=torch.float16)
    h = torch.randn(5, 7, generator=g, device=DEV)

    def f():
        x1, x2 = q[..., :32], q[..., 32:]
        rot = torch.cat((-x2, x1), dim=-1)
        kv = torch.cat([past, q * 2], dim=-2)
        st = torch.stack([h, h * 3], dim=1)
        mixed = torch.cat([h.half(), h], 0)
        return rot, kv, st, mixed

    ref = f()
    before = _fallback_ops()
    with torch.no_grad(), gpuos.scheduler_context():
        got = f()
    new = _new_fallbacks(before)
    assert not any("cat" in k or "stack" in k for k in new), new
    for g_, r in zip(got, ref):
        assert g_.dtype == r.dtype and g_.shape == r.shape
        assert torch.equal(g_, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_in_the_worker_matches_native_layer_norm(rt, dtype, affine):
    """GPT-2's LayerNorm (768) at decode: aten::native_layer_norm as worker ops (fp32 math); out, mean and rstd
    match the aten op's."""
    g = torch.Generator(device=DEV).manual_seed(4)
    x = (torch.randn(1, 3, 768, generator=g, device=DEV) * 3 + 1).to(dtype)
    w = torch.randn(768, generator=g, device=DEV).to(dtype) if affine else None
    b = torch.randn(768, generator=g, device=DEV).to(dtype) if affine else None
    ref = torch.native_layer_norm(x, [768], w, b, 1e-5)
    before = _fallback_ops()
    with torch.no_grad(), gpuos.scheduler_context():
        got = torch.native_layer_norm(x, [768], w, b, 1e-5)
        y = torch.nn.functional.layer_norm(x, (768,), w, b)
    assert not any("layer_norm" in k for k in _new_fallbacks(before)), _new_fallbacks(before)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(got[0], ref[0], rtol=tol, atol=tol)
    torch.testing.assert_close(y, ref[0], rtol=tol, atol=tol)
    for g_, r in zip(got[1:], ref[1:]):
        assert g_.dtype == r.dtype and g_.shape == r.shape
        torch.testing.assert_close(g_, r, rtol=1e-5, atol=1e-5)

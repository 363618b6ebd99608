"""Dependency levels from the one hazard model (csrc/core/hazards.h): explicit-API work recorded in any order is
published level by level, so interleaved independent chains share levels; results match eager."""
import pytest
import torch

pytestmark = pytest.mark.gpu


def _batches(ext):
    return ext.stats()["batches"]


@pytest.mark.parametrize("chains,depth", [(4, 5), (16, 3), (1, 6)])
def test_explicit_interleaved_chains_publish_one_batch_per_level(rt, chains, depth):
    """Chain c: x[c] <- x[c] * 1.5 + c, depth times, submitted round-robin across chains (c0 step0, c1 step0, ...).
    Recorded in submission order the old runtime opened a level per conflicting pair; now each step is one level."""
    ext = rt
    xs = [torch.randn(1000 + 37 * c, device="cuda") for c in range(chains)]
    ref = [x.clone() for x in xs]
    bias = [torch.full_like(x, float(c)) for c, x in enumerate(xs)]
    scale = [torch.full_like(x, 1.5) for x in xs]
    tmp = [torch.empty_like(x) for x in xs]
    ext.flush(sync=True)
    before = _batches(ext)
    for _ in range(depth):
        for c in range(chains):
            ext.submit_mul(xs[c], scale[c], tmp[c])
            ext.submit_add(tmp[c], bias[c], xs[c])
    ext.flush(sync=True)
    # each step is two dependent sub-ops (mul then add in place): 2 levels per step, whatever the chain count
    assert _batches(ext) - before == 2 * depth
    for c in range(chains):
        for _ in range(depth):
            ref[c] = ref[c] * 1.5 + c
        torch.testing.assert_close(xs[c], ref[c])


def test_explicit_slices_of_one_buffer_share_a_level(rt):
    """Writes to disjoint rows of one buffer are independent; a later read of a written row follows it."""
    ext = rt
    buf = torch.randn(8, 512, device="cuda")
    ones = torch.ones(512, device="cuda")
    ref = buf.clone()
    ext.flush(sync=True)
    before = _batches(ext)
    for r in range(8):
        ext.submit_add(buf[r], ones, buf[r])  # level 1: disjoint rows
    out = torch.empty(512, device="cuda")
    ext.submit_mul(buf[3], buf[5], out)  # reads rows written at level 1: level 2
    ext.flush(sync=True)
    assert _batches(ext) - before == 2
    ref += 1
    torch.testing.assert_close(buf, ref)
    torch.testing.assert_close(out, ref[3] * ref[5])


def test_explicit_write_after_read_waits(rt):
    """A write into a tensor an earlier op reads starts a later level (no lost read)."""
    ext = rt
    a = torch.randn(4096, device="cuda")
    b = torch.randn(4096, device="cuda")
    c = torch.empty(4096, device="cuda")
    a0 = a.clone()
    ext.flush(sync=True)
    before = _batches(ext)
    ext.submit_add(a, b, c)  # reads a
    ext.submit_mul(b, b, a)  # overwrites a: after the read
    ext.flush(sync=True)
    assert _batches(ext) - before == 2
    torch.testing.assert_close(c, a0 + b)
    torch.testing.assert_close(a, b * b)


def test_rsub_and_pow_scalar_under_scheduler(rt):
    """aten::rsub.Scalar (inputs exchanged) and aten::pow.Scalar (a number first) are recorded, not eager."""
    import gpuos

    x = torch.rand(1000, device="cuda") + 0.5
    with torch.no_grad(), gpuos.scheduler_context(front=False) as s:
        before = gpuos.scheduler_stats()["ops_intercepted"]
        y = torch.ops.aten.rsub.Scalar(x, 2.0, 3.0)
        z = torch.ops.aten.pow.Scalar(2.0, x)
        n = gpuos.scheduler_stats()["ops_intercepted"] - before
        s.flush()
    assert n == 2
    torch.testing.assert_close(y, 2.0 - 3.0 * x)
    torch.testing.assert_close(z, torch.pow(2.0, x))


_PIECES_SCRIPT = r"""
import torch, gpuos
gpuos.init()
K, N, depth = 256, 192, 300
x = torch.zeros(1, K, device="cuda", dtype=torch.float16)
one = torch.ones_like(x)
w = torch.randn(K, N, device="cuda", dtype=torch.float16)
out = torch.full((1, N), float("nan"), device="cuda", dtype=torch.float16)
gpuos.flush(sync=True)
b0, d0 = gpuos.stats()["batches"], gpuos.stats()["dma_batches"]
for _ in range(depth):  # one level each (in place), descriptors only: read from pinned memory
    gpuos.submit_add(x, one, x)
gpuos.submit_matmul(x, w, out)  # level depth + 1, its TensorRefs recorded before the first piece is published
gpuos.flush(sync=True)
s = gpuos.stats()
print("BATCHES", s["batches"] - b0, "DMA", s["dma_batches"] - d0)
ref = (torch.full((1, K), float(depth), device="cuda") @ w.float()).half()
torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-1)
print("OK")
"""


def test_flush_published_in_pieces_mirrors_its_refs_for_a_later_dma_level():
    """A flush of more levels than one publication holds goes out in pieces; every TensorRef of the flush is
    recorded before the first. When the first piece had no DMA-delivered level, a later one's matmul level (DMA:
    it reads its TensorRefs from the device mirror) read a stale mirror: garbage pointers (the lost CUDA context
    in W5's program setup) or old refs (wrong results). GPUOS_DMA_LEVELS=0 keeps the first piece on pinned reads."""
    from _helpers import describe, run_python
    r = run_python(_PIECES_SCRIPT, {"GPUOS_DMA_LEVELS": "0", "GPUOS_TIMEOUT_S": "20"}, timeout=170)
    assert r.returncode == 0 and "OK" in r.stdout, describe(r)
    batches, dma = (int(v) for v in r.stdout.split("BATCHES", 1)[1].split()[0:3:2])
    assert batches == 301, describe(r)  # one batch per level: the flush really went out in more than one piece
    assert 1 <= dma < batches, describe(r)  # the matmul level by DMA, the adds from pinned memory

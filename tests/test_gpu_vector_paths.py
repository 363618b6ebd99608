"""The 16-byte vector paths of one warp's element loops (21st session) against eager, at their edges: fused chains
and row programs (device_src/elementwise.h fused_rows_vec: operands contiguous in aligned runs of 8, or constant
over each aligned 8 -- a broadcast, a per-row value -- else the element path) and gathers / scatters
(device_src/dataops.h data_vec_elems: both sides' last dims contiguous and aligned, else the element path).
Each case runs once on a layout that takes the vector path and once on one that must fall back (the cache write
with a negative index: tests/test_gpu_index_ops.py, at widths of 4 and 16)."""

import zlib

import pytest
import torch
import torch.nn.functional as F

import gpuos
import gpuos_ext

pytestmark = pytest.mark.gpu

DEV = "cuda"


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _run(fn):
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        out = fn()
    torch.cuda.synchronize()
    return out


def rms_norm(x, w, eps=1e-6):
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dt)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_chain_with_row_broadcast_and_scalar_operands(rt, dt, offset):
    """x * s + y * 0.5 with s one value per row (constant over each aligned 8: one scalar load) and y broadcast
    along rows; `offset` shifts x by one element (not 16-byte aligned: the element path)."""
    base = torch.randn(4 * 64 + 8, device=DEV).to(dt)
    x = base[offset:offset + 4 * 64].view(4, 64)
    s = torch.randn(4, 1, device=DEV).to(dt)
    y = torch.randn(64, device=DEV).to(dt)
    got = _run(lambda: (x * s + y * 0.5).relu())
    ref = (x * s + y * 0.5).relu()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dt]
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("cols", [256, 264, 512, 300], ids=["one-chunk", "two-chunks-short", "two-chunks", "odd"])
@pytest.mark.parametrize("dt", [torch.float16, torch.float32])
def test_rmsnorm_rows_across_chunk_shapes(rt, cols, dt):
    """One chunk (inputs kept in registers over the passes), rows past 256 columns (reloaded per pass), and a row
    length that is not a multiple of 8 (the element path); three rows per tile."""
    x = torch.randn(3, cols, device=DEV).to(dt)
    w = (torch.rand(cols, device=DEV) + 0.5).to(dt)
    got = _run(lambda: rms_norm(x, w))
    tol = 2e-3 if dt == torch.float16 else 1e-5
    torch.testing.assert_close(got, rms_norm(x, w), rtol=tol, atol=tol)


def test_rmsnorm_fp32_input_fp16_output(rt):
    """An fp32 operand (two 16-byte vectors per 8 elements) beside a 16-bit output (one)."""
    x = torch.randn(2, 256, device=DEV)
    w = (torch.rand(256, device=DEV) + 0.5).half()
    got = _run(lambda: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).half())
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).half()
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dt", [torch.float16, torch.float32, torch.int64])
@pytest.mark.parametrize("view", ["contiguous", "misaligned"])
def test_gather_rows(rt, dt, view):
    """index_select of whole rows: 16-byte vectors (8 fp16, 4 fp32, 2 int64 per vector), or a weight view starting
    one element in (the element path)."""
    full = (torch.randn(40, 40, device=DEV) * 100).to(dt)  # rows 40 apart: a multiple of every vector's elements
    w = full[:, :32] if view == "contiguous" else full[:, 1:33]
    idx = torch.tensor([3, 0, 39, 3, 17], device=DEV)
    got = _run(lambda: torch.index_select(w, 0, idx))
    assert torch.equal(got, torch.index_select(w, 0, idx))


def test_vector_gather_out_of_range_writes_nan_and_flags(rt):
    w = torch.randn(8, 16, device=DEV).half()
    idx = torch.tensor([2, 8, 5], device=DEV)
    torch.cuda.synchronize()
    gpuos_ext.clear_index_faults()
    y = _run(lambda: F.embedding(idx, w))
    assert gpuos.stats()["index_faults"] == 1
    assert torch.equal(y[0], w[2]) and torch.equal(y[2], w[5]) and y[1].isnan().all()
    gpuos_ext.clear_index_faults()

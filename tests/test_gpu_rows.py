"""Row programs (issue #16's row tasks) on the GPU: a last-dim reduction whose keepdim result a fused chain reads
becomes part of that chain's program (csrc/sched/lower.cpp try_fuse / merge pass, device_src/worker.cu
fused_prog_op). HF's hand-written RMSNorm and the LayerNorm handler's table ops each run as one sub-op in one
level, with the same results as eager; a reduction Python still holds, or an input written in between, keeps
the old lowering."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import gpuos

pytestmark = pytest.mark.gpu

DEV = "cuda"
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def rms_norm(x, w, eps=1e-6):
    """Hugging Face LlamaRMSNorm.forward."""
    dt = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dt)


def _delta(fn):
    before = gpuos.stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        out = fn()
    after = gpuos.stats()
    return out, {k: after[k] - before[k] for k in ("row_groups", "fused_groups", "batches", "ops_intercepted")}


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 256), (1, 1, 512), (4, 7, 300), (2, 5)])
def test_rmsnorm_is_one_row_task(rt, dt, shape):
    x = torch.randn(shape, device=DEV).to(dt)
    w = (torch.rand(shape[-1], device=DEV) + 0.5).to(dt)
    got, d = _delta(lambda: rms_norm(x, w))
    assert_close(got, rms_norm(x, w), rtol=TOL[dt][0], atol=TOL[dt][1])
    assert d["row_groups"] == 1 and d["fused_groups"] == 1 and d["batches"] == 1, d


@pytest.mark.parametrize("shape", [(1, 1, 768), (3, 4096)])
def test_long_rows_keep_the_op_by_op_lowering(rt, shape):
    """Rows over 512 elements (lower.cpp kRowProgramMaxCols: one warp per row is slower there) are lowered as
    before: same results, no row program."""
    x = torch.randn(shape, device=DEV).to(torch.float16)
    w = (torch.rand(shape[-1], device=DEV) + 0.5).to(torch.float16)
    got, d = _delta(lambda: rms_norm(x, w))
    assert_close(got, rms_norm(x, w), rtol=2e-3, atol=2e-3)
    assert d["row_groups"] == 0 and d["batches"] > 1, d
    got, d = _delta(lambda: F.layer_norm(x, (shape[-1],), w, w, 1e-5))
    assert_close(got, F.layer_norm(x, (shape[-1],), w, w, 1e-5), rtol=8e-3, atol=8e-3)
    assert d["row_groups"] == 0, d


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_is_one_row_task(rt, dt, affine):
    x = torch.randn(2, 3, 384, device=DEV).to(dt)
    w = torch.randn(384, device=DEV).to(dt) if affine else None
    b = torch.randn(384, device=DEV).to(dt) if affine else None
    got, d = _delta(lambda: F.layer_norm(x, (384,), w, b, 1e-5))
    assert_close(got, F.layer_norm(x, (384,), w, b, 1e-5), rtol=TOL[dt][0] * 4, atol=TOL[dt][1] * 4)
    assert d["row_groups"] == 1 and d["batches"] == 1, d


def test_softmax_written_out_is_one_row_task(rt):
    """Two reductions, the second folding values that depend on the first (amax, then the sum of exp(x - max));
    exp(x - max) is read by the sum and by the division: one shared node."""
    x = torch.randn(6, 333, device=DEV) * 4

    def sm():
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    got, d = _delta(sm)
    assert_close(got, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    assert d["row_groups"] == 1 and d["batches"] == 1, d


def test_reduction_python_still_holds_is_materialised(rt):
    x = torch.randn(4, 256, device=DEV)
    with gpuos.scheduler_context(auto_flush_ms=0):
        var = x.pow(2).mean(-1, keepdim=True)   # kept: must be written
        out = x * torch.rsqrt(var + 1e-6)
    assert_close(var, x.pow(2).mean(-1, keepdim=True), rtol=1e-5, atol=1e-6)
    assert_close(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), rtol=1e-5, atol=1e-5)


def test_strided_rows_and_broadcast_weight(rt):
    base = torch.randn(6, 600, device=DEV, dtype=torch.float16)
    x = base[:, ::2]  # rows of 300 with stride 2 (one progression: a fused operand's address rule)
    w = torch.randn(1, 300, device=DEV, dtype=torch.float16)
    got, d = _delta(lambda: rms_norm(x, w))
    assert_close(got, rms_norm(x, w), rtol=2e-3, atol=2e-3)
    assert d["row_groups"] == 1, d


def test_input_written_between_reduction_and_use(rt):
    """mean(x^2) is taken before x.mul_(2); the output reads the doubled x. The reduction's subtree cannot be
    evaluated at the output's position, so it is not folded into it."""
    x0 = torch.randn(3, 128, device=DEV)
    x = x0.clone()
    with gpuos.scheduler_context(auto_flush_ms=0):
        var = x.pow(2).mean(-1, keepdim=True)
        x.mul_(2)
        out = x * torch.rsqrt(var + 1e-6)
        del var
    exp = (x0 * 2) * torch.rsqrt(x0.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert_close(out, exp, rtol=1e-5, atol=1e-5)
    assert_close(x, x0 * 2)


def test_captured_rmsnorm_replays_as_one_level(rt):
    x = torch.randn(1, 1, 512, device=DEV, dtype=torch.float16)
    w = torch.randn(512, device=DEV, dtype=torch.float16)
    prog = gpuos.capture(rms_norm, x, w)
    assert prog.info()["levels"] == [1], prog.info()
    for _ in range(3):
        x2 = torch.randn_like(x)
        assert_close(prog(x2, w), rms_norm(x2, w), rtol=2e-3, atol=2e-3)

"""The scheduler's dispatcher front (csrc/sched/cfront.h) on CUDA tensors: functional elementwise ops recorded in
C++ at the dispatcher, no-data ops run below the dispatch mode, every other op handed on to the mode unchanged --
results equal eager, and what the front must not take (a negative-bit view, a tensor autograd must see, another mode
on top) goes on to the mode."""
import pytest
import torch
import gpuos
import gpuos_ext
from _helpers import seen_ops_mode

pytestmark = pytest.mark.gpu


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
    assert after["direct"] - before["direct"] >= 4, (before, after)  # mm, _to_copy, mean, amax, sum
    wg = w.float().requires_grad_()
    with gpuos.scheduler_context():
        y = torch.mm(x.float(), wg)
    assert y.grad_fn is not None
    torch.testing.assert_close(y.detach(), x.float() @ w.float(), rtol=1e-3, atol=1e-3)

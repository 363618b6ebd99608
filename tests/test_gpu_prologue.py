"""Matmul prologues (issue #16 / #17): a norm whose output only matmuls read runs inside each of them
(sched/prologue.cpp, kFlagMmPrologue, device_src/matmul.h mm_prologue) instead of as a level of its own.

Values are compared with eager and with the two-level lowering (gpuos_ext._testing.set_mm_prologue(False)); the
`prologues` stat says whether the norm was folded; captured programs replayed with new inputs check that the norm's
operands inside the matmul entry move with them.
"""

import pytest
import torch

import gpuos
import gpuos_ext
from _helpers import captured_levels, hot_then_tier2, within_one_rounding

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
TOL = {torch.float16: 2e-2, torch.bfloat16: 1e-1}
lin = torch.nn.functional.linear


def _rms(x, w, eps=1e-6):  # HF's LlamaRMSNorm, op by op
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _weights(dt, g, K=256, scale=1.0):
    return {"n": (1.0 + torch.randn(K, generator=g, device=DEV) / 8).to(dt),
            "b": (torch.randn(K, generator=g, device=DEV) / 8).to(dt),
            "q": (torch.randn(256, K, generator=g, device=DEV) * scale / 16).to(dt),
            "k": (torch.randn(128, K, generator=g, device=DEV) * scale / 16).to(dt),
            "v": (torch.randn(200, K, generator=g, device=DEV) * scale / 16).to(dt)}


def _attention_input(norm, W):
    """Llama's attention input (the norm, then q / k / v of it), or GPT-2-like LayerNorm before bias-free linears."""
    def fn(x):
        if norm == "rms":
            h = _rms(x, W["n"])
        else:
            h = torch.nn.functional.layer_norm(x, (x.shape[-1],), W["n"], W["b"], 1e-5)
        return lin(h, W["q"]), lin(h, W["k"]), lin(h, W["v"])
    return fn


def _on_off(fn, *args):
    """fn(*args) under the scheduler with prologues on and off: {on: (result, prologues added)}."""
    got = {}
    for on in (True, False):
        gpuos_ext._testing.set_mm_prologue(on)
        try:
            before = gpuos.stats()["prologues"]
            with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
                y = fn(*args)
            got[on] = (y, gpuos.stats()["prologues"] - before)
        finally:
            gpuos_ext._testing.set_mm_prologue(True)
    return got


def _close(got, ref, dt):
    for y, r in zip(got, ref):
        assert y.dtype == r.dtype and y.shape == r.shape, (y.dtype, y.shape, r.dtype, r.shape)
        torch.testing.assert_close(y.float(), r.float(), rtol=TOL[dt], atol=TOL[dt])


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_norm_runs_as_the_prologue_of_its_matmuls(rt, worker_matmul, dtype, norm, rows):
    """A norm read only by three bias-free linears of it (Llama's q / k / v) runs inside each: counted once in
    `prologues`; the products equal eager's, and the two-level lowering's within one rounding of the product (the
    same program computes the same activations: the items multiply the same values)."""
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(rows * 10 + len(norm))
    W = _weights(dt, g)
    x = torch.randn(1, rows, 256, generator=g, device=DEV).to(dt)
    fn = _attention_input(norm, W)
    ref = fn(x)
    got = _on_off(fn, x)
    assert got[True][1] == 1 and got[False][1] == 0, {k: v[1] for k, v in got.items()}
    for on in (True, False):
        _close(got[on][0], ref, dt)
    for a, b in zip(got[True][0], got[False][0]):
        within_one_rounding(a, b, EPS[dt])


@pytest.mark.parametrize("case", ["norm_returned", "norm_read_by_a_chain", "too_many_values", "fp32", "bias",
                                  "weight_rows_major"])
def test_norms_that_cannot_be_a_prologue_keep_their_level(rt, worker_matmul, case):
    """No prologue where the matmuls cannot evaluate the norm themselves: Python sees the norm, an elementwise op
    also reads it, it holds more values than a warp's buffer (8 x 256 > 1,024), fp32 activations (not the tensor-core
    path), a reader with a bias, a reader whose weight is K x N row-major (GPT-2's Conv1D: the ncol path; the group
    is then emitted once before it). Values as eager in every case."""
    g = torch.Generator(device=DEV).manual_seed(41)
    dt = torch.float32 if case == "fp32" else torch.float16
    W = _weights(dt, g)
    rows = 8 if case == "too_many_values" else 1
    x = torch.randn(1, rows, 256, generator=g, device=DEV).to(dt)
    bias = torch.randn(256, generator=g, device=DEV).to(dt)
    wt = W["q"].t().contiguous()

    def fn(x):
        h = _rms(x, W["n"])
        if case == "norm_returned":
            return h, lin(h, W["q"])
        if case == "norm_read_by_a_chain":
            return h * 2.0 + 1.0, lin(h, W["q"])
        if case == "bias":
            return lin(h, W["q"], bias), lin(h, W["k"])
        if case == "weight_rows_major":
            return torch.matmul(h, wt), lin(h, W["k"])
        return lin(h, W["q"]), lin(h, W["k"])

    ref = fn(x)
    got = _on_off(fn, x)
    assert got[True][1] == 0, got[True][1]
    tol = 1e-4 if dt == torch.float32 else TOL[dt]
    for y, r in zip(got[True][0], ref):
        torch.testing.assert_close(y, r, rtol=tol, atol=tol)


def test_captured_attention_input_has_one_level_less_and_follows_new_inputs(rt, worker_matmul):
    """Captured with x as the program's input, the norm's operands live in the matmul entries (the prologue's
    FusedArgs): replays with new x must read the new x (relocated like a fused chain's operands). One level less than
    without the prologue; every replay equals eager."""
    g = torch.Generator(device=DEV).manual_seed(43)
    W = _weights(torch.float16, g)
    fn = _attention_input("rms", W)
    levels = captured_levels(fn, lambda: torch.randn(1, 1, 256, generator=g, device=DEV).half(),
                             gpuos_ext._testing.set_mm_prologue, lambda y, r: _close(y, r, torch.float16), calls=3)
    assert levels[True] == levels[False] - 1, levels


def test_hot_prologue_gets_tier2_code(rt, worker_matmul):
    """The prologue's row program counts toward tier 2 like any fused chain's: once hot, the items run its
    straight-line code (mm_prologue through exec_fused_spec); values as eager, within one rounding of the
    interpreted prologue's."""
    g = torch.Generator(device=DEV).manual_seed(44)
    W = _weights(torch.float16, g)
    x = torch.randn(1, 1, 256, generator=g, device=DEV).half()

    def f(x):  # a program of its own: this test's eps (3e-5) is in no other test's norm
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 3e-5)
        h = W["n"] * h.to(x.dtype)
        return lin(h, W["q"]), lin(h, W["k"])

    ref = f(x)
    interp, got = hot_then_tier2(f, x, "prologues")
    for y in interp + [got]:
        _close(y, ref, torch.float16)
    for a, b in zip(got, interp[0]):
        within_one_rounding(a, b, EPS[torch.float16])

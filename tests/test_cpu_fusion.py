"""Fused-chain bytecode (gpuos.fusion, device_src/interp.h) against torch on the CPU, through the same
functors the worker uses. No GPU needed."""
import random

import pytest
import torch

import gpuos_ext
from gpuos.fusion import MAX_INSTR, Chain

from _opref import full_scalars, reference

UNARY = ["neg", "abs", "relu", "sigmoid", "tanh", "sin", "cos", "erf", "silu", "hardsigmoid", "hardswish",
         "gelu", "gelu_tanh", "leaky_relu", "hardtanh", "elu", "softplus", "clamp"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


def _run(prog, inputs, dtype=torch.float32):
    out = torch.full_like(inputs[0], float("nan"), dtype=dtype)
    gpuos_ext._testing.cpu_run_program(prog, inputs, out)
    return out


def _random_chain(rng, ninputs, nops):
    """Build the same random chain twice: as a Chain and as a torch reference (fp32, op by op)."""
    ch = Chain(ninputs)
    xs = [torch.randn(257, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
          for _ in range(ninputs)]
    vals, refs = list(ch.inputs), list(xs)
    for _ in range(nops):
        if rng.random() < 0.4:
            op = rng.choice(BINARY)
            i, j = rng.randrange(len(vals)), rng.randrange(len(vals))
            if rng.random() < 0.3:  # a Python-number operand becomes a constant register
                c = round(rng.uniform(-2, 2), 3)
                vals.append(ch.op(op, vals[i], c))
                refs.append(reference(op, [refs[i], c], full_scalars(op)))
            else:
                vals.append(ch.op(op, vals[i], vals[j]))
                refs.append(reference(op, [refs[i], refs[j]], full_scalars(op)))
        else:
            op = rng.choice(UNARY)
            i = rng.randrange(len(vals))
            vals.append(ch.op(op, vals[i]))
            refs.append(reference(op, [refs[i]], full_scalars(op)))
    return ch, vals[-1], xs, refs[-1]


@pytest.mark.parametrize("seed", range(40))
def test_random_chain_matches_torch(seed):
    rng = random.Random(seed)
    ch, out, xs, ref = _random_chain(rng, ninputs=rng.randint(1, 4), nops=rng.randint(2, 12))
    got = _run(ch.compile(out), xs)
    torch.testing.assert_close(got, ref.float(), rtol=2e-5, atol=2e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chain_half_inputs_and_output(dtype):
    ch = Chain(2)
    x, y = ch.inputs
    z = ch.op("gelu_tanh", ch.op("add", ch.op("mul", x, y), 1.5))
    a, b = torch.randn(300).to(dtype), torch.randn(300).to(dtype)
    ref = torch.nn.functional.gelu(a.float() * b.float() + 1.5, approximate="tanh").to(dtype)
    torch.testing.assert_close(_run(ch.compile(z), [a, b], dtype), ref)


def test_scalars_and_clamp_bounds():
    ch = Chain(1)
    (x,) = ch.inputs
    z = ch.op("clamp", ch.op("leaky_relu", x, negative_slope=0.2), min=-0.5, max=None)
    a = torch.randn(500) * 3
    ref = torch.clamp(torch.nn.functional.leaky_relu(a, 0.2), min=-0.5)
    torch.testing.assert_close(_run(ch.compile(z), [a]), ref)


def test_registers_are_reused_for_long_chains():
    ch = Chain(1)
    v = ch.inputs[0]
    for _ in range(MAX_INSTR):  # 24 live-once temporaries fit in 16 registers
        v = ch.op("sin", v)
    a = torch.randn(64)
    ref = a
    for _ in range(MAX_INSTR):
        ref = torch.sin(ref)
    torch.testing.assert_close(_run(ch.compile(v), [a]), ref)


def test_too_many_instructions_is_an_error():
    ch = Chain(1)
    v = ch.inputs[0]
    for _ in range(MAX_INSTR + 1):
        v = ch.op("neg", v)
    with pytest.raises(ValueError, match="instructions"):
        ch.compile(v)


def test_unused_nodes_are_not_emitted():
    ch = Chain(2)
    x, y = ch.inputs
    ch.op("exp", y)  # dead: not part of the result
    z = ch.op("mul", x, x)
    prog = ch.compile(z)
    assert int.from_bytes(prog[:4], "little") == 1


def test_builder_errors():
    ch = Chain(1)
    with pytest.raises(ValueError, match="unknown elementwise op"):
        ch.op("sum", ch.inputs[0])
    with pytest.raises(ValueError, match="takes 2 operand"):
        ch.op("add", ch.inputs[0])
    with pytest.raises(TypeError, match="scalars"):
        ch.op("relu", ch.inputs[0], alpha=2.0)
    with pytest.raises(ValueError):
        Chain(0)


def test_malformed_program_is_rejected():
    ch = Chain(1)
    prog = bytearray(ch.compile(ch.op("neg", ch.inputs[0])))
    prog[16] = 200  # op id outside the table
    with pytest.raises(ValueError, match="malformed"):
        _run(bytes(prog), [torch.randn(4)])
    with pytest.raises(ValueError, match="bytes"):
        _run(bytes(prog[:-1]), [torch.randn(4)])


def test_round_pseudo_ops_match_eager_fp16_intermediates():
    """A node's `round` dtype rounds its result as eager stores an fp16/bf16 intermediate (csrc/fusion.cpp)."""
    import gpuos_ext as ext

    ids = {row["name"]: row["id"] for row in ext.op_table()}
    x = torch.randn(1000) * 3
    y = torch.randn(1000)
    for dt, code in ((torch.float16, 1), (torch.bfloat16, 2)):
        xh, yh = x.to(dt), y.to(dt)
        exp = (xh * yh) * (xh * yh) - yh  # eager: every intermediate stored in dt
        nodes = [(ids["mul"], [0, 1], 0.0, 0.0, code), (ids["mul"], [2, 2], 0.0, 0.0, code),
                 (ids["sub"], [3, 1], 1.0, 0.0, 0)]
        prog = ext._build_program(2, nodes, 4)
        got = _run(prog, [xh, yh], dtype=dt)
        assert torch.equal(got, exp), (dt, (got.float() - exp.float()).abs().max())
        unrounded = ext._build_program(2, [n[:4] for n in nodes], 4)
        assert unrounded != prog


def test_liveness_rule_sees_dropped_tensors():
    """The scheduler elides an intermediate only when the program can no longer reach it (csrc/bindings.cpp
    dead_to_python): dropped tensors are dead; live ones, and bases of live views, are not."""
    import gpuos_ext as ext

    x = torch.empty(4)
    ext._testing.liveness_probe(x)
    y = torch.empty(4)
    ext._testing.liveness_probe(y)
    del x
    z = torch.empty(4) * 2
    ext._testing.liveness_probe(z)
    del z
    v = torch.empty(8)
    ext._testing.liveness_probe(v)
    w = v.view(2, 4)
    del v
    keep = [torch.empty(3)]
    ext._testing.liveness_probe(keep[0])
    assert ext._testing.liveness_probe(None) == [True, False, True, False, False]
    del y, w, keep


def test_tier2_specialized_program_compiles_into_a_generation(requires_nvrtc):
    """Tier 2: a fused program's straight-line code (csrc/fusion.cpp specialize_program; constants, scalars and
    fp16 rounding included) goes into a generation's user_ops.h, and the worker compiles with it for sm_90."""
    import struct

    import gpuos_ext as ext

    ids = {row["name"]: row["id"] for row in ext.op_table()}
    nodes = [(ids["add"], [0, 1], 0.5, 0.0, 1), (0xFF, [], 2.5, 0.0), (ids["mul"], [2, 3], 0.0, 0.0),
             (ids["clamp"], [4], -1.0, 1.0), (ids["sigmoid"], [5], 0.0, 0.0)]
    prog = ext._build_program(2, nodes, 6)
    hdr = ext._generation_header_for([], [(7, prog)])
    assert "X(7, ::gpuos_fused_7::F)" in hdr and "ClampF::apply" in hdr and "f32_to_f16" in hdr
    cubin = ext._jit_compile_generation("sm_90", hdr)
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == 190  # EM_CUDA


def _row_nodes():
    """Op ids and the row pseudo-op for hand-built row programs (device_src/interp.h kOpRowRed)."""
    import gpuos_ext as ext

    ids = {row["name"]: row["id"] for row in ext.op_table()}
    return ids, ext.limits()["op_row_red"]


@pytest.mark.parametrize("dt,code", [(torch.float32, 0), (torch.float16, 1), (torch.bfloat16, 2)])
def test_row_program_rmsnorm_matches_torch(dt, code):
    """A row program (a last-dim reduction inside a fused chain: the scheduler's RMSNorm row task) evaluated
    pass by pass: w * (x * rsqrt(mean(x * x) + eps)), rows of 300, fp32 math, rounded once to the dtype."""
    import gpuos_ext as ext

    ids, red = _row_nodes()
    x = (torch.randn(5, 300) * 2).to(dt)
    w = torch.randn(300).to(dt)
    eps = 1e-6
    nodes = [(ids["mul"], [0, 0], 0.0, 0.0), (red, [2], 1.0 / 300, float(ids["mean"])), (0xFF, [], eps, 0.0),
             (ids["add"], [3, 4], 1.0, 0.0), (ids["rsqrt"], [5], 0.0, 0.0), (ids["mul"], [0, 6], 0.0, 0.0),
             (ids["mul"], [1, 7], 0.0, 0.0)]
    prog = ext._build_program(2, nodes, 8)
    got = _run(prog, [x, w.expand(5, 300).contiguous()], dtype=dt)
    xf = x.float()
    exp = (w.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(dt)
    rtol, atol = {0: (1e-5, 1e-5), 1: (1e-3, 1e-3), 2: (8e-3, 8e-3)}[code]
    torch.testing.assert_close(got, exp, rtol=rtol, atol=atol)


def test_row_program_with_two_dependent_reductions():
    """LayerNorm (mean, then the mean of (x - mean)^2) and softmax (amax, then sum of exp(x - max)): the second
    reduction's pass reads the first one's row value."""
    import gpuos_ext as ext

    ids, red = _row_nodes()
    x = torch.randn(7, 129) * 3
    ln = [(red, [0], 1.0 / 129, float(ids["mean"])), (ids["sub"], [0, 1], 1.0, 0.0), (ids["mul"], [2, 2], 0.0, 0.0),
          (red, [3], 1.0 / 129, float(ids["mean"])), (0xFF, [], 1e-5, 0.0), (ids["add"], [4, 5], 1.0, 0.0),
          (ids["rsqrt"], [6], 0.0, 0.0), (ids["mul"], [2, 7], 0.0, 0.0)]
    got = _run(ext._build_program(1, ln, 8), [x])
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(x, (129,), eps=1e-5), rtol=1e-5, atol=1e-5)
    sm = [(red, [0], 1.0, float(ids["amax"])), (ids["sub"], [0, 1], 1.0, 0.0), (ids["exp"], [2], 0.0, 0.0),
          (red, [3], 1.0, float(ids["sum"])), (ids["div"], [3, 4], 0.0, 0.0)]
    got = _run(ext._build_program(1, sm, 5), [x])
    torch.testing.assert_close(got, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    mn = [(red, [0], 1.0, float(ids["amin"])), (ids["sub"], [0, 1], 1.0, 0.0)]
    got = _run(ext._build_program(1, mn, 2), [x])
    torch.testing.assert_close(got, x - x.amin(-1, keepdim=True), rtol=0, atol=0)


def test_row_program_rejects_a_reduction_it_cannot_fold():
    import gpuos_ext as ext

    ids, red = _row_nodes()
    prog = ext._build_program(1, [(red, [0], 1.0, float(ids["softmax"]))], 1)
    with pytest.raises(ValueError, match="malformed instruction 0"):
        _run(prog, [torch.randn(3, 8)])


def test_tier2_row_program_compiles_into_a_generation(requires_nvrtc):
    """A row program's straight-line code (kRows, row_info, eval with red / stop) goes into a generation and the
    worker compiles with it for sm_90 (elementwise.h fused_spec_op runs it through fused_rows)."""
    import gpuos_ext as ext

    ids, red = _row_nodes()
    nodes = [(ids["mul"], [0, 0], 0.0, 0.0), (red, [1], 1.0 / 64, float(ids["mean"])), (ids["rsqrt"], [2], 0.0, 0.0),
             (ids["mul"], [0, 3], 0.0, 0.0, 1)]
    prog = ext._build_program(1, nodes, 4)
    hdr = ext._generation_header_for([], [(9, prog)])
    assert "kRows = 1;" in hdr and f"ops[0] = {ids['mean']}u;" in hdr and "if (stop == 0u) return" in hdr
    cubin = ext._jit_compile_generation("sm_90", hdr)
    assert cubin[:4] == b"\x7fELF"

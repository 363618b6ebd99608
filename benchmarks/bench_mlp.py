#!/usr/bin/env python
"""W5 small MLP block, fp16, 1,000 forward steps (issue 6).

    python benchmarks/bench_mlp.py                    # = python -m benchmarks --only W5
    python benchmarks/bench_mlp.py --quick            # 1x256 and 8x512, 200 steps, 5 reps (mlp_quick.json)

Sizes ``BxH`` (batch x hidden): 1x256, 1x1024, 32x256, 32x1024; ffn = 4 x hidden. One step is a pre-norm
residual MLP block on x of shape (B, H), the way small policy / serving networks run per request:

    h = x * rsqrt(mean(x**2, -1) + eps) * g;  y = x + fc2(gelu_tanh(fc1(h)))      # 2 linears + 8 small ops

and a repetition is 1,000 such forward calls on the same batch (the last y is checked against eager, fp16:
rtol 1e-2, atol 1e-2). Peers: ``eager``; ``cudagraph`` (the block captured once, replayed per step);
``compile`` / ``compile_reduce_overhead`` (torch.compile of the block in a child process with a timeout;
input and weights marked static for reduce-overhead); ``gpuos_scheduler`` (the eager loop inside
``gpuos.scheduler_context()``: the linears run eagerly, norm / gelu / residual are batched).
Per config: median / min / max wall ms over >= 20 reps, host ms, GPU-stream ms (CUDA events).
Results: benchmarks/results/mlp.json (BENCH_SCHEMA.md).
"""
from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "mlp"
WORKLOAD = "W5"
TITLE = "MLP block (fp16, pre-norm, ffn 4x, 1,000 steps)"
SIZES = ["1x256", "1x1024", "32x256", "32x1024"]
QUICK_SIZES = ["1x256", "8x512"]
STEPS, QUICK_STEPS = 1000, 200
OPS_PER_STEP = 10
TOL = {"rtol": 1e-2, "atol": 1e-2}
IN_PROCESS = ["eager", "cudagraph", "gpuos_scheduler", "gpuos_program"]
NOT_APPLICABLE = {
    "foreach": "one batch through one block: no lists of independent tensors for torch._foreach_*",
    "gpuos_submit": "the explicit submit API has no matmul; gpuos_scheduler runs this loop unchanged",
}
IN_PROCESS_SHARE = 0.4  # of W5's suite budget; the compile child gets the rest


def mlp_block(x, norm_w, w1, b1, w2, b2):
    """Pre-norm residual MLP block (RMSNorm, linear, tanh-GELU, linear, residual add)."""
    import torch
    import torch.nn.functional as F
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w
    return x + F.linear(F.gelu(F.linear(h, w1, b1), approximate="tanh"), w2, b2)


def parse_size(size: str) -> tuple:
    batch, hidden = (int(v) for v in str(size).lower().split("x"))
    return batch, hidden


def suite_params(quick: bool) -> dict:
    return {"sizes": QUICK_SIZES if quick else SIZES, "steps": QUICK_STEPS if quick else STEPS,
            "ffn_mult": 4, "dtype": "float16", "tolerance": TOL}


def make_case(size: str, steps: int, device: str) -> H.Case:
    """Seeded weights and batch of one size, and the eager output of one block call."""
    import torch
    batch, hidden = parse_size(size)
    ffn = 4 * hidden
    g = torch.Generator(device="cpu").manual_seed(5000 + 31 * batch + hidden)

    def r(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g) * scale + shift).to(device=device, dtype=torch.float16)
    d = SimpleNamespace(x=r(batch, hidden), norm_w=r(hidden, scale=0.1, shift=1.0),
                        w1=r(ffn, hidden, scale=hidden ** -0.5), b1=r(ffn, scale=0.1),
                        w2=r(hidden, ffn, scale=ffn ** -0.5), b2=r(hidden, scale=0.1), steps=steps)
    return H.Case(size=size, ref=call(mlp_block, d), tol=TOL, data=d, ops_per_rep=OPS_PER_STEP * steps,
                  extra={"batch": batch, "hidden": hidden, "ffn": ffn, "steps": steps, "dtype": "float16"})


def call(block, d):
    return block(d.x, d.norm_w, d.w1, d.b1, d.w2, d.b2)


def run_steps(block, d):
    y = None
    for _ in range(d.steps):
        y = call(block, d)
    return y


# ------------------------------------------------------------------------------------------------ peers
def setup_eager(case: H.Case) -> H.Prepared:
    return H.Prepared(lambda: run_steps(mlp_block, case.data))


def setup_cudagraph(case: H.Case) -> H.Prepared:
    """The block captured once (static input and output), replayed once per step."""
    d = case.data
    g, y, capture_ms = H.capture_cuda_graph(lambda: call(mlp_block, d), lambda: call(mlp_block, d))

    def fn():
        for _ in range(d.steps):
            g.replay()
        return y
    return H.Prepared(fn, extra={"capture_ms": H.rnd(capture_ms, 3)})


def prepare_compiled(case: H.Case, compiled, mode: str, ctx: H.RunContext) -> H.Prepared:
    d = case.data
    if mode == "reduce-overhead":
        H.mark_static(d.x, d.norm_w, d.w1, d.b1, d.w2, d.b2)
    return H.Prepared(lambda: run_steps(compiled, d))


def make_setups(ctx: H.RunContext) -> dict:
    """The in-process peers: {config: setup(case) -> Prepared}."""
    return {"eager": setup_eager, "cudagraph": setup_cudagraph,
            "gpuos_scheduler": H.scheduler_setup(ctx, lambda case: run_steps(mlp_block, case.data)),
            "gpuos_program": H.program_setup(
                ctx,
                lambda case: (lambda x: mlp_block(x, *_weights(case.data))), lambda case: (case.data.x,),
                lambda case, prog: [prog(case.data.x) for _ in range(case.data.steps)][-1])}


def _weights(d):
    return d.norm_w, d.w1, d.b1, d.w2, d.b2


# ------------------------------------------------------------------------------------------------ suite
run_workload, compile_child, suite_units = H.standard_hooks(
    WORKLOAD, "bench_mlp", lambda p: p["sizes"], lambda size, p, device: make_case(size, p["steps"], device),
    make_setups, mlp_block, prepare_compiled, IN_PROCESS, IN_PROCESS_SHARE, NOT_APPLICABLE)


def main(argv: Any = None) -> int:
    from benchmarks import run_all  # this workload alone = python -m benchmarks --only <workload>
    return run_all.standalone_main(WORKLOAD, argv)


if __name__ == "__main__":
    sys.exit(main())

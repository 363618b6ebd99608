#!/usr/bin/env python
"""W6 dynamic shapes: the W2 chain with n changing every iteration among 16 sizes (issue 6).

    python benchmarks/bench_dynamic.py                # = python -m benchmarks --only W6
    python benchmarks/bench_dynamic.py --quick        # 200 iterations, 5 reps (dynamic_quick.json)

A repetition is 1,000 iterations of the W2 step ``out = sigmoid(relu((a + b) * c)) / d`` (fp32), iteration i
on the inputs of size n_i = SIZES[(7 i) mod 16], SIZES = 1024, 1280, ..., 4864: every iteration changes
the shape. What that costs each peer:

    eager                    nothing (kernels take any shape)
    cudagraph                one graph per size, captured the first time the size appears (16 captures);
                             the row has ``captures`` and ``capture_ms_total``
    compile                  torch.compile's default: a static graph, then a recompile with dynamic shapes
    compile_reduce_overhead  the same, plus one CUDA-graph recording per size; the rows count
                             ``graphs_compiled`` / ``cudagraph_recordings`` (child process, timeout)
    gpuos_scheduler          nothing (the batch takes any shape)

Each timing row also has ``cold_pass_ms``: the first pass over the 1,000 iterations, recaptures and
recompiles included; the steady reps come after. Correctness: after the cold pass, one call per size is
compared with eager (assert_close, rtol/atol 1e-5). Value rows: ``captures``, ``graphs_compiled``,
``cudagraph_recordings`` (count) and ``first_pass_extra_ms`` (cold pass minus the steady median) per
config. Results: benchmarks/results/dynamic.json (BENCH_SCHEMA.md).
"""
from __future__ import annotations

import sys
import time
from types import SimpleNamespace
from typing import Any, Callable, Optional

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H
from benchmarks.bench_scheduler import OPS_PER_ITER, W2_TOL, w2_inputs, w2_step

NAME = "dynamic"
WORKLOAD = "W6"
TITLE = "dynamic shapes (W2 chain, n changes every iteration among 16 sizes)"
SIZES = [1024 + 256 * k for k in range(16)]
ITERS, QUICK_ITERS = 1000, 200
IN_PROCESS = ["eager", "cudagraph", "gpuos_program", "gpuos_scheduler"]
NOT_APPLICABLE = {
    "foreach": "the chain's ops are single-tensor ops of one size at a time; torch._foreach_* needs lists",
    "gpuos_submit": "gpuos_scheduler runs the same Python loop unchanged (the W1 submit API is measured in W1)",
}
IN_PROCESS_SHARE = 0.3  # of W6's suite budget; the compile child gets the rest
COUNT_FIELDS = {"captures": "cudagraph", "program_captures": "gpuos_program", "graphs_compiled": None, "cudagraph_recordings": "compile_reduce_overhead"}


def size_label(sizes=SIZES) -> str:
    return f"{len(sizes)} sizes {min(sizes)}-{max(sizes)}"


def suite_params(quick: bool) -> dict:
    return {"iters": QUICK_ITERS if quick else ITERS, "sizes": SIZES, "dtype": "float32", "tolerance": W2_TOL}


def make_case(iters: int, device: str) -> H.Case:
    """Inputs of every size, the size sequence, and eager's output for each size."""
    inputs = {n: w2_inputs(n, seed=6000 + n, device=device) for n in SIZES}
    seq = [SIZES[(7 * i) % len(SIZES)] for i in range(iters)]
    d = SimpleNamespace(inputs=inputs, seq=seq)
    ref = {n: w2_step(*inputs[n]) for n in SIZES}
    return H.Case(size=size_label(), ref=ref, tol=W2_TOL, data=d, ops_per_rep=OPS_PER_ITER * iters,
                  extra={"iters": iters, "sizes": SIZES, "dtype": "float32"})


def dynamic_prepared(ctx: H.RunContext, case: H.Case, one: Callable[[int], Any], extra: Optional[dict] = None,
                     scope: Optional[Callable[[], Any]] = None) -> H.Prepared:
    """Prepared for a per-iteration callable ``one(n)``: the rep runs it over the size sequence (inside
    ``scope()`` when given, e.g. a scheduler context); the check times the cold first pass
    (``cold_pass_ms``), then compares one call per size (cloned at once) with eager. ``extra`` (kept, not
    copied: ``one`` may keep counting into it) becomes the row's extra fields."""
    d = case.data
    fields = extra if extra is not None else {}

    def loop():
        out = None
        for n in d.seq:
            out = one(n)
        return out

    def fn():
        if scope is None:
            return loop()
        with scope():
            return loop()

    def check():
        ctx.sync()
        t0 = time.perf_counter()
        fn()
        ctx.sync()
        fields["cold_pass_ms"] = H.rnd((time.perf_counter() - t0) * 1e3, 3)
        if scope is None:
            return {n: one(n).clone() for n in SIZES}
        with scope():
            return {n: one(n) for n in SIZES}
    return H.Prepared(fn, check, fields)


# ------------------------------------------------------------------------------------------------ peers
def make_setups(ctx: H.RunContext) -> dict:
    def eager(case: H.Case) -> H.Prepared:
        return dynamic_prepared(ctx, case, lambda n: w2_step(*case.data.inputs[n]))

    def cudagraph(case: H.Case) -> H.Prepared:
        graphs: dict = {}
        fields = {"captures": 0, "capture_ms_total": 0.0}

        def one(n: int):
            if n not in graphs:  # first appearance of this size: capture (counted and timed)
                args = case.data.inputs[n]
                graphs[n] = H.capture_cuda_graph(lambda: w2_step(*args), lambda: w2_step(*args))
                fields["captures"] += 1
                fields["capture_ms_total"] = H.rnd(fields["capture_ms_total"] + graphs[n][2], 3)
            g, out, _ = graphs[n]
            g.replay()
            return out
        return dynamic_prepared(ctx, case, one, fields)

    def program(case: H.Case) -> H.Prepared:
        """gpuos.wrap: a program per size, captured on the size's first appearance (in the cold pass)."""
        w = ctx.gpuos.wrap(w2_step, cache_size=len(SIZES))
        fields = {"program_captures": 0}

        def one(n: int):
            r = w(*case.data.inputs[n])
            fields["program_captures"] = w.captures
            return r
        return dynamic_prepared(ctx, case, one, fields)

    def scheduler(case: H.Case) -> H.Prepared:
        return dynamic_prepared(ctx, case, lambda n: w2_step(*case.data.inputs[n]), scope=ctx.scheduler)

    return {"eager": eager, "cudagraph": cudagraph, "gpuos_program": program, "gpuos_scheduler": scheduler}


def count_rows(rows: list) -> list:
    """Value rows for what the shape changes cost: counts (captures, graphs compiled, CUDA-graph recordings)
    and ``first_pass_extra_ms`` (cold pass minus the steady median) per config."""
    out = []
    for r in rows:
        if "median_ms" not in r or r.get("cold_pass_ms") is None:
            continue
        cfg = r["config"]
        for key, only in COUNT_FIELDS.items():
            if r.get(key) is not None and (only is None or only == cfg):
                out.append(H.value_row(WORKLOAD, key, r[key], "count", size=r["size"], for_config=cfg))
        out.append(H.value_row(WORKLOAD, "first_pass_extra_ms", max(0.0, r["cold_pass_ms"] - r["median_ms"]), "ms",
                               size=r["size"], for_config=cfg, cold_pass_ms=r["cold_pass_ms"]))
    return out


# ------------------------------------------------------------------------------------------------ suite
def prepare_compiled(case: H.Case, compiled, mode: str, ctx: H.RunContext) -> H.Prepared:
    return dynamic_prepared(ctx, case, lambda n: compiled(*case.data.inputs[n]))


run_workload, compile_child, suite_units = H.standard_hooks(
    WORKLOAD, "bench_dynamic", lambda p: [size_label(p["sizes"])], lambda _, p, device: make_case(p["iters"], device),
    make_setups, w2_step, prepare_compiled, IN_PROCESS, IN_PROCESS_SHARE, NOT_APPLICABLE, count_rows)


def main(argv: Any = None) -> int:
    from benchmarks import run_all  # this workload alone = python -m benchmarks --only <workload>
    return run_all.standalone_main(WORKLOAD, argv)


if __name__ == "__main__":
    sys.exit(main())

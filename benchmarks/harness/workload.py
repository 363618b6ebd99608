"""The usual shape of a suite workload (W2, W4, W5, W6): rows for the peers that do not apply, the in-process
peers of every size, then the torch.compile peers in a child process; and the three hooks run_all.py and
_child.py call on a workload module (run_workload, compile_child, suite_units), built from its parts.

Imports: rows, suite, child.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

from .child import COMPILE_MODES, child_rows, compile_sweep
from .rows import error_row, is_gpuos_config, not_applicable_row
from .suite import Case, Prepared, RunContext, peer_sweep


def run_standard_workload(ctx: RunContext, workload: str, module: str, sizes: Sequence[Any],
                          make_case: Callable[[Any], Case], setups: dict, params: dict,
                          save: Callable[[list], Any], in_process_share: float,
                          not_applicable: Optional[dict] = None) -> list:
    """The usual shape of a workload run: a row for each peer that does not apply, the in-process peers
    (``setups``) for every size within ``in_process_share`` of the budget, then the torch.compile peers
    in ``benchmarks.<module>``'s compile child with the rest. Returns the rows."""
    rows: list = [not_applicable_row(workload, c, why) for c, why in (not_applicable or {}).items()
                  if ctx.wants(c)]
    setups = dict(setups)
    if ctx.device != "cuda":
        for config in [c for c in setups if c == "cudagraph" or is_gpuos_config(c)]:
            setups.pop(config)
            if ctx.wants(config):
                rows.append(error_row(workload, None, config, "needs CUDA (this is a CPU debug run)"))
    whole = ctx.budget
    ctx.budget = whole.part(whole.remaining() * in_process_share)
    ctx.units_left = len(sizes) * sum(ctx.wants(c) for c in setups)
    try:
        peer_sweep(ctx, workload, sizes, make_case, setups, rows, lambda: save(rows))
    finally:
        ctx.budget = whole
    expected = [(size, c) for size in sizes for c, _ in COMPILE_MODES if ctx.wants(c)]
    if expected:
        rows += child_rows(ctx, workload, module, params, expected)
    return rows


def standard_units(n_sizes: int, configs: Iterable[str], ctx: RunContext) -> int:
    """Progress units of a standard workload: one per (size, wanted config), compile peers included."""
    return n_sizes * sum(ctx.wants(c) for c in list(configs) + [c for c, _ in COMPILE_MODES])


def standard_hooks(workload: str, module: str, sizes: Callable[[dict], Sequence[Any]],
                   make_case: Callable[[Any, dict, str], Case], make_setups: Callable[[RunContext], dict],
                   target: Callable, prepare: Callable[[Case, Callable, str, RunContext], Prepared],
                   in_process: Sequence[str], in_process_share: float, not_applicable: Optional[dict] = None,
                   extra_rows: Optional[Callable[[list], list]] = None) -> tuple:
    """The suite hooks of a workload module built from its parts: (run_workload, compile_child, suite_units).

    ``sizes(params)`` lists the sizes, ``make_case(size, params, device)`` builds one, ``make_setups(ctx)``
    gives the in-process peers (named ``in_process``), ``target`` is what torch.compile compiles and
    ``prepare(case, compiled, mode, ctx)`` how a compiled peer runs; ``extra_rows(rows)`` may derive value
    rows at the end.
    """
    def run_workload(ctx: RunContext, params: dict, save: Callable[[list], Any]) -> list:
        rows = run_standard_workload(ctx, workload, module, sizes(params),
                                     lambda size: make_case(size, params, ctx.device), make_setups(ctx), params,
                                     save, in_process_share, not_applicable)
        return rows + (extra_rows(rows) if extra_rows else [])

    def compile_child(ctx: RunContext, params: dict, emit: Callable[[dict], None]) -> None:
        compile_sweep(ctx, workload, sizes(params), lambda size: make_case(size, params, ctx.device), target,
                      lambda case, compiled, mode: prepare(case, compiled, mode, ctx), emit)

    def suite_units(params: dict, ctx: RunContext) -> int:
        return standard_units(len(sizes(params)), in_process, ctx)

    return run_workload, compile_child, suite_units

"""Bytecode for fused elementwise chains (the interpreter tier of issue #5).

A :class:`Chain` records elementwise ops of the op table over a few inputs; :meth:`Chain.compile` turns it
into the register bytecode of ``device_src/interp.h`` (``Program``), with registers reused once a value is
dead. ``gpuos_ext._testing.cpu_run_program`` evaluates a program with the same functors the worker uses.

The worker runs programs as fused sub-ops (kOpFused); the scheduler builds them at flush time from chains of
recorded ops (csrc/sched/lower.cpp). This class is the explicit way to build one, used by the tests.

    ch = Chain(ninputs=2)
    x, y = ch.inputs
    z = ch.op("sigmoid", ch.op("mul", ch.op("add", x, y), 0.5))
    prog = ch.compile(z)
"""
from __future__ import annotations

from dataclasses import dataclass

import gpuos_ext as _ext

_LIMITS = _ext.limits()  # device_src/interp.h, read from the extension
MAX_REGS = _LIMITS["prog_max_regs"]
MAX_INSTR = _LIMITS["prog_max_instr"]
MAX_INPUTS = _LIMITS["prog_max_inputs"]
OP_CONST = _LIMITS["op_const"]
PROGRAM_BYTES = _LIMITS["program_bytes"]


@dataclass(frozen=True)
class Value:
    """A value of a chain: an input (index < ninputs) or the result of node `index - ninputs`."""
    index: int


def _table() -> dict:
    return {row["name"]: row for row in _ext.op_table() if row["kind"] == "ew"}


class Chain:
    """An elementwise expression DAG over `ninputs` inputs, compiled to interpreter bytecode."""

    def __init__(self, ninputs: int) -> None:
        if not 1 <= ninputs <= MAX_INPUTS:
            raise ValueError(f"gpuos.fusion.Chain: ninputs must be in 1..{MAX_INPUTS}, got {ninputs}")
        self.ninputs = ninputs
        self.inputs = [Value(i) for i in range(ninputs)]
        self._nodes: list[tuple] = []  # (op_id or OP_CONST, [Value], s0, s1)
        self._ops = _table()

    def const(self, v: float) -> Value:
        self._nodes.append((OP_CONST, [], float(v), 0.0))
        return Value(self.ninputs + len(self._nodes) - 1)

    def op(self, name: str, *args, **scalars) -> Value:
        """Append `name(*args; **scalars)`; args are Values or Python numbers (become constants)."""
        row = self._ops.get(name)
        if row is None:
            raise ValueError(f"gpuos.fusion: unknown elementwise op {name!r}; supported: {sorted(self._ops)}")
        if len(args) != row["arity"]:
            raise ValueError(f"gpuos.fusion: {name} takes {row['arity']} operand(s), got {len(args)}")
        vals = [a if isinstance(a, Value) else self.const(a) for a in args]
        for v in vals:
            if v.index >= self.ninputs + len(self._nodes):
                raise ValueError("gpuos.fusion: operand refers to a value of another chain")
        sc = list(row["defaults"]) + [0.0, 0.0]
        for key, val in scalars.items():
            if key not in row["scalars"]:
                raise TypeError(f"gpuos.fusion: {name} takes scalars {row['scalars']}, got {key!r}")
            if val is None:  # clamp's open bounds
                val = float("-inf") if row["scalars"].index(key) == 0 else float("inf")
            sc[row["scalars"].index(key)] = float(val)
        self._nodes.append((row["id"], vals, sc[0], sc[1]))
        return Value(self.ninputs + len(self._nodes) - 1)

    def compile(self, out: Value) -> bytes:
        """Bytecode for computing `out` (only the nodes it depends on), registers reused after last use.

        The builder is the C++ one the scheduler's flush-time fusion uses (csrc/fusion.cpp)."""
        nodes = [(op, [v.index for v in vals], s0, s1) for op, vals, s0, s1 in self._nodes]
        return _ext._build_program(self.ninputs, nodes, out.index)


__all__ = ["Chain", "Value", "MAX_INPUTS", "MAX_INSTR", "MAX_REGS"]

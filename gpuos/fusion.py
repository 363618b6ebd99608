"""Bytecode for fused elementwise chains (the interpreter tier of issue #5).

A :class:`Chain` records elementwise ops of the op table over a few inputs; :meth:`Chain.compile` turns it
into the register bytecode of ``device_src/interp.h`` (``Program``), with registers reused once a value is
dead. ``gpuos_ext._cpu_run_program`` evaluates a program with the same functors the worker uses.

Status: the interpreter and this generator are tested on the CPU against torch; running programs in the GPU
worker (a fused sub-op kind) is the next step of issue #5.

    ch = Chain(ninputs=2)
    x, y = ch.inputs
    z = ch.op("sigmoid", ch.op("mul", ch.op("add", x, y), 0.5))
    prog = ch.compile(z)
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import gpuos_ext as _ext

MAX_REGS = 16
MAX_INSTR = 24
MAX_INPUTS = 8
OP_CONST = 0xFF
_INSTR = struct.Struct("<BB3BB2xff")  # op, dst, src[3], nsrc, pad, s0, s1  (device_src/interp.h Instr)
_HEADER = struct.Struct("<IIII")      # ninstr, ninputs, out_reg, reserved
PROGRAM_BYTES = _HEADER.size + MAX_INSTR * _INSTR.size


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
        """Bytecode for computing `out` (only the nodes it depends on), registers reused after last use."""
        n_in = self.ninputs
        needed = set()
        stack = [out.index]
        while stack:  # nodes `out` depends on
            i = stack.pop()
            if i >= n_in and i not in needed:
                needed.add(i)
                stack.extend(v.index for v in self._nodes[i - n_in][1])
        order = sorted(needed)
        last_use = {}
        for pos, i in enumerate(order):
            for v in self._nodes[i - n_in][1]:
                last_use[v.index] = pos
        last_use[out.index] = len(order)
        reg = {i: i for i in range(n_in)}
        free = [r for r in range(MAX_REGS - 1, n_in - 1, -1)]
        code = []
        for pos, i in enumerate(order):
            op, vals, s0, s1 = self._nodes[i - n_in]
            srcs = [reg[v.index] for v in vals]
            for v in vals:  # operands dead after this instruction give their register back
                if last_use.get(v.index) == pos and v.index >= n_in and reg[v.index] not in free:
                    free.append(reg[v.index])
            if not free:
                raise ValueError(f"gpuos.fusion: chain needs more than {MAX_REGS} live registers")
            dst = free.pop()
            reg[i] = dst
            code.append((op, dst, srcs, s0, s1))
        if len(code) > MAX_INSTR:
            raise ValueError(f"gpuos.fusion: chain has {len(code)} instructions; at most {MAX_INSTR} fit")
        blob = bytearray(_HEADER.pack(len(code), n_in, reg[out.index], 0))
        for op, dst, srcs, s0, s1 in code:
            s = (srcs + [0, 0, 0])[:3]
            blob += _INSTR.pack(op, dst, s[0], s[1], s[2], len(srcs), s0, s1)
        blob += bytes(PROGRAM_BYTES - len(blob))
        return bytes(blob)


__all__ = ["Chain", "Value", "MAX_INPUTS", "MAX_INSTR", "MAX_REGS"]

// device_src/interp.h -- no host-only code, no system #includes.
// Register bytecode for fused elementwise chains (issue #5's interpreter tier): a never-seen chain runs at once
// through run_program(), with no NVRTC on the critical path. Plain C++: g++ runs it in the CPU tests
// (gpuos_ext._cpu_run_program) against torch, through the same functors the worker uses.
#pragma once
#include "device_src/config.h"
#include "device_src/functors.h"
#include "device_src/numeric.h"

namespace gpuos {

constexpr u32 kProgMaxRegs = 16;
constexpr u32 kProgMaxInstr = 24;
constexpr u32 kProgMaxInputs = 8;
constexpr u32 kOpConst = 0xffu;      // pseudo-op: r[dst] = s0 (scalar operands of a chain)
constexpr u32 kOpRoundF16 = 0xfeu;   // pseudo-op: r[dst] = fp16-rounded r[src0] (eager stores fp16 intermediates)
constexpr u32 kOpRoundBF16 = 0xfdu;  // pseudo-op: r[dst] = bf16-rounded r[src0]
// Pseudo-op of row programs: r[dst] = s0 * (reduction of r[src0] over the row, the output's last dim); s1 holds
// the reduction's op id (sum / mean: +, amax: max, amin: min). See run_program.
constexpr u32 kOpRowRed = 0xfcu;
constexpr u32 kRowMaxRed = 4;  // row reductions one program may hold
// Programs the device program table holds (ids 0 .. kMaxPrograms-1; a new program is uploaded once).
constexpr u32 kMaxPrograms = 1024;

// One instruction: r[dst] = op(r[src0], r[src1], r[src2]; s0, s1). 16 bytes.
struct Instr {
  u8 op;
  u8 dst;
  u8 src[3];
  u8 nsrc;
  u8 reserved[2];
  float s0, s1;
};

// Registers 0 .. ninputs-1 start as the inputs; the result is r[out_reg].
struct Program {
  u32 ninstr;
  u32 ninputs;
  u32 out_reg;
  u32 reserved;
  Instr code[kProgMaxInstr];
};

static_assert(sizeof(Instr) == 16, "Instr layout");
static_assert(sizeof(Program) == 16 + 16 * kProgMaxInstr, "Program layout");

// Elementwise functors apply; reduction rules and the matmul have no per-element form (never in a program).
template <class F, u32 Kind>
struct EwCall {
  static GPUOS_HD float call(float, float, float, float, float) { return m_nan(); }
};
template <class F>
struct EwCall<F, kKindEw> {
  static GPUOS_HD float call(float a, float b, float c, float s0, float s1) { return F::apply(a, b, c, s0, s1); }
};

// The elementwise op `op` of the table, chosen at run time (the interpreter's dispatch).
GPUOS_HD float apply_ew(u32 op, float a, float b, float c, float s0, float s1) {
  switch (op) {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  case id:                                                              \
    return EwCall<functor, kind>::call(a, b, c, s0, s1);
#include "device_src/ops.def"
#undef GPUOS_OP
    default: break;
  }
  return m_nan();  // the host validates programs; an unknown op id is never published
}

// Registers 0 .. ninputs-1 start as `in`. A row program (one with kOpRowRed instructions: a fused RMSNorm or
// LayerNorm, issue #16's row tasks) is run once per reduction and once more for its output: pass `stop` = q
// returns the value the q-th kOpRowRed reduces (at this element; the caller folds it over the row), the
// reductions before it read red[0 .. q-1]; stop = ~0u runs the whole program with every red[] known.
GPUOS_HD float run_program(const Program& p, const float* in, const float* red = nullptr, u32 stop = ~0u) {
  float r[kProgMaxRegs];
  for (u32 k = 0; k < p.ninputs && k < kProgMaxRegs; ++k) r[k] = in[k];
  u32 q = 0;
  for (u32 i = 0; i < p.ninstr && i < kProgMaxInstr; ++i) {
    const Instr& I = p.code[i];
    if (I.op == kOpConst) {
      r[I.dst] = I.s0;
      continue;
    }
    if (I.op == kOpRoundF16) {
      r[I.dst] = f16_to_f32(f32_to_f16(r[I.src[0]]));
      continue;
    }
    if (I.op == kOpRoundBF16) {
      r[I.dst] = bf16_to_f32(f32_to_bf16(r[I.src[0]]));
      continue;
    }
    if (I.op == kOpRowRed) {
      if (q == stop) return r[I.src[0]];
      r[I.dst] = (red && q < kRowMaxRed) ? red[q] : m_nan();
      ++q;
      continue;
    }
    const float a = r[I.src[0]];
    const float b = I.nsrc > 1 ? r[I.src[1]] : 0.0f;
    const float c = I.nsrc > 2 ? r[I.src[2]] : 0.0f;
    r[I.dst] = apply_ew(I.op, a, b, c, I.s0, I.s1);
  }
  return r[p.out_reg];
}

// A row program's reductions in pass order: their op ids and scales; returns how many (0: an elementwise chain).
GPUOS_HD u32 row_reductions(const Program& p, u32* ops, float* scales) {
  u32 n = 0;
  for (u32 i = 0; i < p.ninstr && i < kProgMaxInstr; ++i)
    if (p.code[i].op == kOpRowRed && n < kRowMaxRed) {
      ops[n] = (u32)p.code[i].s1;
      scales[n++] = p.code[i].s0;
    }
  return n;
}

// Identity and combine of a row reduction (op ids of device_src/ops.def: amax, amin; anything else sums).
GPUOS_HD float row_init(u32 op) { return op == kOp_amax ? -m_inf() : op == kOp_amin ? m_inf() : 0.0f; }
GPUOS_HD float row_combine(u32 op, float a, float b) {
  return op == kOp_amax ? max_nan(a, b) : op == kOp_amin ? min_nan(a, b) : a + b;
}

}  // namespace gpuos

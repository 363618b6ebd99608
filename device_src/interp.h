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

GPUOS_HD float run_program(const Program& p, const float* in) {
  float r[kProgMaxRegs];
  for (u32 k = 0; k < p.ninputs && k < kProgMaxRegs; ++k) r[k] = in[k];
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
    const float a = r[I.src[0]];
    const float b = I.nsrc > 1 ? r[I.src[1]] : 0.0f;
    const float c = I.nsrc > 2 ? r[I.src[2]] : 0.0f;
    r[I.dst] = apply_ew(I.op, a, b, c, I.s0, I.s1);
  }
  return r[p.out_reg];
}

}  // namespace gpuos

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
// the reduction's op id (sum / mean: +, amax: max, amin: min). See run_program_v.
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

// The interpreter. Registers are rows of V values (V elements at once): each instruction is dispatched once
// for V values whose loads and register traffic are independent. One element per call (the interpreter before
// b5eaf90) ran a 256-element RMSNorm row program in 46 us, four per call in 25 us (H200, program_probe norm).
// r[k][v] holds input k of element v on entry; out[v] gets the result for element v.
// A row program (kOpRowRed instructions: a fused RMSNorm or LayerNorm, issue #16's row tasks) runs once per
// reduction and once more for its output: pass `stop` = q returns in out[] the values the q-th kOpRowRed
// reduces (the caller folds them over the row), the reductions before it read red[0 .. q-1]; stop = ~0u runs
// the whole program with every red[] known. Ops of other kinds than elementwise give NaN (never published:
// the host validates programs).
template <u32 V>
GPUOS_HD void run_program_v(const Program& p, float (*r)[V], float* out, const float* red = nullptr, u32 stop = ~0u) {
  u32 q = 0;
  for (u32 i = 0; i < p.ninstr && i < kProgMaxInstr; ++i) {
    const Instr& I = p.code[i];
    float a[V], b[V], c[V];
    GPUOS_UNROLL
    for (u32 v = 0; v < V; ++v) a[v] = r[I.src[0] % kProgMaxRegs][v], b[v] = r[I.src[1] % kProgMaxRegs][v], c[v] = r[I.src[2] % kProgMaxRegs][v];
    switch (I.op) {
      case kOpConst:
        GPUOS_UNROLL
        for (u32 v = 0; v < V; ++v) a[v] = I.s0;
        break;
      case kOpRoundF16:
        GPUOS_UNROLL
        for (u32 v = 0; v < V; ++v) a[v] = f16_to_f32(f32_to_f16(a[v]));
        break;
      case kOpRoundBF16:
        GPUOS_UNROLL
        for (u32 v = 0; v < V; ++v) a[v] = bf16_to_f32(f32_to_bf16(a[v]));
        break;
      case kOpRowRed:
        if (q == stop) {
          GPUOS_UNROLL
          for (u32 v = 0; v < V; ++v) out[v] = a[v];
          return;
        }
        GPUOS_UNROLL
        for (u32 v = 0; v < V; ++v) a[v] = (red && q < kRowMaxRed) ? red[q] : m_nan();
        ++q;
        break;
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten)                    \
      case id:                                                                                \
        GPUOS_UNROLL                                                                          \
        for (u32 v = 0; v < V; ++v) a[v] = EwCall<functor, kind>::call(a[v], b[v], c[v], I.s0, I.s1); \
        break;
#include "device_src/ops.def"
#undef GPUOS_OP
      default:
        GPUOS_UNROLL
        for (u32 v = 0; v < V; ++v) a[v] = m_nan();
        break;
    }
    GPUOS_UNROLL
    for (u32 v = 0; v < V; ++v) r[I.dst % kProgMaxRegs][v] = a[v];
  }
  GPUOS_UNROLL
  for (u32 v = 0; v < V; ++v) out[v] = r[p.out_reg % kProgMaxRegs][v];
}

// One element: registers 0 .. ninputs-1 start as `in`; returns the program's result (an elementwise chain).
GPUOS_HD float run_program(const Program& p, const float* in) {
  float r[kProgMaxRegs][1] = {};
  for (u32 k = 0; k < p.ninputs && k < kProgMaxRegs; ++k) r[k][0] = in[k];
  float out[1];
  run_program_v<1>(p, r, out);
  return out[0];
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
